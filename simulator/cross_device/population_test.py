"""A fleet camera takes every device photo, the same way in every arm of one seed, and a run on them trains."""
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from device_sdk.training import LocalTrainingConfig, train_local
from facecore.align.geometry import ARCFACE_112
from facecore.capture import get_capture
from facecore.data.synthetic import synthetic_faces
from facecore.models.preprocess import embed_faces
from facecore.templates import mean_feature_embedding
from simulator.cross_device.config import CrossDeviceConfig
from simulator.cross_device.engine import CrossDeviceSimulation
from simulator.cross_device.population import DEVICE_STREAM, Population, SimDevice, captured


def _population(devices: int = 3) -> Population:
    """Synthetic owners with 3 photos to train on and 1 held out each."""
    faces, labels = synthetic_faces(devices, 4, seed=3)
    owners = (SimDevice(i, f"syn:{i}", faces[labels == i][:3], faces[labels == i][3:]) for i in range(devices))
    return Population(tuple(owners), devices, 0)


def test_every_device_photo_is_captured_from_the_seed_and_its_own_stream() -> None:
    # Prepare
    clean = _population()
    # Execute
    first, again = captured(clean, "far", ARCFACE_112, seed=5), captured(clean, "far", ARCFACE_112, seed=5)
    other_seed = captured(clean, "far", ARCFACE_112, seed=6)
    # Assert: repeatable per seed, the seed matters, and each set of photos draws from its own stream
    camera = get_capture("far")
    for device, again_device, other, plain in zip(first.devices, again.devices, other_seed.devices, clean.devices, strict=True):
        assert device.held_out is not None and plain.held_out is not None
        np.testing.assert_array_equal(device.faces, again_device.faces)
        np.testing.assert_array_equal(device.faces, camera.capture(plain.faces, ARCFACE_112, 5, DEVICE_STREAM + 2 * plain.index))
        np.testing.assert_array_equal(device.held_out, camera.capture(plain.held_out, ARCFACE_112, 5, DEVICE_STREAM + 2 * plain.index + 1))
        assert not np.array_equal(device.faces, other.faces)
        assert device.identity == plain.identity and device.faces.shape == plain.faces.shape


def test_a_run_through_a_fleet_camera_trains_and_resumes_a_checkpoint_from_before_captures(
        tmp_path: Path, calibrated_backbone: Callable[..., torch.nn.Module]) -> None:
    # Prepare: the captured population of a seed, a config naming the camera, and an older checkpoint without it
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    config = CrossDeviceConfig(devices=3, rounds=1, per_round=2, eval_every=1, method="fedavg", capture="lowlight-ir",
                               local=LocalTrainingConfig(epochs=1, steps=1, batch=4, lr=0.01))
    population = captured(_population(), "lowlight-ir", ARCFACE_112, config.seed)
    plain = dataclasses.replace(config, capture=None)
    CrossDeviceSimulation(plain, _population(), model, tmp_path / "old").run(resume=False)
    saved = torch.load(tmp_path / "old" / "checkpoint.pt", weights_only=True)
    del saved["config"]["capture"]
    torch.save(saved, tmp_path / "old" / "checkpoint.pt")
    # Execute
    state = CrossDeviceSimulation(config, population, model, tmp_path / "new").run(resume=False)
    resumed = CrossDeviceSimulation(dataclasses.replace(plain, rounds=2), _population(), model, tmp_path / "old").run(resume=True)
    # Assert: the devices trained on grey crops and moved the backbone; the old run went on without a camera
    assert all(np.array_equal(d.faces[..., 0], d.faces[..., 2]) for d in population.devices)
    assert state.round == 1 and any(not torch.equal(v, model.state_dict()[k]) for k, v in state.model_state.items())
    assert resumed.round == 2


def test_an_unknown_capture_is_refused_naming_the_choices() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="capture must be one of lowlight-ir, far"):
        CrossDeviceConfig(capture="webcam")


def test_a_clean_enrolment_starts_each_template_from_the_photos_before_the_camera_and_devices_keep_it(
        calibrated_backbone: Callable[..., torch.nn.Module]) -> None:
    # Prepare: a captured fleet whose devices enrolled clean and do not train their template
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    clean = _population()
    fleet = captured(clean, "lowlight-ir", ARCFACE_112, seed=0)
    config = CrossDeviceConfig(devices=3, rounds=1, per_round=3, eval_every=1, spreadout=False, capture="lowlight-ir", enrolment="clean",
                               local=LocalTrainingConfig(epochs=2, batch=2, lr=0.05, train_embedding=False))
    simulation = CrossDeviceSimulation(config, fleet, model, Path("unused"))
    # Execute
    start = simulation.initial_templates()[0]
    update = train_local(model, start[0], fleet.devices[0].faces, config.local)
    # Assert: the clean photos kept beside the captured ones are the templates' source; training leaves the template be
    for device, plain in zip(fleet.devices, clean.devices, strict=True):
        assert device.clean is plain.faces and not np.array_equal(device.faces, plain.faces)
    expected = np.stack([mean_feature_embedding(embed_faces(model, d.faces)) for d in clean.devices])
    np.testing.assert_allclose(start, expected, atol=1e-6)
    np.testing.assert_allclose(update.embedding.numpy(), start[0], atol=1e-6)
    assert update.loss_after < update.loss_before


def test_a_clean_enrolment_needs_a_camera_and_a_centre_a_known_source() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="enrolment clean needs a capture"):
        CrossDeviceConfig(enrolment="clean")
    with pytest.raises(ValueError, match="center_source must be lfw, celeba or model"):
        CrossDeviceConfig(center_features=True, center_source="web")


@pytest.mark.parametrize("workers", [1, 2])
def test_devices_that_train_their_enrolment_train_its_clean_photos_and_the_cameras(
        calibrated_backbone: Callable[..., torch.nn.Module], tmp_path: Path, workers: int) -> None:
    # Prepare: a captured fleet enrolled clean, run once on the camera's photos only and once also on the enrolment's
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    fleet = captured(_population(), "lowlight-ir", ARCFACE_112, seed=0)
    settings: dict[str, Any] = {"devices": 3, "rounds": 1, "per_round": 3, "eval_every": 1, "spreadout": False, "capture": "lowlight-ir",
                "enrolment": "clean", "workers": workers, "local": LocalTrainingConfig(batch=2, trainable_blocks=1, train_embedding=False)}
    runs = {}
    for trained in (False, True):
        # Execute
        runs[trained] = CrossDeviceSimulation(CrossDeviceConfig(**settings, train_enrolment=trained), fleet, model, tmp_path / str(trained))
        try:
            runs[trained].run(resume=False)
        finally:
            runs[trained].close()
    # Assert: each device's prefix activations cover its clean photos too, and the round trains on them
    for device in fleet.devices:
        assert device.clean is not None
        assert len(runs[False].caches[device.index].plain) == len(device.faces)
        assert len(runs[True].caches[device.index].plain) == len(device.faces) + len(device.clean)
    alone, both = runs[False].model.state_dict(), runs[True].model.state_dict()
    assert any(not torch.equal(alone[k], both[k]) for k in alone)
    with pytest.raises(ValueError, match="train_enrolment needs enrolment clean"):
        CrossDeviceConfig(capture="lowlight-ir", train_enrolment=True)
