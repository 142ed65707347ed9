"""Distillation losses on embeddings.

Invariants: the losses compare directions only (every embedding is L2-normalised first), are
zero when the student's embeddings equal the teacher's (up to scale), and are never negative.
The relational loss depends on the batch's pairwise cosines only, so it is unchanged by any
rotation of either embedding space. The stage loss compares feature maps, not embeddings: zero when the
student's stream equals the teacher's at the channels it kept, never negative, and unchanged when both
streams are scaled alike (each stage's error is relative to the teacher's mean square there), so stages of
different magnitude weigh the same.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def cosine_distance(student: Tensor, teacher: Tensor) -> Tensor:
    """mean_i (1 - cos(student_i, teacher_i))."""
    return (1.0 - (F.normalize(student, dim=1) * F.normalize(teacher, dim=1)).sum(1)).mean()


def centered_cosine_distance(student: Tensor, teacher: Tensor, center: Tensor) -> Tensor:
    """mean_i (1 - cos(s_i - c, t_i - c)) over unit embeddings s, t, with c the mean of the teacher's unit
    embeddings. A strong face model's embeddings share a large common direction (any two faces score far
    above zero), which the plain cosine rewards for free; about the centre only what tells faces apart is left."""
    s, t = F.normalize(student, dim=1), F.normalize(teacher, dim=1)
    return cosine_distance(s - center, t - center)


def relational_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean squared difference between the batch's student and teacher cosine-similarity matrices,
    over the off-diagonal entries (the diagonal is 1 for both)."""
    s, t = F.normalize(student, dim=1), F.normalize(teacher, dim=1)
    n = len(s)
    if n < 2:
        return student.sum() * 0.0
    off = ~torch.eye(n, dtype=torch.bool, device=s.device)
    return ((s @ s.T - t @ t.T)[off] ** 2).mean()


def stage_loss(student: Sequence[Tensor], teacher: Sequence[Tensor]) -> Tensor:
    """Mean over stages of mean((s - t)^2) / mean(t^2): the student's stream at each stage end against the
    teacher's at the channels the student kept (pretrain.teacher_cut.StageTeacher)."""
    errors = [(s - t).pow(2).mean() / t.pow(2).mean().clamp_min(1e-12) for s, t in zip(student, teacher, strict=True)]
    return torch.stack(errors).mean()


def procrustes_rotation(student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
    """The orthogonal R minimising ||S R - T|| (rows L2-normalised first).

    ``teacher @ R.T`` is the teacher's space turned onto the student's: same cosines between faces,
    so the same verification behaviour, but a target the student is already near."""
    s = student / np.linalg.norm(student, axis=1, keepdims=True)
    t = teacher / np.linalg.norm(teacher, axis=1, keepdims=True)
    u, _, vt = np.linalg.svd(s.T.astype(np.float64) @ t.astype(np.float64))
    return (u @ vt).astype(np.float32)
