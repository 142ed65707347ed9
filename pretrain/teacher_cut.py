"""A student cut from the teacher itself: the dlib ResNet's own weights, keeping the channels that
matter most (`fedface pretrain --from-teacher default --width W`).

Invariants:
* The student's channels are a subset of the teacher's, in the teacher's order, and its weights are
  the teacher's weights at those channels: no weight is made up. Distillation then repairs only what
  the cut removed.
* The residual stream is cut consistently: a channel kept in a stage is kept in every later stage
  (a down block's shortcut carries channel j to channel j), and the channels a down block adds are
  chosen among the ones it adds in the teacher.
* A removed channel's mean activation on public faces is folded into the bias of each kept
  convolution that read it, so the cut changes each kept channel's mean as little as a constant can.
* A dropped block is an identity block: its input is already non-negative (a ReLU's output), so with
  its residual branch gone the block is exactly the identity and nothing else moves.
* The head is refitted (least squares, the teacher's embeddings from the cut's pooled features on the
  same public faces): the one layer whose best weights for the cut can be solved for exactly.
* A stage's stream is the same set of teacher channels at every block of the stage, so where a stage ends
  (the block before a down block) the cut's stream is comparable, channel for channel, with the teacher's at
  the channels it kept (`StageEnd`, `StageTeacher`): no regressor is needed to match the two.
* Criteria: `energy`, a channel's mean square activation on public faces (a block's inner channel
  weighted by the squared norm of the filters that read it); `l1`, the L1 norm of the filters that
  write the channel. Both are normalised per layer, so stages of different scale compare fairly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import torch
from torch import Tensor, nn

from facecore.models.dlib_cut import DEPTHS, build_cut
from facecore.models.dlib_resnet import TEACHER_SHAPE, DlibResNet, ResidualBlock
from facecore.models.preprocess import faces_to_tensor

Criterion = Literal["energy", "l1"]
CRITERIA: tuple[Criterion, ...] = ("energy", "l1")


@dataclass(frozen=True)
class Activations:
    """Per-channel mean and mean square over faces and positions: the stream after the stem and after
    every block, and every block's inner (post-ReLU) activation; and the teacher's embeddings."""

    stream_mean: list[Tensor]  # [stem, block 0, block 1, ...]
    stream_square: list[Tensor]
    inner_mean: list[Tensor]  # [block 0, block 1, ...]
    inner_square: list[Tensor]
    embeddings: Tensor  # (N, D), unnormalised, what the refitted head aims at


def _channel_moments(maps: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """Each map's per-channel sum over the batch of its spatial mean and of its spatial mean square."""
    area = [m.shape[2] * m.shape[3] for m in maps]
    return [m.sum((0, 2, 3)) / a for m, a in zip(maps, area)], [(m * m).sum((0, 2, 3)) / a for m, a in zip(maps, area)]


@torch.no_grad()
def teacher_activations(teacher: DlibResNet, faces: np.ndarray, batch: int = 64) -> Activations:
    """The statistics `energy`, the bias folding and the head refit need, from faces (N, s, s, 3) uint8,
    in one forward pass per batch (the inner activations are read through hooks, not recomputed)."""
    blocks = cast(Sequence[ResidualBlock], teacher.blocks)
    inner: list[Tensor] = []
    hooks = [block.conv1.register_forward_hook(lambda _module, _input, output: inner.append(torch.relu(output))) for block in blocks]
    totals: list[list[Tensor]] = []
    embeddings = []
    teacher.eval()
    try:
        for start in range(0, len(faces), batch):
            inner.clear()
            stream = [teacher.stem(faces_to_tensor(faces[start : start + batch]))]
            for block in blocks:
                stream.append(block(stream[-1]))
            embeddings.append(teacher.head(stream[-1]))
            moments = [*_channel_moments(stream), *_channel_moments(inner)]
            totals = moments if not totals else [[a + b for a, b in zip(old, new)] for old, new in zip(totals, moments)]
    finally:
        for hook in hooks:
            hook.remove()
    count = len(faces)
    stream_mean, stream_square, inner_mean, inner_square = ([v / count for v in values] for values in totals)
    return Activations(stream_mean, stream_square, inner_mean, inner_square, torch.cat(embeddings))


