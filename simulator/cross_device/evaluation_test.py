"""The simulator's evaluation is remembered per weights and setting, never across them."""
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from facecore.paths import CACHE_ENV
from simulator.cross_device.evaluation import devices_digest, remembered
from simulator.cross_device.population import SimDevice


def test_an_evaluation_is_reused_only_for_the_same_weights_setting_and_owners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: an evaluator that counts its calls
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    calls: list[float] = []

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        calls.append(float(next(model.parameters()).detach().sum()))
        return {"accuracy": calls[-1], "tar_at_far": {"1e-4": float("nan")}}

    owners = [SimDevice(0, "a", np.zeros((2, 4, 4, 3), np.uint8), np.ones((1, 4, 4, 3), np.uint8))]
    model = torch.nn.Linear(2, 2, bias=False)
    first = remembered(evaluate, {"folds": [1, 2], "devices": devices_digest(owners)})
    # Execute: the same weights twice, then changed weights, another setting, other owner photos
    a = first(model)
    b = remembered(evaluate, {"folds": [1, 2], "devices": devices_digest(owners)})(model)  # a new run, same start
    with torch.no_grad():
        model.weight.add_(1.0)
    c = first(model)
    remembered(evaluate, {"folds": [1, 3], "devices": devices_digest(owners)})(model)
    other = [SimDevice(0, "a", np.zeros((2, 4, 4, 3), np.uint8), np.zeros((1, 4, 4, 3), np.uint8))]
    remembered(evaluate, {"folds": [1, 2], "devices": devices_digest(other)})(model)
    # Assert: evaluated once per distinct input; a remembered result reads back whole, NaN included
    assert len(calls) == 4
    assert a["accuracy"] == b["accuracy"] and c["accuracy"] == pytest.approx(a["accuracy"] + 4)
    assert np.isnan(b["tar_at_far"]["1e-4"])


def test_lfw_through_a_fleet_camera_scores_the_captured_photos_and_the_clean_ones_beside(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: LFW stand-in folds whose scoring records the photos it is given
    from dataclasses import dataclass
    from types import SimpleNamespace

    import simulator.cross_device.evaluation as evaluation
    from facecore.align.geometry import ARCFACE_112
    from facecore.capture import get_capture

    @dataclass(frozen=True)
    class Folds:
        faces: np.ndarray
        subset: None = None

    photos = np.random.default_rng(0).integers(0, 255, (3, *ARCFACE_112.row_shape), dtype=np.uint8)
    seen: list[np.ndarray] = []

    def evaluate(data: Folds, embed: Any) -> Any:
        seen.append(data.faces)
        return SimpleNamespace(report=SimpleNamespace(accuracy=0.9, accuracy_std=0.0, auc=0.95, tar_at_far={"1e-3": 0.5}, extra={}))

    monkeypatch.setattr(evaluation, "load_lfw_faces", lambda *args, **kwargs: Folds(photos))
    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    # Execute
    result = evaluation.lfw_evaluator(Path("unused"), (6, 7), ARCFACE_112, capture="far")(torch.nn.Linear(1, 1))
    # Assert: the usual keys on the captured photos (fixed seed and stream), the clean photos' under `clean`
    expected = get_capture("far").capture(photos, ARCFACE_112, evaluation.LFW_CAPTURE_SEED, evaluation.LFW_CAPTURE_STREAM)
    np.testing.assert_array_equal(seen[0], expected)
    np.testing.assert_array_equal(seen[1], photos)
    assert result["accuracy"] == 0.9 and result["clean"] == {"accuracy": 0.9, "tar_at_far": {"1e-3": 0.5}, "tar_at_far_per_fold": None}
    assert "clean" in evaluation.EVALUATED


def test_owners_enroll_as_the_devices_did_and_the_camera_enrolled_figures_come_beside(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: two owners whose clean, captured and held-out photos embed to known directions
    from types import SimpleNamespace

    import simulator.cross_device.evaluation as evaluation

    def photos(value: int, n: int) -> np.ndarray:
        return np.full((n, 2, 2, 3), value, np.uint8)

    directions = {1: [1.0, 0.0], 2: [0.0, 1.0], 3: [1.0, 1.0], 4: [1.0, 0.05], 5: [0.05, 1.0]}
    devices = [
        SimDevice(0, "a", faces=photos(3, 2), held_out=photos(4, 1), clean=photos(1, 2)),  # captured photos all look alike (3)
        SimDevice(1, "b", faces=photos(3, 2), held_out=photos(5, 1), clean=photos(2, 2)),
    ]
    calibration = SimpleNamespace(faces=photos(1, 2), identities=np.array([0, 1]))
    calibration = SimpleNamespace(**vars(calibration), without=lambda people: calibration)
    monkeypatch.setattr(evaluation, "load_lfw_faces", lambda *args, **kwargs: calibration)
    monkeypatch.setattr(evaluation, "embed_faces", lambda model, faces: np.array([directions[int(f[0, 0, 0])] for f in faces]))
    monkeypatch.setattr(evaluation, "threshold_at_far", lambda impostor, far: 0.9)
    # Execute
    clean = evaluation.owner_evaluator(Path("unused"), None, devices, 0.99, 1e-3, enrolment="clean")(torch.nn.Linear(1, 1))  # type: ignore[arg-type]
    captured = evaluation.owner_evaluator(Path("unused"), None, devices, 0.99, 1e-3)(torch.nn.Linear(1, 1))  # type: ignore[arg-type]
    # Assert: clean templates tell the owners apart at 0.9; templates from the camera's look-alike photos do not
    assert clean["owners_recalibrated"]["genuine_accept"] == 1.0 and clean["owners_recalibrated"]["impostor_accept"] == 0.0
    assert clean["owners_camera_enrolled"]["owners_recalibrated"] == captured["owners_recalibrated"]
    assert captured["owners_recalibrated"]["impostor_accept"] == 0.0 and captured["owners_recalibrated"]["genuine_accept"] == 0.0
    assert clean["owners"]["threshold"] == 0.99 and "owners_camera_enrolled" not in captured
