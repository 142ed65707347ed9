"""The device's local state under `state_dir`: identity key, template, cached models, aligned faces.

The private key, the template (class embedding) and the owner's aligned faces are biometric or
secret, so they are encrypted at rest with AES-GCM. The encryption key comes from
`FEDFACE_DEVICE_KEY` (base64 of 32 bytes) when set — on a phone, the OS keystore would hand it
over — else from `<state_dir>/device.key`, created with mode 0600 on first use. Every file is
written to a temporary name and renamed, so a crash never leaves a half-written state file.
"""
from __future__ import annotations

import base64
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from device_sdk.errors import DeviceError

KEY_ENV = "FEDFACE_DEVICE_KEY"


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


class DeviceState:
    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._aead = AESGCM(self._encryption_key())

    def _encryption_key(self) -> bytes:
        if os.environ.get(KEY_ENV):
            key = base64.b64decode(os.environ[KEY_ENV])
            if len(key) != 32:
                raise DeviceError(f"{KEY_ENV} must be base64 of 32 bytes")
            return key
        path = self.dir / "device.key"
        if not path.exists():
            write_atomic(path, AESGCM.generate_key(bit_length=256))
        return path.read_bytes()

    # ---- encrypted blobs ---------------------------------------------------------------
    def _seal(self, name: str, data: bytes) -> None:
        nonce = os.urandom(12)
        write_atomic(self.dir / f"{name}.enc", nonce + self._aead.encrypt(nonce, data, name.encode()))

    def _open(self, name: str) -> bytes | None:
        path = self.dir / f"{name}.enc"
        if not path.exists():
            return None
        blob = path.read_bytes()
        try:
            return self._aead.decrypt(blob[:12], blob[12:], name.encode())
        except Exception:
            raise DeviceError(f"{path} cannot be decrypted: wrong device key or a corrupt file") from None

    # ---- identity ----------------------------------------------------------------------
    def signing_key(self, create: bool = False) -> Ed25519PrivateKey | None:
        raw = self._open("identity")
        if raw is None and create:
            key = Ed25519PrivateKey.generate()
            self._seal("identity", key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()))
            return key
        return Ed25519PrivateKey.from_private_bytes(raw) if raw is not None else None

    # ---- template and faces ------------------------------------------------------------
    def save_template(self, embedding: np.ndarray) -> None:
        self._seal("template", np.asarray(embedding, np.float32).tobytes())

    def template(self) -> np.ndarray | None:
        raw = self._open("template")
        return None if raw is None else np.frombuffer(raw, np.float32).copy()

    def save_faces(self, faces: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(faces, np.uint8), allow_pickle=False)
        self._seal("faces", buffer.getvalue())

    def faces(self) -> np.ndarray | None:
        raw = self._open("faces")
        return None if raw is None else np.load(io.BytesIO(raw), allow_pickle=False)

    def save_personal(self, payload: bytes) -> None:
        """The personalised verifier (a torch file): trained on the owner's faces, so sealed too."""
        self._seal("personal", payload)

    def personal(self) -> bytes | None:
        return self._open("personal")

    def forget_owner(self) -> None:
        for name in ("template", "faces", "personal"):
            (self.dir / f"{name}.enc").unlink(missing_ok=True)

    # ---- plain metadata (no biometrics) ------------------------------------------------
    def info(self) -> dict[str, Any]:
        path = self.dir / "device.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def update_info(self, **values: Any) -> dict[str, Any]:
        info = {**self.info(), **values}
        write_atomic(self.dir / "device.json", json.dumps(info, indent=1).encode(), mode=0o644)
        return info

    def models_dir(self) -> Path:
        path = self.dir / "models"
        path.mkdir(exist_ok=True)
        return path
