"""Distillation on synthetic faces and a tiny random teacher: view consistency, losses, cache reuse,
exact resume. Synthetic data never backs an accuracy claim."""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from facecore.align.geometry import ARCFACE_112, scaled_arcface
from facecore.align.template import ARCFACE_TEMPLATE, apply_transform, similarity_transform
from facecore.data.synthetic import synthetic_faces
from facecore.errors import CheckpointError
from pretrain.distill import DistillData, Distiller, init_targets, unseen_people_tar
from pretrain.distill_config import DistillConfig
from pretrain.distill_loss import centered_cosine_distance, cosine_distance, procrustes_rotation, relational_loss
from pretrain.distill_views import Photo, View, ViewJitter, build_view_cache, draw_view, view_crops

TEACHER_GEOMETRY = scaled_arcface(150, scale=1.1, shift_y=15.0)  # a dlib-like crop: another size, scale and offset


class TinyTeacher(nn.Module):
    """A random teacher with its own 64px geometry that counts the faces it embeds."""

    name, embedding_dim = "tiny-teacher", 16

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.geometry = scaled_arcface(64, scale=1.1, shift_y=5.0)
        self.conv = nn.Conv2d(3, 8, 5, stride=4)
        self.fc = nn.Linear(8 * 16, self.embedding_dim)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += len(x)
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 4).flatten(1))


def _photos(identities: int = 4, per_identity: int = 2) -> list[Photo]:
    faces, labels = synthetic_faces(identities, per_identity, seed=5, size=144)
    landmarks = ARCFACE_TEMPLATE * (144 / 112)
    return [Photo(f"{i:064x}", int(labels[i]), landmarks, partial(faces.__getitem__, i)) for i in range(len(labels))]


def _data(tmp_path: Path, teacher: nn.Module | None = None, views: int = 2) -> DistillData:
    photos = _photos()
    cache = build_view_cache(photos, teacher or TinyTeacher(), "tiny-teacher", ARCFACE_112, tmp_path / "cache", views=views, progress=False)
    return DistillData(cache, np.array([p.label for p in photos]), tuple(f"syn:{i}" for i in range(4)))


def _config(**overrides: object) -> DistillConfig:
    base = dict(
        backbone="mobilefacenet_s", embedding_dim=16, init="random", epochs=2, batch=4, lr=0.05, warmup_epochs=0.5, workers=0,
        eval_every=0, views=2, relational_weight=1.0, cosface_weight=0.1,
    )
    return DistillConfig(**{**base, **overrides})  # type: ignore[arg-type]


def _dot_centre(crop: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero((crop[..., 0] > 200) & (crop[..., 1] < 60) & (crop[..., 2] < 60))
    return np.array([xs.mean(), ys.mean()])


def test_teacher_and_student_crops_of_a_view_show_the_same_face_region() -> None:
    # Prepare: a grey image with a red dot off the landmarks, and the fixed map student crop -> teacher crop
    image = np.full((220, 200, 3), 128, np.uint8)
    image[118:123, 128:133] = (255, 0, 0)  # centre (130, 120)
    landmarks = np.array([[80.0, 95.0], [122.0, 97.0], [100.0, 120.0], [84.0, 142.0], [118.0, 143.0]])
    student_to_teacher = similarity_transform(ARCFACE_112.points, TEACHER_GEOMETRY.points)
    jitter = ViewJitter(rotation_deg=10, scale=0.08, shift_px=4, flip=True)
    positions, flips = [], []
    for view in range(12):
        # Execute
        drawn = draw_view(7, "ab" * 32, view, jitter)
        teacher_crop, student_crop = view_crops(image, landmarks, drawn, (TEACHER_GEOMETRY, ARCFACE_112), ARCFACE_112)
        in_student, in_teacher = _dot_centre(student_crop), _dot_centre(teacher_crop)
        if drawn.flip:  # both crops are mirrored together: compare in unmirrored coordinates
            in_student[0], in_teacher[0] = 111 - in_student[0], 149 - in_teacher[0]
        # Assert: the dot lands where the templates' own relation says, whatever the jitter
        np.testing.assert_allclose(apply_transform(student_to_teacher, in_student), in_teacher, atol=1.0)
        positions.append(in_student)
        flips.append(drawn.flip)
    # Assert: the views really differ (the dot moves by several pixels) and some are mirrored
    assert np.ptp(np.array(positions), axis=0).max() > 4
    assert any(flips) and not all(flips)
    assert draw_view(7, "ab" * 32, 3, jitter) == draw_view(7, "ab" * 32, 3, jitter)


def test_losses_are_zero_when_the_student_equals_the_teacher_and_positive_otherwise() -> None:
    # Prepare
    torch.manual_seed(0)
    teacher = torch.randn(12, 16)
    rotation = torch.linalg.qr(torch.randn(16, 16))[0]
    # Execute / Assert
    assert cosine_distance(3.0 * teacher, teacher).item() == pytest.approx(0.0, abs=1e-6)
    assert relational_loss(3.0 * teacher, teacher).item() == pytest.approx(0.0, abs=1e-6)
    assert relational_loss(teacher @ rotation, teacher).item() == pytest.approx(0.0, abs=1e-6)  # rotation-blind
    assert cosine_distance(torch.randn(12, 16), teacher).item() > 0.5
    assert relational_loss(torch.randn(12, 16), teacher).item() > 0.01


def test_the_centred_distance_sees_past_a_direction_every_face_shares() -> None:
    # Prepare: teacher and student agree on a large common direction and disagree on what tells faces apart
    torch.manual_seed(1)
    common = 5.0 * torch.nn.functional.normalize(torch.randn(1, 16), dim=1)
    teacher, student = common + 0.3 * torch.randn(64, 16), common + 0.3 * torch.randn(64, 16)
    center = torch.nn.functional.normalize(teacher, dim=1).mean(0)

    # Execute
    plain, centred = cosine_distance(student, teacher).item(), centered_cosine_distance(student, teacher, center).item()

    # Assert
    assert centered_cosine_distance(2.0 * teacher, teacher, center).item() == pytest.approx(0.0, abs=1e-6)
    assert plain < 0.1
    assert centred > 10 * plain


def test_procrustes_turns_the_teacher_space_onto_the_student_space() -> None:
    # Prepare
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(200, 16)).astype(np.float32)
    teacher /= np.linalg.norm(teacher, axis=1, keepdims=True)
    turn = np.linalg.qr(rng.normal(size=(16, 16)))[0].astype(np.float32)
    # Execute
    rotation = procrustes_rotation(teacher @ turn.T, teacher)
    # Assert
    np.testing.assert_allclose(teacher @ rotation.T, teacher @ turn.T, atol=1e-4)