def _normalised(score: Tensor) -> Tensor:
    return score / score.mean().clamp_min(1e-12)


def _filter_l1(conv: nn.Conv2d) -> Tensor:
    return _normalised(conv.weight.detach().abs().sum((1, 2, 3)))


def stream_scores(teacher: DlibResNet, stats: Activations, criterion: Criterion) -> Tensor:
    """One importance per stream channel of the widest stage, summed over every layer the channel lives in."""
    blocks = cast(Sequence[ResidualBlock], teacher.blocks)
    total = torch.zeros(teacher.shape.out_channels)
    if criterion == "energy":
        for square in stats.stream_square:
            total[: len(square)] += _normalised(square)
        return total
    total[: teacher.shape.stem_channels] += _filter_l1(teacher.stem.conv)
    for block in blocks:
        total[: block.conv2.out_channels] += _filter_l1(block.conv2)
    return total


def inner_scores(block: ResidualBlock, inner_square: Tensor, criterion: Criterion) -> Tensor:
    if criterion == "l1":
        return _filter_l1(block.conv1)
    readers = block.conv2.weight.detach().pow(2).sum((0, 2, 3))
    return _normalised(inner_square * readers)


def _top(scores: Tensor, count: int, offset: int = 0) -> Tensor:
    """The `count` best of `scores` as indices (plus `offset`), in ascending order."""
    return torch.sort(torch.topk(scores, count).indices + offset).values


def _folded_bias(conv: nn.Conv2d, outputs: Tensor, inputs: Tensor, input_mean: Tensor) -> Tensor:
    """The kept outputs' bias plus what the removed inputs' mean activation added through them."""
    removed = torch.ones(conv.in_channels, dtype=torch.bool)
    removed[inputs] = False
    weight = conv.weight.detach()[outputs][:, removed].sum((2, 3))
    assert conv.bias is not None  # every convolution of the dlib ResNet has one
    return conv.bias.detach()[outputs] + weight @ input_mean[removed]


def _cut_conv(target: nn.Conv2d, source: nn.Conv2d, outputs: Tensor, inputs: Tensor, input_mean: Tensor) -> None:
    target.weight.data.copy_(source.weight.detach()[outputs][:, inputs])
    assert target.bias is not None
    target.bias.data.copy_(_folded_bias(source, outputs, inputs, input_mean))


@dataclass(frozen=True)
class StageEnd:
    """Where a stage of the cut ends (the block before a down block) and which of the teacher's stream channels
    it keeps there: the cut's output of `student_block` is the teacher's output of `teacher_block` at `channels`."""

    student_block: int
    teacher_block: int
    channels: Tensor


class StageTeacher:
    """The teacher's stream at a cut's stage ends, at the channels the cut kept, for a batch of the student's
    inputs (the same tensor: the cut embeds the teacher's crops). Only the blocks up to the last stage end run."""

    def __init__(self, teacher: DlibResNet, ends: Sequence[StageEnd]) -> None:
        if not ends:
            raise ValueError("a stage teacher needs at least one stage end")
        self.teacher, self.ends = teacher.eval(), list(ends)
        for parameter in self.teacher.parameters():
            parameter.requires_grad_(False)

    @torch.no_grad()
    def maps(self, x: Tensor) -> list[Tensor]:
        wanted = {end.teacher_block: end.channels.to(x.device) for end in self.ends}
        found: dict[int, Tensor] = {}
        h = self.teacher.stem(x)
        for index, block in enumerate(cast(Sequence[ResidualBlock], self.teacher.blocks)[: max(wanted) + 1]):
            h = block(h)
            if index in wanted:
                found[index] = h.index_select(1, wanted[index])
        return [found[end.teacher_block] for end in self.ends]


def stage_ends(downs: Sequence[bool]) -> list[int]:
    """Indices of the blocks that end a stage: each one followed by a down block (`downs`: each block's)."""
    return [i for i in range(len(downs) - 1) if downs[i + 1]]


