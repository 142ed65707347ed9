"""`fedface device verify` loads only what it uses, opens its verifier with cyclic garbage collection paused,
then scores photos with it back on, and leaves the objects it made where collections that find nothing cannot
reach them: the oldest generation."""
from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fedface.commands import device_verify


@pytest.fixture()
def collections() -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs."""
    started: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(record)
    yield started
    gc.callbacks.remove(record)


def test_no_collection_runs_while_opening_and_what_it_made_is_old_after(collections: list[int]) -> None:
    # Prepare: enough new container objects to start some seventy young collections
    assert gc.isenabled()
    # Execute
    with device_verify._no_collections():
        made: list[list[int]] = [[] for _ in range(50_000)]
        during = list(collections)
    # Assert: none ran inside; collection is back, with no young objects left over for the next one to walk
    assert during == [] and gc.isenabled()
    assert gc.get_count()[0] < 100
    assert any(obj is made for obj in gc.get_objects(generation=2))


def test_collection_stays_off_after_the_block_when_the_caller_had_it_off() -> None:
    # Prepare
    gc.disable()
    try:
        # Execute
        with device_verify._no_collections():
            pass
        # Assert
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_verify_path_leaves_the_aligned_face_cache_unloaded() -> None:
    # Prepare: what `run` imports; the cache (and its sqlite3) serves enrollment and evaluation, never a verify
    probe = ("import sys\nimport device_sdk.link, device_sdk.state, device_sdk.transport, device_sdk.verify\n"
             "print(sorted(m for m in ('sqlite3', 'facecore.align.cache', 'facecore.align.pipeline') if m in sys.modules))")
    # Execute
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    # Assert
    assert loaded.stdout.strip() == "[]"
