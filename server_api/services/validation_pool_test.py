"""The validation workers: same answers as in-process, errors carried over, a dead worker replaced."""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from facecore import tensorfile
from server_api.errors import InvalidInput, Unavailable
from server_api.services.validation_pool import UpdateSpec, ValidationPool, check_update_file

BASE = "cd" * 32
EXPECTED = UpdateSpec({"a.weight": ("float32", [8, 3]), "a.num_batches_tracked": ("int64", [])}, 4, BASE, 1e3)


def _update_file(path: Path, weight: np.ndarray, n_samples: int = 5) -> Path:
    tensors = {"backbone.a.weight": weight, "backbone.a.num_batches_tracked": np.zeros((), "<i8"), "class_embedding": np.full(4, 0.5, "<f4")}
    path.write_bytes(tensorfile.dumps(tensors, {"fedface": json.dumps({"base_version": BASE, "n_samples": n_samples, "metrics": {"loss": 0.25}})}))
    return path


@pytest.fixture()
def pool() -> Iterator[ValidationPool]:
    workers = ValidationPool(1)
    workers.start()
    yield workers
    workers.close()


def test_a_worker_answers_as_the_calling_thread_would(pool: ValidationPool, tmp_path: Path) -> None:
    # Prepare
    path = _update_file(tmp_path / "u", np.random.default_rng(0).standard_normal((8, 3)).astype("<f2"))
    size = path.stat().st_size
    # Execute
    remote, local = pool.check(path, size, EXPECTED), check_update_file(str(path), size, EXPECTED)
    # Assert
    assert remote.delta_norm == local.delta_norm and remote.meta == local.meta
    np.testing.assert_array_equal(remote.embedding, local.embedding)
    assert pool.pids() and os.getpid() not in pool.pids()


def test_bad_input_in_a_worker_raises_the_same_domain_error(pool: ValidationPool, tmp_path: Path) -> None:
    # Prepare: NaN in the backbone, then a file that is not a tensor file
    weight = np.zeros((8, 3), "<f4")
    weight[2, 1] = np.nan
    nan_file = _update_file(tmp_path / "nan", weight)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x80\x04 not a tensor file")
    # Execute / Assert
    with pytest.raises(InvalidInput, match=r"backbone\.a\.weight contains NaN or Inf"):
        pool.check(nan_file, nan_file.stat().st_size, EXPECTED)
    with pytest.raises(InvalidInput, match="not a valid tensor file"):
        pool.check(garbage, garbage.stat().st_size, EXPECTED)
    # the worker survives bad input
    good = _update_file(tmp_path / "good", np.ones((8, 3), "<f4"))
    assert pool.check(good, good.stat().st_size, EXPECTED).delta_norm == pytest.approx(np.sqrt(24))


def test_a_killed_worker_is_replaced(pool: ValidationPool, tmp_path: Path) -> None:
    # Prepare: the OOM killer takes the only worker
    path = _update_file(tmp_path / "u", np.ones((8, 3), "<f4"))
    (victim,) = pool.pids()
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while victim in pool.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Execute: a request may meet the dead worker (503, nothing accepted); the next one is served
    answers: list[float | str] = []
    for _ in range(2):
        try:
            answers.append(pool.check(path, path.stat().st_size, EXPECTED).delta_norm)
        except Unavailable:
            answers.append("retry")
    # Assert
    assert answers[-1] == pytest.approx(np.sqrt(24)) and answers.count("retry") <= 1
    assert len(pool.pids()) == 1 and victim not in pool.pids()


def test_close_stops_every_worker(tmp_path: Path) -> None:
    # Prepare
    workers = ValidationPool(2)
    workers.start()
    pids = workers.pids()
    # Execute
    workers.close()
    # Assert
    assert len(pids) == 2 and workers.pids() == []
    for pid in pids:
        with pytest.raises(ProcessLookupError, match="No such process"):
            os.kill(pid, 0)  # gone, and reaped by the forkserver
