"""The demo's evaluation is remembered by the weights and the faces, and its phases are timed."""
from pathlib import Path

import numpy as np
import pytest
import torch

import simulator.demo as demo
from facecore.align.pipeline import AlignedSet
from facecore.eval.lfw import LFWFaces
from facecore.paths import CACHE_ENV


class _Flat(torch.nn.Module):
    """A stand-in backbone: the mean colour of each face, weighted."""

    embedding_dim = 3

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) @ self.weight


def _lfw(shift: int = 0) -> LFWFaces:
    """Two folds of two people each, two faces a person: faces of one person share a colour."""
    colours = np.array([[250, 0, 0], [0, 250, 0], [0, 0, 250], [250, 250, 0]], np.uint8)
    faces = np.repeat(colours, 2, axis=0)[:, None, None, :].repeat(4, 1).repeat(4, 2)
    faces[0, 0, 0, 0] += shift
    identities = np.array(["lfw:a", "lfw:a", "lfw:b", "lfw:b", "lfw:c", "lfw:c", "lfw:d", "lfw:d"])
    pairs = np.array([[0, 1], [0, 2], [4, 5], [4, 6]])
    empty = AlignedSet((), (), np.zeros((0, 4, 4, 3), np.uint8), np.zeros(0, np.int64))
    return LFWFaces((6, 7), faces, identities, pairs, np.array([True, False, True, False]), np.array([6, 6, 7, 7]), empty, (),
                    np.array([6, 6, 6, 6, 7, 7, 7, 7]))


def test_a_model_is_scored_once_per_weights_and_faces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a private cache, and a count of the faces embedded
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    embedded: list[int] = []
    embed = demo.embed_faces

    def counted(model: torch.nn.Module, faces: np.ndarray) -> np.ndarray:
        embedded.append(len(faces))
        return embed(model, faces)

    monkeypatch.setattr(demo, "embed_faces", counted)
    model = _Flat()
    # Execute: the same weights twice (a later round that left them as they were, or a run again),
    # then changed weights, then other faces
    first = demo.lfw_scorer(_lfw())(model)
    again = demo.lfw_scorer(_lfw())(model)
    with torch.no_grad():
        model.weight.mul_(2.0)
    demo.lfw_scorer(_lfw())(model)
    demo.lfw_scorer(_lfw(shift=1))(model)
    # Assert: embedded once per distinct (weights, faces); a remembered score reads back whole
    assert embedded == [8, 8, 8]
    assert (again["accuracy"], again["auc"]) == (first["accuracy"], first["auc"]) and first["accuracy"] == 1.0


def test_the_phase_clock_adds_up_a_phase_run_twice() -> None:
    # Prepare
    clock = demo.PhaseClock()
    # Execute
    with clock("enrolment"):
        pass
    with clock("round 1 training"):
        pass
    with clock("enrolment"):
        pass
    # Assert: one entry per phase, in the order they first ran
    assert list(clock.seconds) == ["enrolment", "round 1 training"] and all(s >= 0 for s in clock.seconds.values())


def test_an_error_in_the_background_reaches_the_caller() -> None:
    # Prepare
    def fail() -> None:
        raise RuntimeError("scoring failed")

    # Execute / Assert
    with pytest.raises(RuntimeError, match="scoring failed"):
        demo.Background(fail).result()


@pytest.mark.parametrize("ordered", [True, False])
def test_devices_train_two_at_a_time_and_upload_in_fleet_order(ordered: bool) -> None:
    # Prepare: devices whose training takes longer the earlier they come, so that later ones finish first;
    # each "uploads" (is logged) right after its training slot, as FaceDevice.train_round does
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    turns = demo.UploadTurns(2)
    training: list[int] = []
    most_at_once = [0]
    uploads: list[int] = []
    lock = threading.Lock()

    def device_round(index: int) -> None:
        try:
            with turns.slot(index):
                with lock:
                    training.append(index)
                    most_at_once[0] = max(most_at_once[0], len(training))
                time.sleep(0.05 * (6 - index))
                with lock:
                    training.remove(index)
            with lock:
                uploads.append(index)
        finally:
            turns.finished(index)

    turns.begin_round(ordered=ordered)
    # Execute
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(device_round, range(6)))
    # Assert: two trained at once; in order only when asked
    assert most_at_once[0] == 2
    assert (uploads == list(range(6))) == ordered


def test_a_device_that_fails_lets_the_next_ones_upload() -> None:
    # Prepare: device 0 fails before it trains
    from concurrent.futures import ThreadPoolExecutor

    turns = demo.UploadTurns(2)
    uploads: list[int] = []

    def device_round(index: int) -> None:
        try:
            if index == 0:
                raise RuntimeError("no round open")
            with turns.slot(index):
                pass
            uploads.append(index)
        finally:
            turns.finished(index)

    turns.begin_round()
    # Execute
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(device_round, index) for index in range(4)]
        errors = [f.exception(timeout=10) for f in futures]
    # Assert: the failure is reported, and nobody waits for device 0 forever
    assert isinstance(errors[0], RuntimeError) and errors[1:] == [None, None, None]
    assert uploads == [1, 2, 3]