def test_the_view_cache_is_built_once_and_reused(tmp_path: Path) -> None:
    # Prepare
    teacher = TinyTeacher()
    # Execute
    first = _data(tmp_path, teacher, views=3)
    calls = teacher.calls
    second = _data(tmp_path, teacher, views=3)
    other_seed = build_view_cache(_photos(), teacher, "tiny-teacher", ARCFACE_112, tmp_path / "cache", views=3, seed=1, progress=False)
    # Assert
    assert calls == 8 * 3 and teacher.calls == calls + 8 * 3  # the second open called nothing; a new seed did
    assert second.cache.folder == first.cache.folder != other_seed.folder
    np.testing.assert_array_equal(np.asarray(second.cache.teacher), np.asarray(first.cache.teacher))
    assert second.cache.student.shape == (24, 112, 112, 3) and second.cache.teacher.shape == (24, 16)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(first.cache.teacher), axis=1), 1.0, atol=1e-5)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")] == []  # no unfinished folders


def _student_crop(photo: Photo, view: View) -> np.ndarray:
    image = photo.load()
    assert image is not None
    return view_crops(image, photo.landmarks, view, (ARCFACE_112,), ARCFACE_112)[0].astype(np.float32)


def test_blended_views_mix_two_photos_in_both_crops_and_leave_plain_views_as_they_were(tmp_path: Path) -> None:
    # Prepare: the same photos cached with and without blends
    teacher, photos = TinyTeacher(), _photos()
    plain = build_view_cache(photos, teacher, "tiny-teacher", ARCFACE_112, tmp_path / "cache", views=4, progress=False)
    # Execute
    mixed = build_view_cache(photos, teacher, "tiny-teacher", ARCFACE_112, tmp_path / "cache", views=4, jitter=ViewJitter(mix=1.0), progress=False)
    reordered = build_view_cache(photos[::-1], teacher, "tiny-teacher", ARCFACE_112, tmp_path / "cache", views=4, jitter=ViewJitter(mix=1.0), progress=False)
    # Assert: view 0 is the photo itself; every jittered view is the pixel blend its draw names, of the same jitter
    assert mixed.folder != plain.folder
    for index, photo in enumerate(photos):
        for v in range(4):
            row, drawn = index * 4 + v, draw_view(0, photo.key, v, ViewJitter(mix=1.0))
            assert replace(drawn, own=1.0, partner_draw=0.0) == draw_view(0, photo.key, v, ViewJitter())  # blends do not move the jitter
            if v == 0:
                np.testing.assert_array_equal(mixed.student[row], plain.student[row])
                continue
            assert 0 <= drawn.own < 1
            own = _student_crop(photo, drawn)
            others = [_student_crop(p, drawn) for p in photos if p is not photo]
            errors = [np.abs(drawn.own * own + (1 - drawn.own) * o - mixed.student[row]).max() for o in others]
            assert min(errors) <= 0.5  # one other photo, blended at the drawn weight, rounded to uint8
            np.testing.assert_array_equal(reordered.student[(len(photos) - 1 - index) * 4 + v], mixed.student[row])
    # Assert: the teacher embedded the blends, not the plain views
    assert np.abs(np.asarray(mixed.teacher) - np.asarray(plain.teacher))[1::4].max() > 1e-3
    with pytest.raises(ValueError, match="no label"):
        _config(mix=0.5, cosface_weight=0.1)


