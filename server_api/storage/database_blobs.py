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
from typing import BinaryIO

from sqlalchemy import Engine, delete, exists, insert, select
from sqlalchemy.exc import IntegrityError

from facecore.digest import file_sha256
from server_api.storage.blobs import BlobNotFound, check_digest, clean_scratch, make_private_dir, scratch_file
from server_api.tables import Blob, table_of

BLOBS = table_of(Blob)


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
        with self.engine.connect() as connection:
            data = connection.scalar(select(BLOBS.c.data).where(BLOBS.c.digest == check_digest(digest)))
        if data is None:
            raise BlobNotFound(digest)
        return bytes(data)

    def open(self, digest: str) -> BinaryIO:
        return io.BytesIO(self.get(digest))

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
