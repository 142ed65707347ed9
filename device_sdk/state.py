"""The device's local state under `state_dir`: identity key, template, cached models, aligned faces.

Invariants:
- Only registration makes the folder and its key (`save_registration`, after the server accepted the
  device; `check_creatable` first refuses, without writing, what it would refuse). A registration that
  fails writes nothing, or removes exactly the files it wrote: never another process's or a registered
  device's. Every other entry point reads; a folder that is not a registered device, or whose key no
  longer opens its files, is refused with one line that names the file and the fix (`StateError`,
  `NotRegistered`).
- One train at a time per folder (`train_lock`): an exclusive, non-blocking flock on `train.lock`, which
  holds the holder's pid for the refusal to name. The kernel drops the lock when its holder dies, however
  it dies, so a stale file never blocks.
- The private key, the template, the owner's aligned faces, the personal verifier and an update
  waiting to be sent are sealed with AES-256-GCM (the file's name is the associated data). The key
  comes from `FEDFACE_DEVICE_KEY` (base64 of 32 bytes; on a phone, the OS keystore) or from
  `device.key`, created once with O_CREAT|O_EXCL and mode 0600, and always exactly 32 bytes.
- A name the server chose (a model version) enters a path only as 64 lowercase hex digits with a
  known suffix, and every such path is checked to resolve inside the state folder.
- A cached model is used only while its sha256 matches the one recorded when it was downloaded
  (which the server's `X-Content-SHA256` or the version hash itself vouched for).
- Every file is written to a temporary name and renamed: a crash never leaves a half-written file.
- Importing this module does not import numpy (only reading or writing the template or the faces does):
  `fedface device status` reads nothing but metadata and the identity, and need not pay numpy's ~0.1 s.
- What the server describes or sends is bounded before it is kept (device_sdk/server_limits.py).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from device_sdk.errors import BadServerResponse, NotRegistered, StateError, TrainingInProgress
from device_sdk.server_limits import check_device_id, check_model_description, check_model_size, check_torch_archive, check_version
from facecore.digest import file_sha256

if TYPE_CHECKING:
    import numpy as np

KEY_ENV = "FEDFACE_DEVICE_KEY"
KEY_BYTES = 32
MODEL_KINDS = ("onnx", "fp16.pt", "fp32.pt", "int8.pt")
SEALED = ("identity", "template", "faces", "personal", "pending_upload", "upload_residual")
# Everything `delete()` may remove: the folder may be one the user also keeps other files in.
STATE_FILES = ("device.key", "device.json", "pending_upload.json", "pending_upload.bin", "train.lock",
               *(f"{n}.enc" for n in SEALED))



def write_atomic(path: Path, data: bytes, mode: int = 0o600, replace: bool = True) -> None:
    """Write `data` to `path` whole or not at all (a temporary file, fsynced, then renamed over it). With
    `replace` False a file already at `path` (another process got there first) is a FileExistsError, and
    `path` is left as it was."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        if replace:
            os.replace(temp, path)
        else:
            os.link(temp, path)  # unlike rename, link refuses an existing name
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def write_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    """`write_atomic` that never replaces an existing file."""
    write_atomic(path, data, mode, replace=False)


