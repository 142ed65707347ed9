from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pytest
import torch

from facecore.models.dlib_cut import DEPTHS, cut_name, cut_shape
from facecore.models.dlib_resnet import DlibResNet, ResidualBlock
from facecore.models.preprocess import faces_to_tensor
from pretrain.distill_loss import stage_loss
from pretrain.teacher_cut import CRITERIA, Criterion, StageTeacher, cut_from_teacher, cut_with_stages


def _faces(n: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 150, 150, 3), dtype=np.uint8)


@torch.no_grad()
def _teacher_with_dead_channels(width: float, depth: str, seed: int = 0, inner: float | None = None) -> DlibResNet:
    """A random dlib ResNet in which exactly the channels a `width`/`depth`/`inner` cut removes carry nothing:
    their filters and biases are zero (positive, live ones elsewhere), and each dropped block's residual
    branch is zero. Such a teacher computes the same function as its cut, if the cut picks the live ones."""
    torch.manual_seed(seed)
    teacher = DlibResNet().eval()
    shape = cut_shape(width, depth, inner)
    generator = torch.Generator().manual_seed(seed)

    def live(total: int, keep: int, start: int = 0) -> torch.Tensor:
        return torch.randperm(total - start, generator=generator)[:keep] + start

    def silence(conv: torch.nn.Conv2d, alive: torch.Tensor) -> None:
        dead = torch.ones(conv.out_channels, dtype=torch.bool)
        dead[alive] = False
        conv.weight[dead] = 0
        assert conv.bias is not None
        conv.bias[dead] = 0
        conv.bias[~dead] = 0.05  # live channels carry signal, so an energy or L1 ranking sees them

    stream = live(32, shape.stem_channels)
    silence(teacher.stem.conv, stream)
    kept = iter(shape.blocks)
    for block, name in zip(cast(Sequence[ResidualBlock], teacher.blocks), [b.name for b in teacher.shape.blocks]):
        if name in DEPTHS[depth]:
            silence(block.conv2, torch.tensor([], dtype=torch.long))
            continue
        cut = next(kept)
        grown = cut.out_channels - len(stream)
        stream = torch.cat([stream, live(block.conv2.out_channels, grown, block.conv1.in_channels)]) if grown else stream
        silence(block.conv1, live(block.conv1.out_channels, cut.mid_channels))
        silence(block.conv2, stream)
    return teacher


@pytest.mark.parametrize("criterion", CRITERIA)
@pytest.mark.parametrize(
    ("width", "depth", "inner"),
    [(0.5, "full", None), (0.375, "short", None), (1.0, "full", 0.375), (0.75, "short", 0.5625), (0.875, "short-last", 0.625)],
)
def test_a_cut_of_a_teacher_whose_other_channels_are_dead_computes_the_teachers_embeddings(
    width: float, depth: str, inner: float | None, criterion: Criterion,
) -> None:
    # Prepare
    teacher = _teacher_with_dead_channels(width, depth, inner=inner)
    faces = _faces()

    # Execute
    student = cut_from_teacher(teacher, faces, width, depth, criterion, refit_head=False, inner_width=inner)

    # Assert
    with torch.no_grad():
        expected, got = teacher(faces_to_tensor(faces)), student(faces_to_tensor(faces))
    assert student.name == cut_name(width, depth, inner)
    assert [b.mid_channels for b in student.shape.blocks] == [b.mid_channels for b in cut_shape(width, depth, inner).blocks]
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_full_width_cut_is_the_teacher() -> None:
    # Prepare
    torch.manual_seed(1)
    teacher = DlibResNet().eval()
    faces = _faces(4, seed=1)

    # Execute
    student = cut_from_teacher(teacher, faces, 1.0, refit_head=False)

    # Assert
    with torch.no_grad():
        assert torch.equal(student(faces_to_tensor(faces)), teacher(faces_to_tensor(faces)))


