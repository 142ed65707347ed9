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


def test_people_verification_scores_all_pairs_and_each_group_of_people_apart() -> None:
    # Prepare: 120 people with 3 photos each (about 2,500 impostor pairs a group), a person's photos close together
    from simulator.cross_device.evaluation import people_groups, people_verification

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((120, 64))
    identities = np.repeat(np.array([f"celeba:{i}" for i in range(120)]), 3)
    embeddings = np.repeat(centres, 3, axis=0) + 0.05 * rng.standard_normal((360, 64))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    groups = people_groups(identities)
    # Execute
    found = people_verification(embeddings, identities, groups)
    # Assert: every genuine pair above every impostor; 1e-4 per group unmeasurable (NaN)
    assert found["tar_at_far"]["1e-3"] == 1.0 and found["auc"] == 1.0 and found["eer"] == 0.0
    assert len(found["tar_at_far_per_group"]["1e-3"]) == len(set(groups)) and all(t == 1.0 for t in found["tar_at_far_per_group"]["1e-3"])
    assert all(np.isnan(t) for t in found["tar_at_far_per_group"]["1e-4"])


def test_celeba_public_people_are_scored_as_the_camera_takes_them_and_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a split whose public role holds two CelebA people and one LFW person
    from types import SimpleNamespace

    import simulator.cross_device.evaluation as evaluation
    from facecore.align.geometry import ARCFACE_112
    from facecore.capture import get_capture

    photos = np.random.default_rng(1).integers(0, 255, (4, *ARCFACE_112.row_shape), dtype=np.uint8)
    images = [SimpleNamespace(identity=i) for i in ("celeba:1", "celeba:1", "celeba:2", "celeba:2", "lfw:x")]
    manifest = SimpleNamespace(images=lambda role, root: images if role == "public" else [])
    asked: list[list[str]] = []

    def load(public: list[SimpleNamespace], aligner: Any, desc: str) -> Any:
        asked.append([image.identity for image in public])
        return SimpleNamespace(faces=photos, labels=np.array([0, 0, 1, 1]), classes=("celeba:1", "celeba:2"))

    embedded: list[np.ndarray] = []

    def embed(model: torch.nn.Module, faces: np.ndarray) -> np.ndarray:
        embedded.append(faces)
        return np.eye(4)[[0, 0, 1, 1]]

    monkeypatch.setattr(evaluation, "load_labelled_faces", load)
    monkeypatch.setattr(evaluation, "embed_faces", embed)
    # Execute
    found = evaluation.celeba_evaluator(Path("unused"), manifest, ARCFACE_112, "lowlight-ir")(torch.nn.Linear(1, 1))  # type: ignore[arg-type]
    # Assert: only the CelebA people; the captured view from its own fixed stream, the clean view unchanged
    assert asked == [["celeba:1", "celeba:1", "celeba:2", "celeba:2"]]
    expected = get_capture("lowlight-ir").capture(photos, ARCFACE_112, evaluation.LFW_CAPTURE_SEED, evaluation.CELEBA_CAPTURE_STREAM)
    np.testing.assert_array_equal(embedded[0], expected)
    np.testing.assert_array_equal(embedded[1], photos)
    assert set(found["celeba"]) == {"captured", "clean"} and found["celeba"]["clean"]["auc"] == 1.0
    assert "celeba" in evaluation.EVALUATED


def test_people_fall_into_the_same_group_every_time() -> None:
    # Prepare
    from simulator.cross_device.evaluation import PEOPLE_GROUPS, people_groups

    names = np.array([f"celeba:{i}" for i in range(200)])
    # Execute
    first, again = people_groups(names), people_groups(names[::-1])[::-1]
    # Assert: the group is a function of the name alone, and every group is used
    np.testing.assert_array_equal(first, again)
    assert set(first.tolist()) == set(range(PEOPLE_GROUPS))
