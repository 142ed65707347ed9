"""The personalised (fused) verifier: shapes, the λ box, the λ = 1 end point, the cohort term, its
own threshold and its torch-free file."""
import copy
import io
from collections.abc import Callable

import numpy as np
import pytest
import torch

from device_sdk.errors import NotEnrolled
from device_sdk.inference import OnnxEmbedder
from device_sdk.personal import (
    PersonalConfig,
    load_verifier,
    save_verifier,
    saved_model_version,
    train_personal_verifier,
)
from device_sdk.personal_file import read_personal
from device_sdk.training import LocalTrainingConfig
from facecore.data.synthetic import synthetic_faces
from facecore.fusion import LambdaFusion
from facecore.models.preprocess import faces_to_tensor


@pytest.fixture(scope="module")
def setup(calibrated_backbone: Callable[..., torch.nn.Module]) -> tuple[torch.nn.Module, np.ndarray, np.ndarray]:
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    faces, labels = synthetic_faces(6, 4, seed=5)
    return model, faces[labels < 3], faces[labels >= 3]


def _config(fusion: str, **training: object) -> PersonalConfig:
    return PersonalConfig(fusion, LocalTrainingConfig(**{"epochs": 3, "batch": 4, "trainable_blocks": 2, **training}))  # type: ignore[arg-type]


@pytest.mark.parametrize("fusion", ["none", "conv", "multi", "single"])
def test_embeddings_are_unit_rows_and_the_global_model_is_left_alone(setup, fusion: str) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, owner, others = setup
    before = copy.deepcopy(model.state_dict())
    # Execute
    verifier, report = train_personal_verifier(model, owner, _config(fusion), seed=1)
    embeddings = verifier.embed(others)
    # Assert
    assert embeddings.shape == (len(others), 128)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    assert verifier.score(others).shape == (len(others),)
    assert report.steps == 3 * 3 and report.loss_after < report.loss_before
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("fusion", ["multi", "single"])
def test_lambda_stays_in_the_unit_box_even_at_a_huge_learning_rate(setup, fusion: str) -> None:  # type: ignore[no-untyped-def]
    # Prepare: λ starts at 0, so the first steps push it below the box
    model, owner, _ = setup
    # Execute
    verifier, _ = train_personal_verifier(model, owner, _config(fusion, lr=50.0, momentum=0.0), seed=1)
    # Assert
    trained = verifier.fused.fusion
    assert isinstance(trained, LambdaFusion)
    lam = trained.lam.detach()
    assert lam.min() >= 0.0 and lam.max() <= 1.0


def test_lambda_one_is_exactly_the_global_model(setup) -> None:  # type: ignore[no-untyped-def]
    # Prepare: training from λ = 0.5 moves the local path; then λ is set to its upper end
    model, owner, others = setup
    config = PersonalConfig("single", LocalTrainingConfig(epochs=3, batch=4, trainable_blocks=2, lr=0.1), lambda_init=0.5)
    verifier, _ = train_personal_verifier(model, owner, config, seed=1)
    trained = verifier.fused.fusion
    assert isinstance(trained, LambdaFusion)
    with torch.no_grad():
        trained.lam.fill_(1.0)
        local_moved = not torch.allclose(verifier.fused.local(verifier.prefix_cache(others).plain), model(faces_to_tensor(others)))
        expected = torch.nn.functional.normalize(model(faces_to_tensor(others)), dim=1).numpy()
    # Execute
    fused = verifier.embed(others)
    # Assert
    assert local_moved
    np.testing.assert_allclose(fused, expected, atol=1e-5)


def test_a_public_cohort_pushes_impostors_away_from_the_owner_template(setup) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the same owner, trained without and with the other identities as the public cohort
    model, owner, others = setup
    config = PersonalConfig("none", LocalTrainingConfig(epochs=5, batch=4, trainable_blocks=2, lr=0.05), cohort_margin=0.0)
    # Execute
    plain, _ = train_personal_verifier(model, owner, config, seed=1)
    with_cohort, _ = train_personal_verifier(model, owner, config, seed=1, cohort=others)
    # Assert: the cohort faces now score lower against the owner's template
    assert with_cohort.score(others).mean() < plain.score(others).mean() - 0.01


