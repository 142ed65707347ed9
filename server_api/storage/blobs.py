"""Content-addressed blob store: model versions and uploaded updates, named by sha256.

Blobs are immutable and written before any database row names them, so a row
always points at a complete blob; a crash can leave an orphan blob (harmless,
garbage) but never a row without its blob. The protocol is small enough for an
S3 implementation (put = upload to a temp key + copy, or a conditional PUT).

Blobs hold model weights and device updates: the local store's folders are 0700 and its files
0400 (immutable, and readable by the server's user only). :class:`LocalBlobStore` serves one
host; :class:`server_api.storage.database_blobs.DatabaseBlobStore` keeps blobs in the database, so
server processes on several hosts share them.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

from facecore.digest import file_sha256

CHUNK = 1 << 20
PRIVATE_DIR_MODE = 0o700
PRIVATE_BLOB_MODE = 0o400
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class BlobWriter(Protocol):
    def write(self, data: bytes) -> int: ...


class BlobStore(Protocol):
    def put(self, data: bytes) -> str:
        """Store bytes, return their sha256 hex digest (idempotent)."""

    def put_file(self, path: Path) -> str:
        """Store a local file's content (streamed), return its digest; the file is left alone."""

    def adopt(self, path: Path, digest: str) -> str:
        """Take over a scratch file from :meth:`temp_file` whose sha256 the caller computed
        while writing it (an upload hashed as it streamed in): no second read or copy."""

    def temp_file(self) -> AbstractContextManager[Path]:
        """A scratch path that is removed on exit unless :meth:`adopt` took it."""

    def get(self, digest: str) -> bytes: ...

    def open(self, digest: str) -> BinaryIO:
        """A binary file object positioned at 0; the caller closes it."""

    def exists(self, digest: str) -> bool: ...

    def size(self, digest: str) -> int: ...

    def delete(self, digest: str) -> bool:
        """Remove a blob; False if it was not there."""

    def clean_temp(self, older_than_s: float = 3600.0) -> int:
        """Remove scratch files older than this that a killed process left; how many."""


class BlobNotFound(KeyError):
    pass


def check_digest(digest: str) -> str:
    if not _DIGEST.match(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return digest


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) and make it 0700, also when it already existed."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


class LocalBlobStore:
    """``root/objects/ab/<digest>``; writes go to ``root/tmp`` then ``os.replace`` (atomic on POSIX)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        for folder in (self.root, self.objects, self.tmp):
            make_private_dir(folder)

    def path(self, digest: str) -> Path:
        return self.objects / check_digest(digest)[:2] / digest

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(digest) from None

    def open(self, digest: str) -> BinaryIO:
        try:
            return self.path(digest).open("rb")
        except FileNotFoundError:
            raise BlobNotFound(digest) from None

    def get(self, digest: str) -> bytes:
        with self.open(digest) as handle:
            return handle.read()

    def delete(self, digest: str) -> bool:
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    def temp_file(self) -> AbstractContextManager[Path]:
        """A scratch path on the store's filesystem (so a later put_file can rename it)."""
        return scratch_file(self.tmp)

    def put(self, data: bytes) -> str:
        with self.temp_file() as temp:
            with temp.open("wb") as handle:
                handle.write(data)
            return self.put_file(temp)

    def put_file(self, path: Path) -> str:
        digest = file_sha256(path)
        final = self.path(digest)
        if final.is_file():
            return digest
        final.parent.mkdir(exist_ok=True, mode=PRIVATE_DIR_MODE)
        # Copy to our own temp (the source may be elsewhere or reused by the caller), fsync, rename.
        handle, temp = tempfile.mkstemp(dir=self.tmp, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out, path.open("rb") as src:
                shutil.copyfileobj(src, out, CHUNK)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temp, PRIVATE_BLOB_MODE)
            os.replace(temp, final)
            _fsync_dir(final.parent)
        finally:
            Path(temp).unlink(missing_ok=True)
        return digest

    def adopt(self, path: Path, digest: str) -> str:
        final = self.path(digest)
        if final.is_file():
            return digest
        if path.parent != self.tmp:
            raise ValueError(f"{path} is not a scratch file of this store")
        final.parent.mkdir(exist_ok=True, mode=PRIVATE_DIR_MODE)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes are durable before any row can name them
        finally:
            os.close(fd)
        os.chmod(path, PRIVATE_BLOB_MODE)
        os.replace(path, final)
        _fsync_dir(final.parent)
        return digest

    def clean_temp(self, older_than_s: float = 3600.0) -> int:
        return clean_scratch(self.tmp, older_than_s)


@contextmanager
def scratch_file(folder: Path) -> Iterator[Path]:
    """A fresh file in ``folder``, removed on exit unless something moved it away."""
    handle, name = tempfile.mkstemp(dir=folder, suffix=".tmp")
    os.close(handle)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def clean_scratch(folder: Path, older_than_s: float = 3600.0) -> int:
    """Remove scratch files a killed process left; age-gated so another worker's live upload survives."""
    removed = 0
    for leftover in folder.glob("*.tmp"):
        try:
            if time.time() - leftover.stat().st_mtime > older_than_s:
                leftover.unlink()
                removed += 1
        except FileNotFoundError:
            pass
    return removed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