def test_a_removed_channels_mean_is_folded_into_the_bias_of_what_read_it() -> None:
    # Prepare: two teachers alike but for their removed stem channels, constant 0.3 in one and zero in the
    # other; the head reads neither, so the convolutions that read them are the only way they matter
    constant, silent = (_teacher_with_dead_channels(0.5, "full", seed=2) for _ in range(2))
    with torch.no_grad():
        stem_bias = constant.stem.conv.bias
        assert stem_bias is not None
        dead = torch.nonzero(stem_bias == 0).flatten()
        stem_bias[dead] = 0.3
        for teacher in (constant, silent):
            teacher.head.fc.weight[:, dead] = 0
    x = faces_to_tensor(_faces(6, seed=2))

    # Execute: the first cut folds the constant into biases; the second has nothing to fold
    folded, unfolded = (cut_from_teacher(teacher, _faces(6, seed=2), 0.5, "full", "l1", refit_head=False) for teacher in (constant, silent))

    # Assert: the same kept weights, but only the folded cut computes what its teacher does (up to the borders,
    # where a padded convolution sees less of the constant)
    with torch.no_grad():
        target = constant(x)
        folded_error, unfolded_error = (folded(x) - target).norm() / target.norm(), (unfolded(x) - target).norm() / target.norm()
    first_folded, first_unfolded = (cast(ResidualBlock, model.blocks[0]) for model in (folded, unfolded))
    assert torch.equal(first_folded.conv1.weight, first_unfolded.conv1.weight)
    assert unfolded_error > 0.1
    assert folded_error < unfolded_error / 5


def test_the_refitted_head_brings_a_lossy_cut_closer_to_the_teacher() -> None:
    # Prepare: a random teacher, so a cut of it loses real signal
    torch.manual_seed(3)
    teacher = DlibResNet().eval()
    faces = _faces(160, seed=3)
    x = faces_to_tensor(faces)

    # Execute
    kept, refitted = (cut_from_teacher(teacher, faces, 0.25, "short", "energy", refit_head=refit) for refit in (False, True))

    # Assert
    with torch.no_grad():
        target = teacher(x)
        kept_error, refitted_error = ((model(x) - target).norm() / target.norm() for model in (kept, refitted))
    assert refitted_error < 0.8 * kept_error


def test_only_the_full_teacher_is_cut() -> None:
    # Prepare
    cut = DlibResNet(shape=cut_shape(0.5))

    # Execute / Assert
    with pytest.raises(ValueError, match="cuts the full dlib ResNet"):
        cut_from_teacher(cut, _faces(2), 0.5)


@pytest.mark.parametrize(("width", "depth", "names"), [
    (0.5, "full", [("conv32_3", "conv32_3"), ("conv64_3", "conv64_3"), ("conv128_2", "conv128_2"), ("conv256_2", "conv256_2")]),
    (0.375, "short", [("conv32_2", "conv32_3"), ("conv64_2", "conv64_3"), ("conv128_1", "conv128_2"), ("conv256_1", "conv256_2")]),
    (0.875, "short-last", [("conv32_3", "conv32_3"), ("conv64_3", "conv64_3"), ("conv128_2", "conv128_2"), ("conv256_1", "conv256_2")]),
])
def test_the_cuts_stream_at_each_stage_end_is_the_teachers_at_the_channels_it_kept(width: float, depth: str, names: list[tuple[str, str]]) -> None:
    # Prepare: a teacher whose removed channels carry nothing, so its cut computes its stream exactly
    teacher = _teacher_with_dead_channels(width, depth)
    faces = _faces()
    x = faces_to_tensor(faces)

    # Execute
    student, ends = cut_with_stages(teacher, faces, width, depth, "energy", refit_head=False)
    maps: dict[int, torch.Tensor] = {}
    blocks = cast(torch.nn.Sequential, student.blocks)
    hooks = [blocks[end.student_block].register_forward_hook(lambda _m, _i, out, key=end.student_block: maps.__setitem__(key, out)) for end in ends]
    with torch.no_grad():
        student(x)
    for hook in hooks:
        hook.remove()
    expected = StageTeacher(teacher, ends).maps(x)
    got = [maps[end.student_block] for end in ends]

    # Assert: the stage ends pair the blocks before each down block; the cut's streams are the teacher's, and the
    # loss is zero for them and not for a stream that differs
    assert [(student.shape.blocks[e.student_block].name, teacher.shape.blocks[e.teacher_block].name) for e in ends] == names
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.shape == theirs.shape and theirs.abs().max() > 0
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert stage_loss(got, expected) < 1e-8
    assert stage_loss([2 * m for m in got], expected) == pytest.approx(1.0, rel=1e-4)
