"""Blobs in the database's ``blobs`` table, so server processes on several hosts share them.

No S3-compatible server installs from the registries this project may use (PyPI, Debian, npm):
MinIO, SeaweedFS and Garage are in none of them; Debian's radosgw (Ceph 16.2) is built without
its standalone database back end and needs a Ceph cluster; and what PyPI and npm hold (moto,
s3rver, local-s3-server) are test fakes. PostgreSQL, which every replica already shares, holds
the blobs instead. Rows are small in number (a version's three files, a round's updates until
the round ends) and a bytea value up to 1 GB is well inside what a model or update needs.

Invariants are the local store's: a blob is committed (durable) before any row names it, the
content is addressed by its sha256, and writing the same content twice stores it once. Uploads
still spool to a local scratch folder while their hash is checked.
"""
from __future__ import annotations

import io
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import Engine, delete, exists, func, insert, select
from sqlalchemy.exc import IntegrityError

from facecore.digest import file_sha256
from server_api.core.db import is_postgres
from server_api.storage.blobs import CHUNK, BlobNotFound, BlobStore, LocalBlobStore, check_digest, clean_scratch, make_private_dir, scratch_file
from server_api.tables import Blob, table_of

BLOBS = table_of(Blob)
REST_OF_BLOB = 2**31 - 1  # a substr length past any bytea's end (1 GB at most): the rest of the blob


def select_bytes(engine: Engine, digest: str, start: int = 1, count: int | None = None) -> bytes:
    """A blob's bytes from ``start`` (1-based, as SQL's substr), ``count`` of them or all the rest."""
    length = REST_OF_BLOB if count is None else count
    if is_postgres(engine):
        # psycopg reads bytea as hex text (twice the bytes, decoded in Python) unless the cursor asks for binary results.
        with engine.connect() as connection:
            cursor = connection.connection.driver_connection.cursor(binary=True)  # type: ignore[union-attr]
            cursor.execute("SELECT substr(data, %s, %s) FROM blobs WHERE digest = %s", (start, length, digest))
            row = cursor.fetchone()
        data = None if row is None else row[0]
    else:
        with engine.connect() as connection:
            data = connection.scalar(select(func.substr(BLOBS.c.data, start, length)).where(BLOBS.c.digest == digest))
    if data is None:
        raise BlobNotFound(digest)
    return bytes(data)


class _BlobReader(io.RawIOBase):
    """A seekable read-only view of one blob; each read is one ``substr`` query (bytea out of line, uncompressed,
    so PostgreSQL fetches only the chunks it covers)."""

    def __init__(self, engine: Engine, digest: str, size: int) -> None:
        self.engine, self.digest, self.length, self.position = engine, digest, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.position = base + offset
        return self.position

    def _fetch(self, count: int) -> bytes:
        count = max(0, min(count, self.length - self.position))
        if count == 0:
            return b""
        data = select_bytes(self.engine, self.digest, self.position + 1, count)
        self.position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self._fetch(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self._fetch(self.length - self.position)  # one query, not one per default buffer


class DatabaseBlobStore:
    def __init__(self, engine: Engine, scratch: Path) -> None:
        self.engine = engine
        self.tmp = make_private_dir(Path(scratch))

    def temp_file(self) -> AbstractContextManager[Path]:
        return scratch_file(self.tmp)

    def clean_temp(self, older_than_s: float = 3600.0) -> int:
        return clean_scratch(self.tmp, older_than_s)

    def exists(self, digest: str) -> bool:
        with self.engine.connect() as connection:
            return bool(connection.scalar(select(exists().where(BLOBS.c.digest == check_digest(digest)))))

    def size(self, digest: str) -> int:
        with self.engine.connect() as connection:
            size = connection.scalar(select(BLOBS.c.size).where(BLOBS.c.digest == check_digest(digest)))
        if size is None:
            raise BlobNotFound(digest)
        return int(size)

    def get(self, digest: str) -> bytes:
        return select_bytes(self.engine, check_digest(digest))

    def open(self, digest: str) -> BinaryIO:
        """Reads fetch only the bytes asked for (a MiB at a time), so a model served to many devices at once, or
        the trained entries aggregation reads from an update, never sit whole in memory."""
        return io.BufferedReader(_BlobReader(self.engine, check_digest(digest), self.size(digest)), buffer_size=CHUNK)

    def delete(self, digest: str) -> bool:
        with self.engine.begin() as connection:
            return connection.execute(delete(BLOBS).where(BLOBS.c.digest == check_digest(digest))).rowcount > 0

    def put(self, data: bytes) -> str:
        with self.temp_file() as temp:
            temp.write_bytes(data)
            return self.put_file(temp)

    def put_file(self, path: Path) -> str:
        return self._insert(path, file_sha256(path))

    def adopt(self, path: Path, digest: str) -> str:
        if path.parent != self.tmp:
            raise ValueError(f"{path} is not a scratch file of this store")
        return self._insert(path, check_digest(digest))

    def _insert(self, path: Path, digest: str) -> str:
        if self.exists(digest):
            return digest
        data = path.read_bytes()
        try:
            with self.engine.begin() as connection:
                connection.execute(insert(BLOBS).values(digest=digest, size=len(data), data=data))
        except IntegrityError:
            pass  # another process stored the same content first
        return digest


def open_blob_store(kind: str, root: Path, engine: Engine) -> BlobStore:
    """The server's blob store (``FEDFACE_BLOB_STORE``): ``root`` itself, or the database with ``root/tmp`` as the
    upload scratch folder."""
    return LocalBlobStore(root) if kind == "local" else DatabaseBlobStore(engine, root / "tmp")
