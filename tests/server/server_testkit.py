"""A minimal device client for the server tests: plain httpx + cryptography signing.

It speaks the wire protocol through facecore.federation.protocol, the one definition the server
and the device SDK share, never through server internals; protocol_test pins that definition
byte for byte, so a protocol change still breaks a test.
"""
from __future__ import annotations

import base64
import io
import json
import secrets
from typing import Any

import httpx
import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from facecore import tensorfile
from facecore.federation.protocol import (
    BACKBONE_PREFIX,
    DEVICE_ID_HEADER,
    EMBEDDING_KEY,
    METADATA_KEY,
    REGISTER_SUBJECT,
    body_sha256,
    signature_headers,
)

EMBEDDING_DIM = 128


def sign(key: Ed25519PrivateKey, subject: str, method: str, path: str, body: bytes, timestamp: int | None = None, nonce: str | None = None) -> dict[str, str]:
    """Signature headers without the device id: a test may sign for one subject and claim another."""
    return signature_headers(key, subject, method, path, body_sha256(body), timestamp, nonce)


def unit_vector(rng: np.random.Generator, dim: int = EMBEDDING_DIM) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class Device:
    def __init__(self, http: httpx.Client, key: Ed25519PrivateKey | None = None) -> None:
        self.http = http
        self.key = key or Ed25519PrivateKey.generate()
        self.public_key = base64.b64encode(self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        self.id: str | None = None

    def request(self, method: str, path: str, body: bytes | Any = b"", headers: dict[str, str] | None = None, **sign_args: Any) -> httpx.Response:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        subject = sign_args.pop("subject", self.id or REGISTER_SUBJECT)
        signed = sign(self.key, subject, method, path, body, **sign_args)
        if self.id and subject != REGISTER_SUBJECT:
            signed[DEVICE_ID_HEADER] = self.id
        return self.http.request(method, path, content=body, headers={**signed, **(headers or {})})

    def register(self) -> httpx.Response:
        response = self.request("POST", "/v1/devices", {"public_key": self.public_key}, subject=REGISTER_SUBJECT)
        if response.status_code in (200, 201):
            self.id = response.json()["device_id"]
        return response

    def enroll(self, vector: np.ndarray) -> httpx.Response:
        return self.request("PUT", f"/v1/devices/{self.id}/embedding", {"embedding": [float(x) for x in vector]})

    def embedding(self, device_id: str | None = None) -> httpx.Response:
        return self.request("GET", f"/v1/devices/{device_id or self.id}/embedding")

    def checkin(self) -> httpx.Response:
        return self.request("POST", "/v1/rounds/current/checkin")

    def backbone(self, version: str, dtype: str = "fp32", etag: str | None = None) -> httpx.Response:
        return self.request("GET", f"/v1/models/{version}/backbone?dtype={dtype}", headers={"If-None-Match": etag} if etag else None)

    def upload(self, round_id: int, body: bytes, key: str | None = None) -> httpx.Response:
        headers = {"Content-Type": "application/octet-stream", "Idempotency-Key": key or secrets.token_hex(16)}
        return self.request("POST", f"/v1/rounds/{round_id}/updates", body, headers=headers)


def load_backbone_bytes(data: bytes) -> dict[str, np.ndarray]:
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return {k: v.numpy() for k, v in payload["state_dict"].items()}


def make_delta(base: dict[str, np.ndarray], rng: np.random.Generator, scale: float = 1e-3) -> dict[str, np.ndarray]:
    """A fake training result: small noise on float tensors, zero on integer buffers."""
    return {
        k: (rng.standard_normal(v.shape) * scale).astype(np.float32) if v.dtype.kind == "f" else np.zeros(v.shape, v.dtype)
        for k, v in base.items()
    }


def update_file(
    delta: dict[str, np.ndarray], embedding: np.ndarray, base_version: str, n_samples: int, metrics: dict | None = None, **meta_extra: Any
) -> bytes:
    tensors = {BACKBONE_PREFIX + k: v for k, v in delta.items()} | {EMBEDDING_KEY: np.asarray(embedding, dtype=np.float32)}
    meta = {"base_version": base_version, "n_samples": n_samples, "metrics": metrics or {"loss": 0.5}} | meta_extra
    return tensorfile.dumps(tensors, {METADATA_KEY: json.dumps(meta)})
