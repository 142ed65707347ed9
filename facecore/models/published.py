"""Published weights that come from a package registry, never from the repository or a model hub.

The dlib ResNet's weights are taken from the npm package `@vladmandic/face-api` (MIT; the dlib
model itself is CC0): `model/face_recognition_model.bin` holds 117 tensors in the order of
`face_recognition_model-weights_manifest.json`: 109 stored as uint8 with a per-tensor `min` and
`scale` (value = q * scale + min), and the 8 filters of the 64-channel stage as little-endian float32.
The same package's TinyFaceDetector (MIT, uint8 the same way) finds the default
face detector's boxes, built as ONNX by `export.tinyface_onnx`.

`fetch` runs the ordinary client (`npm pack`), checks the tarball's sha256, and unpacks only the
files used into `FEDFACE_PACKAGES` (default `FEDFACE_CACHE/packages/`), atomically. Loading checks each file's sha256 again,
so a truncated or edited file is one clear error, not a model that silently scores wrongly.

Invariant: importing this module loads neither numpy nor torch (`fedface models list` checks the cached files
with it); the functions that build tensors import them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from facecore.digest import file_sha256
from facecore.errors import FaceCoreError
from facecore.paths import packages_root

if TYPE_CHECKING:
    import numpy as np
    import torch


class WeightsMissing(FaceCoreError):
    """A registry package that holds model weights is not in the cache yet."""


class WeightsCorrupt(FaceCoreError):
    """A cached weights file whose content is not what the package published."""


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    tarball_sha256: str
    files: tuple[tuple[str, str], ...]  # (path inside the package, sha256)

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def folder(self) -> Path:
        return packages_root() / f"{self.name.strip('@').replace('/', '+')}-{self.version}"


FACE_API = NpmPackage(
    name="@vladmandic/face-api",
    version="1.7.15",
    tarball_sha256="0d77fffeef362ef9c0939cf6c567f3a2e8e177f114fa257a3270cbd2e509b031",
    files=(
        ("model/face_recognition_model.bin", "b413e420d6840b2775fba32008db6f3cddb07d485967fb42cfcf379c16a8c589"),
        ("model/face_recognition_model-weights_manifest.json", "cbaffa501b0b9275a12b63357a6843e7e30c054e1c9151e1a5f879b26e32986b"),
        # The face detector (TinyFaceDetector) that `fedface models fetch` builds as ONNX.
        ("model/tiny_face_detector_model.bin", "b7503ce7df31039b1c43316a9b865cab6a70dd748cc602d3fa28b551503c3871"),
        ("model/tiny_face_detector_model-weights_manifest.json", "5d1af4849ac48d5b985f4a9b16010c512353ddd6fcc63d50fd0bc9e9e64296e5"),
        ("LICENSE", "9a3442b79acaf4fbc7c2e07b7e2d8f84af9bb3871bf08a69d80304ab00640e9a"),
        # The package's own browser bundle (tf.js with its pure-JS CPU backend): the parity test runs it under node.
        ("dist/face-api.esm.js", "14f0e9813f6d9f14a9cdafb6543a74835ebb13085090e2942310a7a737f55d9a"),
    ),
)
FETCH_HINT = "fedface models fetch"


def installed_files(package: NpmPackage = FACE_API) -> dict[str, Path]:
    """The package's files in the cache, each checked against its published sha256."""
    found: dict[str, Path] = {}
    for relative, expected in package.files:
        path = package.folder / relative
        if not path.is_file():
            raise WeightsMissing(f"{package.spec} is not installed ({path} missing): run `{FETCH_HINT}` (or `make venv`)")
        if file_sha256(path) != expected:
            raise WeightsCorrupt(f"{path} does not match {package.spec}'s published sha256: run `{FETCH_HINT} --force`")
        found[relative] = path
    return found


def fetch(package: NpmPackage = FACE_API, force: bool = False, tarball: Path | None = None) -> Path:
    """Download the package with npm (or take `tarball`, e.g. from a container's build stage),
    verify it, and unpack the files used. Idempotent."""
    if not force:
        try:
            installed_files(package)
            return package.folder
        except (WeightsMissing, WeightsCorrupt):
            pass
    package.folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=package.folder.parent) as scratch:
        archive_path = Path(tarball) if tarball is not None else _npm_pack(package, Path(scratch))
        if not archive_path.is_file():
            raise WeightsMissing(f"{archive_path} does not exist")
        if file_sha256(archive_path) != package.tarball_sha256:
            raise WeightsCorrupt(f"{archive_path.name} is not the {package.spec} tarball (its sha256 differs from the recorded one)")
        staging = Path(scratch) / "unpacked"
        with tarfile.open(archive_path, "r:gz") as archive:
            for relative, _ in package.files:
                source = archive.extractfile(archive.getmember(f"package/{relative}"))
                assert source is not None
                target = staging / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read())
        if package.folder.exists():
            shutil.rmtree(package.folder)
        os.replace(staging, package.folder)
    installed_files(package)
    return package.folder