@pytest.mark.parametrize("recipe", [{}, {"optimizer": "adamw", "lr": 1e-3, "centered": True}], ids=["sgd", "adamw-centred"])
def test_stopping_after_epoch_1_and_resuming_equals_a_straight_run(tmp_path: Path, recipe: dict[str, object]) -> None:
    # Prepare
    data = _data(tmp_path)
    rotation, head, _ = init_targets(Distiller(_config(**recipe), data, tmp_path / "probe").model, data, rotate=True)
    straight = Distiller(_config(**recipe), data, tmp_path / "straight", init_head=head, rotation=rotation)
    # Execute
    straight.fit()
    stopped = Distiller(_config(**recipe), data, tmp_path / "stopped", init_head=head, rotation=rotation)
    stopped.out.mkdir(parents=True)
    stopped.history.append(stopped.train_epoch())
    stopped.save_checkpoint()
    resumed = Distiller(_config(**recipe), data, tmp_path / "stopped")  # no rotation given: it must come from the checkpoint
    resumed.resume()
    resumed.fit()
    # Assert
    assert resumed.epoch == straight.epoch == 2
    np.testing.assert_array_equal(resumed.rotation, straight.rotation)
    for name, value in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert [round(h["loss"], 5) for h in resumed.history] == [round(h["loss"], 5) for h in straight.history]
    with pytest.raises(CheckpointError, match="relational_weight"):
        Distiller(_config(**recipe, relational_weight=2.0), data, tmp_path / "stopped").resume()


def test_distillation_lowers_the_loss_and_keeps_the_best_epoch(tmp_path: Path) -> None:
    # Prepare: a fake monitor that prefers epoch 2
    data = _data(tmp_path)
    scores = iter([0.6, 0.8, 0.7])
    trainer = Distiller(
        _config(epochs=3, relational_weight=0.0, cosface_weight=0.0, warmup_epochs=0), data, tmp_path / "run",
        evaluate=lambda model: {"lfw_1_5_accuracy": next(scores)},
    )
    trainer.config.__dict__["eval_every"] = 1  # frozen dataclass: test-only override
    # Execute
    result = trainer.fit()
    # Assert
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert best["meta"]["epoch"] == 2 and (tmp_path / "run" / "backbone.pt").is_file()


def test_unseen_people_tar_counts_each_person_once() -> None:
    # Prepare: random faces, so impostor pairs and "big"'s 780 genuine pairs score alike (rejected at
    # FAR 1e-3), and "small", whose two photos are the same face (its one pair accepted)
    rng = np.random.default_rng(0)
    embeddings = np.concatenate([rng.normal(size=(2040, 64)), np.tile(rng.normal(size=(1, 64)), (2, 1))])
    identities = np.array([f"s{i}" for i in range(2000)] + ["big"] * 40 + ["small"] * 2)
    # Execute
    tar = unseen_people_tar(embeddings, identities)
    # Assert: each person weighs one half; pooled over pairs, "small" would be 1 pair in 781
    assert 0.49 <= tar <= 0.51


def test_stage_matching_pulls_a_cuts_stream_towards_the_teachers_and_needs_its_stages(tmp_path: Path) -> None:
    # Prepare: a random dlib ResNet as the teacher of its own cut (their crops: the view cache's 112 px student
    # crops, which both embed); the same recipe with and without the stage term
    from facecore.models.dlib_resnet import DlibResNet
    from facecore.models.preprocess import faces_to_tensor
    from pretrain.distill_loss import stage_loss
    from pretrain.teacher_cut import StageTeacher, cut_with_stages

    torch.manual_seed(3)
    teacher = DlibResNet().eval()
    data = _data(tmp_path, teacher=teacher)
    student, ends = cut_with_stages(teacher, data.first_views(), 0.25, "short", refit_head=False)
    stages = StageTeacher(teacher, ends)
    x = faces_to_tensor(data.first_views())

    def stage_loss_after(weight: float) -> float:
        config = _config(backbone=student.name, embedding_dim=128, init="cut", stage_weight=weight, relational_weight=0.0,
                         cosface_weight=0.0, optimizer="adamw", lr=3e-3, epochs=3, warmup_epochs=0)
        trainer = Distiller(config, data, tmp_path / f"stage{weight}", init_state=student.state_dict(), stages=stages if weight else None)
        trainer.fit()
        maps: dict[int, torch.Tensor] = {}
        blocks = cast(nn.Sequential, trainer.model.blocks)
        hooks = [blocks[e.student_block].register_forward_hook(lambda _m, _i, out, key=e.student_block: maps.__setitem__(key, out)) for e in ends]
        with torch.no_grad():
            trainer.model(x)
        for hook in hooks:
            hook.remove()
        return float(stage_loss([maps[e.student_block] for e in ends], stages.maps(x)))

    # Execute
    with_stages, without = stage_loss_after(10.0), stage_loss_after(0.0)

    # Assert
    assert with_stages < 0.8 * without
    with pytest.raises(ValueError, match="stage weight needs the teacher's stages"):
        Distiller(_config(backbone=student.name, embedding_dim=128, init="cut", stage_weight=1.0), data, tmp_path / "other")
    with pytest.raises(ValueError, match="init 'cut'"):
        _config(stage_weight=1.0)