class DeviceState:
    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir).expanduser()
        if self.dir.exists() and not self.dir.is_dir():
            raise StateError(f"{self.dir} is a file, not a device state folder: pass --state a folder")
        self._aead: AESGCM | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    def reset_hint(self) -> str:
        return f"`fedface device reset --state {self.dir} --yes`"

    def present(self) -> list[Path]:
        """The state files that exist (an empty list: no device state here)."""
        if not self.dir.is_dir():
            return []
        found = [self.dir / name for name in STATE_FILES if (self.dir / name).exists()]
        return found + ([self.dir / "models"] if (self.dir / "models").is_dir() else [])

    def create(self) -> None:
        """Make the folder and its key, for registration only. A non-empty folder that holds no
        device state is refused: it is more likely a mistyped --state than a new device."""
        if self.dir.is_dir() and not self.present() and any(self.dir.iterdir()):
            raise StateError(f"{self.dir} is not empty and holds no device state: pass --state a new or empty folder")
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._cipher(create=True)

    def check_creatable(self) -> None:
        """Refuse, writing nothing, what `save_registration` would refuse after the server had accepted the
        device: a non-empty folder that holds no device state, a bad FEDFACE_DEVICE_KEY, a folder that
        cannot be made or written."""
        if self.dir.is_dir() and not self.present() and any(self.dir.iterdir()):
            raise StateError(f"{self.dir} is not empty and holds no device state: pass --state a new or empty folder")
        if os.environ.get(KEY_ENV):
            self._encryption_key(create=False)  # checks its form only
        existing = next(parent for parent in (self.dir, *self.dir.parents) if parent.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise StateError(f"{existing} is not a folder this user can write: pass --state a folder you own")

    def save_registration(self, device_id: str, key: Ed25519PrivateKey | None) -> None:
        """Write a registration the server accepted: the folder, its encryption key and `key` (None: the
        identity an earlier, interrupted registration sealed here, which the server just accepted again),
        then device.json with the id, last, since its id is what makes the folder a registered device.
        On any failure, Ctrl-C included, the files this call wrote are removed and the error goes on."""
        made_dir = not self.dir.exists()
        key_path, identity_path = self.dir / "device.key", self.dir / "identity.enc"
        written: list[Path] = []
        try:
            self.check_creatable()
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not os.environ.get(KEY_ENV) and not key_path.exists():
                # O_EXCL: a key another process made meanwhile is refused here, never counted as written by this call
                self._aead = AESGCM(self._create_key(key_path))
                written.append(key_path)
            if key is not None:
                raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                        serialization.NoEncryption())
                nonce = os.urandom(12)
                try:
                    write_new(identity_path, nonce + self._cipher().encrypt(nonce, raw, b"identity"))
                except FileExistsError:
                    raise StateError(f"{identity_path} appeared while this device was registering (another "
                                     "register on this folder?): run register again") from None
                written.append(identity_path)
            self.update_info(device_id=device_id)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            if made_dir and self.dir.is_dir() and not any(self.dir.iterdir()):
                self.dir.rmdir()
            self._aead = None
            raise

    @contextmanager
    def train_lock(self) -> Iterator[None]:
        """Hold this folder's train lock for the block, or raise TrainingInProgress at once (it names the
        holder's pid when the holder wrote it). The pid is cleared when the block ends."""
        import fcntl  # POSIX only; a device app on another OS would take its platform's lock here

        path = self.dir / "train.lock"
        handle = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(handle, 32, 0).decode(errors="replace").strip()
                pid = f" (pid {holder})" if holder.isdigit() else ""
                raise TrainingInProgress(f"another train is running on {self.dir}{pid}: let it finish (it sends "
                                         "this device's update), or stop it, before training again") from None
            os.ftruncate(handle, 0)
            os.pwrite(handle, str(os.getpid()).encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(handle, 0)
        finally:
            os.close(handle)  # and with it the lock

    def registration(self) -> str | None:
        """This folder's device id, or None before registration completed. Raises StateError when
        the folder claims a device whose identity it can no longer open."""
        device_id = self.info().get("device_id")
        if device_id is None:
            return None
        if not (self.dir / "identity.enc").exists():
            raise StateError(f"{self.dir / 'identity.enc'} is missing, so device {device_id} cannot sign requests: "
                             f"run {self.reset_hint()} and register again")
        self.signing_key()
        return check_device_id(device_id)

    def require_registered(self) -> str:
        if not self.dir.is_dir():
            raise NotRegistered(f"no device state at {self.dir}: run `fedface device register --state {self.dir}` "
                                "first (or check --state)")
        device_id = self.registration()
        if device_id is None:
            raise NotRegistered(f"{self.dir} holds no registered device: "
                                f"run `fedface device register --state {self.dir}`")
        return device_id

    def delete(self) -> list[Path]:
        """Remove every state file (and the folder when nothing else is left in it); returns what was removed."""
        removed = self.present()
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        for temp in self.dir.glob(".*.tmp") if self.dir.is_dir() else ():
            temp.unlink()
        if self.dir.is_dir() and not any(self.dir.iterdir()):
            self.dir.rmdir()
        self._aead = None
        return removed

    def summary(self) -> dict[str, Any]:
        """Registration, enrollment, a pending upload and the model, read locally (no server call)."""
        device_id = self.require_registered()
        info, pending, seen = self.info(), self.pending_meta(), self.current_model() or {}
        return {
            "state": str(self.dir), "key": self.key_source(), "device_id": device_id,
            "enrolled": bool(info.get("enrolled")),
            "enrolled_model": info.get("model_version") if info.get("enrolled") else None,
            "server_model": seen.get("version"), "pending_upload_round": pending["round_id"] if pending else None,
            "personal_verifier": (self.dir / "personal.enc").exists(),
        }

    # ---- the encryption key ------------------------------------------------------------
    def key_source(self) -> str:
        return KEY_ENV if os.environ.get(KEY_ENV) else str(self.dir / "device.key")

    def _cipher(self, create: bool = False) -> AESGCM:
        if self._aead is None:
            self._aead = AESGCM(self._encryption_key(create))
        return self._aead

    def _encryption_key(self, create: bool) -> bytes:
        if os.environ.get(KEY_ENV):
            try:
                key = base64.b64decode(os.environ[KEY_ENV], validate=True)
            except binascii.Error:
                key = b""
            if len(key) != KEY_BYTES:
                raise StateError(f"{KEY_ENV} must be base64 of {KEY_BYTES} bytes: "
                                 "set it to the key this device was registered with")
            return key
        path = self.dir / "device.key"
        if not path.exists():
            if create:
                return self._create_key(path)
            opened = [n for n in SEALED if (self.dir / f"{n}.enc").exists()]
            lost = f", so {', '.join(f'{n}.enc' for n in opened)} cannot be decrypted" if opened else ""
            raise StateError(f"{path} is missing{lost}: restore it (or set {KEY_ENV}), "
                             f"or run {self.reset_hint()} and register again")
        try:
            key = path.read_bytes()
        except OSError as error:
            raise StateError(f"{path} cannot be read ({error.strerror}): check its owner and permissions") from None
        if len(key) != KEY_BYTES:
            raise StateError(f"{path} holds {len(key)} bytes, not a {KEY_BYTES}-byte key: restore it from a backup, "
                             f"or run {self.reset_hint()} and register again")
        return key

    @staticmethod
    def _create_key(path: Path) -> bytes:
        key = AESGCM.generate_key(bit_length=8 * KEY_BYTES)
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            raise StateError(f"{path} appeared while this device was creating it: run register again") from None
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(key)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return key

    # ---- encrypted blobs ---------------------------------------------------------------
    def _seal(self, name: str, data: bytes) -> None:
        nonce = os.urandom(12)
        write_atomic(self.dir / f"{name}.enc", nonce + self._cipher().encrypt(nonce, data, name.encode()))

    def _open(self, name: str) -> bytes | None:
        path = self.dir / f"{name}.enc"
        if not path.exists():
            return None
        blob, cipher = path.read_bytes(), self._cipher()
        try:
            return cipher.decrypt(blob[:12], blob[12:], name.encode())
        except Exception:
            raise StateError(f"{path} cannot be decrypted with {self.key_source()}: the key was replaced or the file "
                             f"is corrupt; restore the original key, or run {self.reset_hint()} and register again"
                             ) from None

    # ---- identity ----------------------------------------------------------------------
    def signing_key(self, create: bool = False) -> Ed25519PrivateKey | None:
        raw = self._open("identity")
        if raw is None and create:
            if not self.dir.is_dir() or not (os.environ.get(KEY_ENV) or (self.dir / "device.key").exists()):
                self.create()
            key = Ed25519PrivateKey.generate()
            raw_key = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                        serialization.NoEncryption())
            self._seal("identity", raw_key)
            return key
        try:
            return Ed25519PrivateKey.from_private_bytes(raw) if raw is not None else None
        except ValueError:
            raise StateError(f"{self.dir / 'identity.enc'} does not hold an Ed25519 key: run {self.reset_hint()} "
                             "and register again") from None

    # ---- template and faces ------------------------------------------------------------
    def save_template(self, embedding: np.ndarray) -> None:
        import numpy as np  # here, not at the top: see the module's docstring

        self._seal("template", np.asarray(embedding, np.float32).tobytes())

    def template(self) -> np.ndarray | None:
        import numpy as np

        raw = self._open("template")
        return None if raw is None else np.frombuffer(raw, np.float32).copy()

    def save_faces(self, faces: np.ndarray) -> None:
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, np.asarray(faces, np.uint8), allow_pickle=False)
        self._seal("faces", buffer.getvalue())

    def faces(self) -> np.ndarray | None:
        import numpy as np

        raw = self._open("faces")
        return None if raw is None else np.load(io.BytesIO(raw), allow_pickle=False)

    def save_personal(self, payload: bytes) -> None:
        """The personalised verifier (a torch file): trained on the owner's faces, so sealed too."""
        self._seal("personal", payload)

    def personal(self) -> bytes | None:
        return self._open("personal")

    def save_residual(self, residual: dict[str, np.ndarray]) -> None:
        """What quantised uploads have not yet delivered (facecore.federation.quantize): trained on the owner's faces, so sealed."""
        import numpy as np

        buffer = io.BytesIO()
        np.savez(buffer, **residual)  # type: ignore[arg-type]  # numpy's stub lets ** reach allow_pickle
        self._seal("upload_residual", buffer.getvalue())

    def residual(self) -> dict[str, np.ndarray] | None:
        import numpy as np

        raw = self._open("upload_residual")
        if raw is None:
            return None
        with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
            return {k: arrays[k] for k in arrays.files}

    def forget_owner(self) -> None:
        for name in ("template", "faces", "personal", "upload_residual"):
            (self.dir / f"{name}.enc").unlink(missing_ok=True)

    # ---- an update trained but not yet acknowledged ------------------------------------
    def save_pending(self, meta: dict[str, Any], body: bytes) -> None:
        """The body first, then its metadata: the metadata's presence means a complete pending upload."""
        self._seal("pending_upload", body)
        write_atomic(self.dir / "pending_upload.json", json.dumps(meta).encode())

    def pending_meta(self) -> dict[str, Any] | None:
        path = self.dir / "pending_upload.json"
        if not path.exists():
            return None
        meta = self._read_json(path, "delete it (the unsent update is lost; the next train trains again)")
        kinds = {"round_id": int, "key": str, "url": str}
        if not all(isinstance(meta.get(name), kind) for name, kind in kinds.items()):
            raise StateError(f"{path} lacks round_id, key or url: delete it (the unsent update is lost; "
                             "the next train trains again)")
        return meta

    def pending(self) -> tuple[dict[str, Any], bytes] | None:
        meta = self.pending_meta()
        if meta is None:
            return None
        legacy = self.dir / "pending_upload.bin"
        if legacy.exists():  # written unencrypted by an earlier version: seal it now
            self._seal("pending_upload", legacy.read_bytes())
            legacy.unlink()
        body = self._open("pending_upload")
        if body is None:
            self.clear_pending()
            return None
        return meta, body

    def clear_pending(self) -> None:
        for name in ("pending_upload.json", "pending_upload.enc", "pending_upload.bin"):
            (self.dir / name).unlink(missing_ok=True)

    # ---- plain metadata (no biometrics) ------------------------------------------------
    def _read_json(self, path: Path, fix: str) -> dict[str, Any]:
        try:
            value = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not valid JSON"
            raise StateError(f"{path} cannot be read ({reason}): {fix}") from None
        if not isinstance(value, dict):
            raise StateError(f"{path} is not a JSON object: {fix}")
        return value

    def info(self) -> dict[str, Any]:
        path = self.dir / "device.json"
        if not path.exists():
            return {}
        return self._read_json(path, f"run {self.reset_hint()} and register again")

    def update_info(self, **values: Any) -> dict[str, Any]:
        if not self.dir.is_dir():
            raise NotRegistered(f"no device state at {self.dir}: "
                                f"run `fedface device register --state {self.dir}` first")
        info = {**self.info(), **values}
        write_atomic(self.dir / "device.json", json.dumps(info, indent=1).encode(), mode=0o644)
        return info

    def remember_model(self, model: dict[str, Any]) -> None:
        """Keep the server's current model description (/v1/models/current), so a later command can
        report or use it without asking the server again."""
        check_model_description(model)
        if self.info().get("model") != model:
            self.update_info(model=model)

    def current_model(self) -> dict[str, Any] | None:
        """The model description last seen from the server, or None."""
        model = self.info().get("model")
        return model if isinstance(model, dict) else None

    # ---- cached models -----------------------------------------------------------------
    def models_dir(self) -> Path:
        path = self.dir / "models"
        path.mkdir(exist_ok=True)
        return path

    def model_path(self, version: str, kind: str) -> Path:
        """Where the `kind` file of model `version` is cached; refuses names that would leave the folder."""
        if kind not in MODEL_KINDS:
            raise ValueError(f"model kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
        path = self.dir / "models" / f"{check_version(version)}.{kind}"
        if not path.resolve().is_relative_to(self.dir.resolve()):
            raise StateError(f"{path} resolves outside {self.dir}: remove the link in {self.dir / 'models'}")
        return path

    def _model_record(self, path: Path) -> dict[str, Any] | None:
        record_path = path.with_name(path.name + ".json")
        try:
            record = json.loads(record_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        return record if isinstance(record, dict) and isinstance(record.get("sha256"), str) else None

    def cached_model(self, version: str, kind: str) -> Path | None:
        """The cached file, only if it still has the sha256 recorded at download; a file that does
        not is deleted, so the next download fetches it whole."""
        path = self.model_path(version, kind)
        if not path.exists():
            return None
        record = self._model_record(path)
        if record is not None and file_sha256(path) == record["sha256"]:
            return path
        path.unlink()
        path.with_name(path.name + ".json").unlink(missing_ok=True)
        return None

    def model_sha256(self, version: str, kind: str) -> str | None:
        """The sha256 recorded at download for a cached file, which `cached_model` checks it against."""
        record = self._model_record(self.model_path(version, kind))
        return None if record is None else str(record["sha256"])

    def store_model(self, version: str, kind: str, data: bytes, expected_sha256: str | None) -> Path:
        """Cache a downloaded model file after checking its size, a backbone file's archive
        (`check_torch_archive`) and the sha256 the server vouched for."""
        path = self.model_path(version, kind)
        what = f"{kind} file of model {version[:12]}"
        check_model_size(len(data), what)
        if kind.endswith(".pt"):
            check_torch_archive(data, what)
        digest = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None and digest != expected_sha256:
            raise BadServerResponse(f"the {kind} file of model {version[:12]} arrived with sha256 {digest[:12]}, "
                                    f"not the {expected_sha256[:12]} the server published: not used; try again")
        self.models_dir()
        write_atomic(path, data, mode=0o644)
        write_atomic(path.with_name(path.name + ".json"), json.dumps({"sha256": digest}).encode(), mode=0o644)
        return path

    def drop_model(self, version: str, kind: str) -> None:
        """Delete a cached model file the device refused to use, so the next call downloads it afresh."""
        path = self.model_path(version, kind)
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".json").unlink(missing_ok=True)
