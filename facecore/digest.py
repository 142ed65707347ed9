"""The sha256 of a file, streamed: the one helper behind every integrity check (published weights,
the exported detector, the device's cached models, the server's blobs). Imports nothing heavy, so
torch-free code (the device's verify path) can use it."""
from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