def cut_from_teacher(
    teacher: DlibResNet, faces: np.ndarray, width: float, depth: str = "full", criterion: Criterion = "energy", refit_head: bool = True,
    inner_width: float | None = None,
) -> DlibResNet:
    """The `width`/`depth` cut of `teacher`, started from its channels that `criterion` ranks highest
    on `faces` (public faces, (N, s, s, 3) uint8, at the teacher's crop); `refit_head=False` keeps the
    teacher's head weights at the kept channels instead of solving for them; `inner_width` is the fraction of
    each block's inner channels kept (`width` when None)."""
    return cut_with_stages(teacher, faces, width, depth, criterion, refit_head, inner_width)[0]


@torch.no_grad()  # not inference mode: the student's parameters must stay trainable
def cut_with_stages(
    teacher: DlibResNet, faces: np.ndarray, width: float, depth: str = "full", criterion: Criterion = "energy", refit_head: bool = True,
    inner_width: float | None = None,
) -> tuple[DlibResNet, list[StageEnd]]:
    """`cut_from_teacher`, and where each of the cut's stages ends in it and in the teacher (`StageEnd`)."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    if teacher.shape != TEACHER_SHAPE:
        raise ValueError("cut_from_teacher cuts the full dlib ResNet, not another cut")
    student = build_cut(width, depth, teacher.embedding_dim, inner_width).eval()
    stats = teacher_activations(teacher, faces)
    stream_rank = stream_scores(teacher, stats, criterion)
    teacher_blocks = cast(Sequence[ResidualBlock], teacher.blocks)
    stream = _top(stream_rank[: teacher.shape.stem_channels], student.shape.stem_channels)
    _cut_conv(student.stem.conv, teacher.stem.conv, stream, torch.arange(3), torch.zeros(3))
    student_blocks = iter(cast(Sequence[ResidualBlock], student.blocks))
    stream_after: dict[str, Tensor] = {}
    for index, (block, shape) in enumerate(zip(teacher_blocks, teacher.shape.blocks)):
        if shape.name in DEPTHS[depth]:
            stream_after[shape.name] = stream
            continue  # an identity block: dropping it passes its input on unchanged
        cut = next(student_blocks)
        grown = cut.conv2.out_channels - len(stream)
        outputs = stream if not grown else torch.cat([stream, _top(stream_rank[shape.in_channels : shape.out_channels], grown, shape.in_channels)])
        inner = _top(inner_scores(block, stats.inner_square[index], criterion), cut.conv1.out_channels)
        _cut_conv(cut.conv1, block.conv1, inner, stream, stats.stream_mean[index])
        _cut_conv(cut.conv2, block.conv2, outputs, inner, stats.inner_mean[index])
        stream = stream_after[shape.name] = outputs
    student.head.fc.weight.data.copy_(teacher.head.fc.weight.detach()[:, stream])
    if refit_head:
        student.head.fc.weight.data.copy_(_fitted_head(student, stats.embeddings, faces))
    ends = zip(stage_ends([b.down for b in student.shape.blocks]), stage_ends([b.down for b in teacher.shape.blocks]), strict=True)
    return student, [StageEnd(s, t, stream_after[teacher.shape.blocks[t].name]) for s, t in ends]


def _fitted_head(student: DlibResNet, targets: Tensor, faces: np.ndarray, batch: int = 64, ridge: float = 1e-3) -> Tensor:
    """The head weights that map the student's pooled features of `faces` closest to `targets`, the teacher's embeddings of them."""
    pooled: list[Tensor] = []
    hook = student.head.fc.register_forward_hook(lambda _module, inputs, _output: pooled.append(inputs[0].double()))
    try:
        for start in range(0, len(faces), batch):
            student(faces_to_tensor(faces[start : start + batch]))
    finally:
        hook.remove()
    f, t = torch.cat(pooled), targets.double()
    gram = f.T @ f
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)
    return torch.linalg.solve(gram, f.T @ t).T.float()
