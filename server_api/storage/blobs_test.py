"""The blob store contract, on the local folder and on the database (SQLite and PostgreSQL)."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine

from server_api.conftest import NEEDS_POSTGRES
from server_api.storage.blobs import BlobNotFound, BlobStore, LocalBlobStore
from server_api.storage.database_blobs import DatabaseBlobStore


@pytest.fixture(params=["local", "sqlite", pytest.param("postgres", marks=NEEDS_POSTGRES)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    engine_fixture = "postgres_engine" if request.param == "postgres" else "sqlite_engine"
    engine: Engine = request.getfixturevalue(engine_fixture)
    return DatabaseBlobStore(engine, tmp_path / "scratch")


def test_a_blob_comes_back_whole_under_its_sha256(store: BlobStore) -> None:
    # Prepare
    data = bytes(range(256)) * 4099
    # Execute
    digest = store.put(data)
    again = store.put(data)
    with store.open(digest) as handle:
        handle.seek(1000)
        middle = handle.read(10)
    # Assert
    assert digest == again == hashlib.sha256(data).hexdigest()
    assert store.get(digest) == data and store.size(digest) == len(data) and store.exists(digest)
    assert middle == data[1000:1010]


def test_an_adopted_scratch_file_is_stored_and_its_scratch_copy_goes(store: BlobStore) -> None:
    # Prepare
    payload = b"an update body" * 1000
    # Execute
    with store.temp_file() as spool:
        spool.write_bytes(payload)
        digest = store.adopt(spool, hashlib.sha256(payload).hexdigest())
    # Assert
    assert store.get(digest) == payload and not spool.exists()


def test_a_deleted_or_unknown_blob_is_not_found_and_a_bad_name_is_refused(store: BlobStore) -> None:
    # Prepare
    digest = store.put(b"short-lived")
    # Execute
    deleted, deleted_again = store.delete(digest), store.delete(digest)
    # Assert
    assert (deleted, deleted_again) == (True, False) and not store.exists(digest)
    with pytest.raises(BlobNotFound, match=digest):
        store.get(digest)
    with pytest.raises(BlobNotFound, match=digest):
        store.size(digest)
    with pytest.raises(ValueError, match="not a sha256 hex digest"):
        store.get("../etc/passwd")


def test_a_file_outside_the_scratch_folder_cannot_be_adopted(store: BlobStore, tmp_path: Path) -> None:
    # Prepare
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x")
    # Execute / Assert
    with pytest.raises(ValueError, match="is not a scratch file of this store"):
        store.adopt(outside, hashlib.sha256(b"x").hexdigest())


def test_two_processes_storing_the_same_content_at_once_store_it_once(store: BlobStore) -> None:
    # Prepare
    data = b"the same model version" * 50_000
    digests: list[str] = []
    # Execute
    writers = [threading.Thread(target=lambda: digests.append(store.put(data))) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    # Assert
    assert len(set(digests)) == 1 and len(digests) == 4 and store.get(digests[0]) == data


def test_a_blob_larger_than_a_read_chunk_reads_back_in_pieces_and_whole(store: BlobStore) -> None:
    # Prepare: 2.5 MiB, so reads cross the 1 MiB chunks the database store fetches
    data = np.random.default_rng(0).integers(0, 256, size=5 << 19, dtype=np.uint8).tobytes()
    digest = store.put(data)
    # Execute
    with store.open(digest) as handle:
        whole = handle.read()
        at_end = handle.read(10)
    with store.open(digest) as handle:
        pieces = []
        while piece := handle.read(300_001):
            pieces.append(piece)
        handle.seek(-7, 2)
        tail = handle.read()
        handle.seek((1 << 20) - 3)
        across = handle.read(6)
    # Assert
    assert whole == data and at_end == b"" and b"".join(pieces) == data
    assert tail == data[-7:] and across == data[(1 << 20) - 3 : (1 << 20) + 3]
