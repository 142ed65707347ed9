"""Pretraining on synthetic faces: exact resume and a learning loss. Synthetic data never backs an accuracy claim."""
from pathlib import Path

import pytest
import torch

from facecore.data.faces import LabelledFaces
from facecore.data.synthetic import synthetic_faces
from facecore.errors import CheckpointError
from facecore.models.checkpoint import load_backbone
from pretrain.config import PretrainConfig
from pretrain.trainer import Pretrainer, lr_factor


def _data(identities: int = 6) -> LabelledFaces:
    faces, labels = synthetic_faces(identities, 6, seed=3)
    classes = tuple(f"syn:{i}" for i in range(identities))
    return LabelledFaces(faces, labels, classes, tuple(Path(f"{i}.png") for i in range(len(labels))), ())


def _config(**overrides: object) -> PretrainConfig:
    base = dict(backbone="mobilefacenet_s", epochs=2, batch=8, lr=0.05, warmup_epochs=0.5, workers=0, eval_every=0, max_steps_per_epoch=3)
    return PretrainConfig(**{**base, **overrides})  # type: ignore[arg-type]


def test_stopping_after_epoch_1_and_resuming_equals_a_straight_run(tmp_path: Path) -> None:
    # Prepare
    data = _data()
    straight = Pretrainer(_config(), data, tmp_path / "straight")
    # Execute
    straight.fit()
    stopped = Pretrainer(_config(epochs=2), data, tmp_path / "stopped")
    stopped.out.mkdir(parents=True)
    stopped.history.append(stopped.train_epoch())
    stopped.save_checkpoint()
    resumed = Pretrainer(_config(), data, tmp_path / "stopped")
    resumed.resume()
    resumed.fit()
    # Assert
    assert resumed.epoch == straight.epoch == 2
    for name, value in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert [round(h["loss"], 5) for h in resumed.history] == [round(h["loss"], 5) for h in straight.history]


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path: Path) -> None:
    # Prepare
    first = Pretrainer(_config(epochs=1), _data(), tmp_path)
    first.fit()
    # Execute / Assert
    with pytest.raises(CheckpointError, match="loss: checkpoint 'cosface' vs now 'arcface'"):
        Pretrainer(_config(epochs=1, loss="arcface"), _data(), tmp_path).resume()
    with pytest.raises(CheckpointError, match="identity list"):
        Pretrainer(_config(epochs=1), _data(identities=5), tmp_path).resume()


def test_training_lowers_the_loss_and_ships_a_loadable_backbone(tmp_path: Path) -> None:
    # Prepare
    trainer = Pretrainer(_config(epochs=4, max_steps_per_epoch=4, lr=0.02), _data(), tmp_path)
    # Execute
    result = trainer.fit()
    model = load_backbone(result.backbone_path)
    # Assert
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert model.name == "mobilefacenet_s"
    torch.testing.assert_close(model.state_dict()["head.linear.weight"], trainer.model.state_dict()["head.linear.weight"])
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 4


def test_warmup_then_cosine_schedule() -> None:
    # Prepare
    config = _config(epochs=10, warmup_epochs=1)
    # Execute
    factors = [lr_factor(config, step, 10) for step in (0, 9, 10, 55, 99)]
    # Assert
    assert factors[0] == pytest.approx(0.1) and factors[1] == pytest.approx(1.0)
    assert factors[2] == pytest.approx(1.0) and factors[3] == pytest.approx(0.5, abs=0.02) and factors[4] < 0.01


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="lr must be > 0; loss must be cosface or arcface"):
        PretrainConfig(lr=0, loss="softmax")