def _npm_pack(package: NpmPackage, scratch: Path) -> Path:
    if shutil.which("npm") is None:
        raise WeightsMissing(f"npm is needed to fetch {package.spec}: install Node.js and npm (Debian: apt-get install npm)")
    result = subprocess.run(
        ["npm", "pack", package.spec, "--pack-destination", str(scratch), "--json"],
        capture_output=True, text=True, check=False, timeout=600,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise WeightsMissing(f"`npm pack {package.spec}` failed: {last}")
    tarballs = list(scratch.glob("*.tgz"))
    if len(tarballs) != 1:
        raise WeightsMissing(f"`npm pack {package.spec}` wrote {len(tarballs)} tarballs, expected 1")
    return tarballs[0]


def read_face_api_tensors(model: str = "face_recognition_model", package: NpmPackage = FACE_API) -> dict[str, np.ndarray]:
    """The dequantized float32 tensors of one of the package's models, by manifest name, TF layouts."""
    import numpy as np

    files = installed_files(package)
    manifest = json.loads(files[f"model/{model}-weights_manifest.json"].read_text())
    blob = np.frombuffer(files[f"model/{model}.bin"].read_bytes(), dtype=np.uint8)
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for group in manifest:
        for spec in group["weights"]:
            count = int(np.prod(spec["shape"])) if spec["shape"] else 1
            quant = spec.get("quantization")
            if spec["dtype"] != "float32" or (quant is not None and quant["dtype"] != "uint8"):
                raise WeightsCorrupt(f"{spec['name']}: unsupported storage {spec['dtype']}/{quant}")
            width = 1 if quant else 4
            raw = blob[offset : offset + count * width]
            if raw.size != count * width:
                raise WeightsCorrupt(f"the weights file ends inside {spec['name']}")
            offset += count * width
            if quant:
                values = raw.astype(np.float32) * np.float32(quant["scale"]) + np.float32(quant["min"])
            else:
                values = raw.view("<f4").astype(np.float32)
            tensors[spec["name"]] = values.reshape(spec["shape"])
    if offset != blob.size:
        raise WeightsCorrupt(f"the weights file holds {blob.size} bytes, the manifest describes {offset}")
    return tensors


def dlib_state_dict(tensors: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Map the TF.js tensors onto `DlibResNet`'s state dict, folding each conv's bias and affine."""
    import torch

    from facecore.models.dlib_resnet import BLOCKS

    def folded(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        filters = torch.from_numpy(tensors[f"{prefix}/conv/filters"]).permute(3, 2, 0, 1)  # HWIO -> OIHW
        bias = torch.from_numpy(tensors[f"{prefix}/conv/bias"])
        gain, shift = torch.from_numpy(tensors[f"{prefix}/scale/weights"]), torch.from_numpy(tensors[f"{prefix}/scale/biases"])
        return (filters * gain.view(-1, 1, 1, 1)).contiguous(), bias * gain + shift

    state: dict[str, torch.Tensor] = {}
    state["stem.conv.weight"], state["stem.conv.bias"] = folded("conv32_down")
    for index, (name, *_rest) in enumerate(BLOCKS):
        for conv in ("conv1", "conv2"):
            state[f"blocks.{index}.{conv}.weight"], state[f"blocks.{index}.{conv}.bias"] = folded(f"{name}/{conv}")
    state["head.fc.weight"] = torch.from_numpy(tensors["fc"]).t().contiguous()
    return state


def load_dlib_resnet() -> torch.nn.Module:
    """The dlib ResNet with the published weights, in eval mode (`load_backbone` adds its threshold)."""
    from facecore.models.registry import get_backbone

    model = get_backbone("dlib-resnet")
    model.load_state_dict(dlib_state_dict(read_face_api_tensors()))
    source = f"npm {FACE_API.spec} model/face_recognition_model.bin (dlib ResNet v1, CC0 weights)"
    model.meta = {"source": source}  # type: ignore[assignment]  # Module types unknown attributes as Tensor | Module; meta is a dict
    return model.eval()
