"""The personalised-verifier experiment: photo split, pooled owner-vs-others scores, the report."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from facecore.data.synthetic import synthetic_faces
from facecore.models import get_backbone
from simulator.fusion.config import FusionInputError
from simulator.fusion.faces import FaceFusionConfig, accept_rates, markdown_table, pooled_scores, run_face_fusion, split_photos


def test_split_photos_enrolls_the_first_half_and_holds_out_the_rest() -> None:
    # Prepare
    faces = np.arange(7)[:, None, None, None] * np.ones((7, 2, 2, 3), np.uint8)
    # Execute
    device = split_photos("ann", faces, np.random.default_rng(0))
    # Assert: 4 enroll, 3 held out, together every photo once
    assert len(device.enroll) == 4 and len(device.held_out) == 3
    assert sorted(int(f[0, 0, 0]) for f in [*device.enroll, *device.held_out]) == list(range(7))
    with pytest.raises(FusionInputError, match="2 photos"):
        split_photos("bob", faces[:1], np.random.default_rng(0))


def test_pooled_scores_pair_each_template_with_its_own_photos_as_genuine() -> None:
    # Prepare: device 0 holds two photos, device 1 one; templates are the axes
    templates = np.eye(2)
    held = [np.array([[1.0, 0.0], [0.6, 0.8]]), np.array([[0.0, 1.0]])]
    # Execute
    genuine, impostor = pooled_scores(templates, held)
    # Assert: genuine = own photos · own template; impostor = the other device's photos
    np.testing.assert_allclose(np.sort(genuine), [0.6, 1.0, 1.0])
    np.testing.assert_allclose(np.sort(impostor), [0.0, 0.0, 0.8])


def test_the_experiment_scores_every_method_on_every_held_out_photo(tmp_path: Path) -> None:
    # Prepare: 4 synthetic devices (no accuracy claim), a random small backbone
    torch.manual_seed(0)
    faces, labels = synthetic_faces(4, 5, seed=3)
    rng = np.random.default_rng(0)
    devices = [split_photos(f"p{k}", faces[labels == k], rng) for k in range(4)]
    config = FaceFusionConfig(devices=4, fusions=("none", "multi"), epochs=1)
    # Execute
    report = run_face_fusion(config, devices, get_backbone("mobilefacenet_s"), tmp_path, lambda _: None)
    # Assert
    held = sum(len(d.held_out) for d in devices)
    assert set(report["methods"]) == {"global", "none", "multi"}
    for method in report["methods"].values():
        assert method["genuine"] == held and method["impostor"] == held * 4 - held
        assert set(method["tar_at_far"]) == {"1e-2", "1e-3", "1e-4"}
    assert 0.0 <= report["methods"]["multi"]["fusion"]["lambda_mean"] <= 1.0
    assert json.loads((tmp_path / "face_fusion.json").read_text())["held_out_photos"] == held
    assert (tmp_path / "owner_vs_others_roc.png").stat().st_size > 0
    assert markdown_table(report).count("\n") == 4


def test_accept_rates_are_read_at_the_published_and_at_each_verifiers_own_threshold(tmp_path: Path) -> None:
    # Prepare: 4 synthetic devices, 300 synthetic "public" faces to set each verifier's own threshold
    torch.manual_seed(0)
    faces, labels = synthetic_faces(4, 5, seed=3)
    public, _ = synthetic_faces(300, 1, seed=4)
    rng = np.random.default_rng(0)
    devices = [split_photos(f"p{k}", faces[labels == k], rng) for k in range(4)]
    config = FaceFusionConfig(devices=4, fusions=("single",), epochs=1)
    # Execute: a global threshold above every cosine, and a FAR of 1e-3 that 300 faces cannot measure
    report = run_face_fusion(config, devices, get_backbone("mobilefacenet_s"), tmp_path, lambda _: None, threshold=1.01, calibration=public)
    # Assert: nobody passes 1.01; without a measurable threshold a verifier accepts nobody either
    assert report["methods"]["global"]["at_threshold"] == {"threshold": 1.01, "genuine_accept": 0.0, "impostor_accept": 0.0}
    own = report["methods"]["single"]["at_own_threshold"]
    assert own["public_faces"] == 300 and own["genuine_accept"] == 0.0 and own["impostor_accept"] == 0.0
    assert "0.00 / 0.000" in markdown_table(report)


def test_each_pair_is_judged_at_its_own_templates_threshold() -> None:
    # Prepare: two owners' verifiers with thresholds 0.5 and 0.9
    genuine, impostor = np.array([0.6, 0.95]), np.array([0.7, 0.8, 0.6])
    # Execute
    rates = accept_rates(genuine, impostor, np.array([0.5, 0.9]), np.array([0.5, 0.9, 0.9]))
    # Assert: 0.6 passes 0.5 and 0.95 passes 0.9; impostor 0.7 passes the first template's 0.5 only
    assert rates == {"genuine_accept": 1.0, "impostor_accept": 1 / 3}


def test_bad_settings_are_refused_in_one_message() -> None:
    with pytest.raises(FusionInputError, match="devices must be >= 2.*epochs must be >= 1"):
        FaceFusionConfig(devices=1, epochs=0)
    with pytest.raises(FusionInputError, match="fusions"):
        FaceFusionConfig(fusions=("average",))