def test_a_config_without_a_frozen_prefix_or_with_lambda_outside_the_box_is_refused() -> None:
    with pytest.raises(ValueError, match="trainable_blocks"):
        PersonalConfig("multi", LocalTrainingConfig(trainable_blocks=None))
    with pytest.raises(ValueError, match="lambda_init"):
        PersonalConfig("multi", lambda_init=1.5)
    with pytest.raises(ValueError, match="fusion must be one of"):
        PersonalConfig("average")


def test_the_saved_file_scores_like_torch_in_onnxruntime_and_loads_back(setup) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, owner, others = setup
    verifier, _ = train_personal_verifier(model, owner, _config("single"), seed=1)
    # Execute
    payload = save_verifier(verifier, "ab" * 32, calibrate_on_public=False)
    saved = read_personal(payload)
    loaded = load_verifier(payload, model)
    # Assert: the ONNX graph is the fused model; the torch parts and the template come back unchanged
    onnx = OnnxEmbedder(saved.onnx).embed(others)
    np.testing.assert_allclose(onnx / np.linalg.norm(onnx, axis=1, keepdims=True), verifier.embed(others), atol=1e-5)
    np.testing.assert_allclose(saved.template, verifier.template.numpy(), atol=1e-6)
    np.testing.assert_array_equal(loaded.embed(others), verifier.embed(others))
    assert saved_model_version(payload) == "ab" * 32 and saved.geometry == verifier.geometry and saved.threshold is None


def test_calibration_sets_the_threshold_at_the_far_over_impostors(setup) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 156 impostor faces of 39 other synthetic people, enough to measure a FAR of 1e-2
    model, _, _ = setup
    faces, labels = synthetic_faces(40, 4, seed=5)
    config = PersonalConfig("single", LocalTrainingConfig(epochs=3, batch=4, trainable_blocks=2), calibration_far=1e-2)
    # Execute
    verifier, report = train_personal_verifier(model, faces[labels == 0], config, seed=1, calibration=faces[labels > 0])
    # Assert: at most 1% of the impostors reach the threshold, and the figures say what it does
    threshold = report.threshold
    assert threshold is not None and threshold == verifier.threshold
    impostor = verifier.score(faces[labels > 0])
    assert threshold.impostors == 156
    assert threshold.impostor_far == pytest.approx((impostor >= threshold.threshold).mean())
    assert threshold.impostor_far <= 0.01 and (impostor >= threshold.threshold - 2e-4).mean() > threshold.impostor_far
    genuine = verifier.score(faces[labels == 0])
    assert threshold.genuine == 4
    assert threshold.genuine_accept == pytest.approx((genuine >= threshold.threshold).mean(), abs=1e-6)
    assert read_personal(save_verifier(verifier, "cd" * 32)).threshold == threshold


def test_too_few_impostors_for_the_far_give_no_threshold(setup) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 12 impostors cannot measure a FAR of 1e-3
    model, owner, others = setup
    # Execute
    verifier, report = train_personal_verifier(model, owner, _config("none"), seed=1, calibration=others)
    # Assert
    assert report.threshold is None and verifier.threshold is None


def test_an_earlier_file_loads_in_torch_and_is_refused_without(setup) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the earlier format, a bare torch file of the trained parts
    model, owner, others = setup
    verifier, _ = train_personal_verifier(model, owner, _config("conv"), seed=1)
    trained = {k: v for k, v in verifier.state_dict().items() if not k.startswith(("prefix.", "fused.global_."))}
    buffer = io.BytesIO()
    config = {"fusion": "conv", "trainable_blocks": 2}
    torch.save({"model_version": "ef" * 32, "config": config, "state_dict": trained}, buffer)
    legacy = buffer.getvalue()
    # Execute / Assert
    np.testing.assert_array_equal(load_verifier(legacy, model).embed(others), verifier.embed(others))
    assert saved_model_version(legacy) == "ef" * 32
    with pytest.raises(NotEnrolled, match="personalize again"):
        read_personal(legacy)
