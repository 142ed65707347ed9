"""What the device accepts from a server: every description, name and file the server sends is bounded
before the device keeps or reads it (device_sdk/README.md, "What the device refuses").

Invariants:
- A model version is exactly 64 lowercase hex digits and a device id exactly 32, so a name the server
  chose can enter a path safely.
- A model description's `embedding_dim`, `verify_threshold` and `face_geometry` (`check_model_description`),
  a model file's size (MAX_MODEL_BYTES) and a backbone file's archive (`check_torch_archive`) lie within the
  limits below; a refusal is one BadServerResponse line naming the field and the limit.
- Importing this module does not import numpy (only checking a face geometry does).
"""
from __future__ import annotations

import io
import re
import struct
import zipfile
from typing import Any

from device_sdk.errors import BadServerResponse

VERSION = re.compile(r"[0-9a-f]{64}")
DEVICE_ID = re.compile(r"[0-9a-f]{32}")

# `/v1/models/current` is a few KiB (a 4096-value feature centre included, ~100 KiB): a body over this is not one.
MAX_DESCRIPTION_BYTES = 2**20
# The largest model file (backbone .pt or ONNX) a device downloads or caches. The bundled dlib ResNet's files are
# 11 (fp16) to 22 MiB (fp32, ONNX); the largest registered backbone, iresnet34, is 130 MiB in fp32 (a test checks
# that every registered backbone fits). 256 MiB admits all of them with room, and bounds what an endless or
# oversized download can make a phone hold.
MAX_MODEL_BYTES = 256 * 2**20
# A model's embedding size: the repository trains 16 (a test backbone) to 512; 4096 is the server's own bound on a
# model's vectors (a feature centre's length). Outside it, a model is refused before anything is built for it.
MIN_EMBEDDING_DIM = 16
MAX_EMBEDDING_DIM = 4096
# A backbone file (a torch zip archive) holds one entry per tensor plus 6 of torch's own; the registered backbones
# have at most 333 tensors and a 40 KiB pickle. These bound what unpickling it may build before its tensors are
# compared with the backbone's registry entry (device_sdk.backbone_check.check_backbone_payload).
MAX_BACKBONE_TENSORS = 1024
MAX_BACKBONE_PICKLE_BYTES = 2**20


def check_version(version: object) -> str:
    """A model version from the server, refused unless it is exactly 64 lowercase hex digits."""
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        raise BadServerResponse(f"the server sent a model version that is not 64 lowercase hex digits: "
                                f"{str(version)[:80]!r}; refusing to use it (is --server the FedFace round server?)")
    return version


def check_device_id(device_id: object) -> str:
    if not isinstance(device_id, str) or not DEVICE_ID.fullmatch(device_id):
        raise BadServerResponse(f"the server sent a device id that is not 32 lowercase hex digits: "
                                f"{str(device_id)[:80]!r}")
    return device_id


def _refused(what: str, why: str) -> BadServerResponse:
    return BadServerResponse(f"the server's {what} is refused: {why}")


def check_embedding_dim(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_EMBEDDING_DIM <= value <= MAX_EMBEDDING_DIM:
        raise _refused(what, f"embedding_dim {repr(value)[:40]} is not an integer in {MIN_EMBEDDING_DIM}..{MAX_EMBEDDING_DIM}")
    return value


def check_model_description(model: object) -> dict[str, Any]:
    """A `/v1/models/current` body, refused unless its version, `embedding_dim`, `verify_threshold` and
    `face_geometry` (each when present) lie in sane ranges (facecore.align.geometry.FaceGeometry.from_json)."""
    if not isinstance(model, dict):
        raise BadServerResponse(f"the server's model description is not a JSON object: {str(model)[:80]!r}")
    version = check_version(model.get("version"))
    what = f"model {version[:12]}"
    if "embedding_dim" in model:
        check_embedding_dim(model["embedding_dim"], what)
    threshold = model.get("verify_threshold")
    if threshold is not None and not (isinstance(threshold, int | float) and not isinstance(threshold, bool) and -1.0 <= threshold <= 1.0):
        raise _refused(what, f"verify_threshold {str(threshold)[:40]!r} is not a number in [-1, 1]")
    if "face_geometry" in model:
        from facecore.align.geometry import FaceGeometry  # numpy: see the module's docstring

        try:
            FaceGeometry.from_json(model["face_geometry"])
        except ValueError as error:
            raise _refused(what, f"face_geometry {error}") from None
    return model


def check_model_size(size: int, what: str) -> None:
    if size > MAX_MODEL_BYTES:
        raise _refused(what, f"{size} bytes is over MAX_MODEL_BYTES ({MAX_MODEL_BYTES} bytes, {MAX_MODEL_BYTES >> 20} MiB)")


def _zip_directory(data: bytes) -> tuple[int, int]:
    """(entries, central directory bytes) a zip archive's end record declares, read without parsing the
    directory (which a hostile archive could make millions of entries long); the zip64 record when there is one."""
    end = data.rfind(b"PK\x05\x06", max(0, len(data) - 22 - 65535))
    if end < 0 or len(data) < end + 22:
        raise ValueError("it is not a zip archive (a torch file)")
    _, _, _, _, entries, directory, _, _ = struct.unpack("<4s4H2LH", data[end:end + 22])
    locator = end - 20
    if locator >= 0 and data[locator:locator + 4] == b"PK\x06\x07":
        offset = struct.unpack("<Q", data[locator + 8:locator + 16])[0]
        record = data[offset:offset + 56]
        if len(record) != 56 or record[:4] != b"PK\x06\x06":
            raise ValueError("its zip64 end record is missing")
        entries, directory = struct.unpack("<QQ", record[32:48])
    return entries, directory


def check_torch_archive(data: bytes, what: str) -> None:
    """A backbone file's archive, refused unless its entry count, unpacked size and pickle stay within
    MAX_BACKBONE_TENSORS, MAX_MODEL_BYTES and MAX_BACKBONE_PICKLE_BYTES: checked before torch reads it."""
    try:
        entries, directory = _zip_directory(data)
        limit = MAX_BACKBONE_TENSORS + 16  # torch's own entries
        if entries > limit or directory > 1024 * limit:
            raise ValueError(f"its archive declares {entries} entries ({directory} directory bytes), over "
                             f"MAX_BACKBONE_TENSORS ({MAX_BACKBONE_TENSORS}) tensors")
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except (ValueError, struct.error, zipfile.BadZipFile) as error:
        raise _refused(what, str(error) if isinstance(error, ValueError) else f"it is not a readable zip archive ({error})"
                       ) from None
    if len(infos) > limit:
        raise _refused(what, f"its archive holds {len(infos)} entries, over MAX_BACKBONE_TENSORS ({MAX_BACKBONE_TENSORS}) tensors")
    check_model_size(sum(info.file_size for info in infos), f"{what} (unpacked)")
    for info in infos:
        if info.filename.endswith(".pkl") and info.file_size > MAX_BACKBONE_PICKLE_BYTES:
            raise _refused(what, f"its pickle {info.filename[-40:]!r} is {info.file_size} bytes, over "
                                 f"MAX_BACKBONE_PICKLE_BYTES ({MAX_BACKBONE_PICKLE_BYTES} bytes)")
