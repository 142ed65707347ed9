"""Backbones for cross-silo runs and the one place that knows about the GPU path.

``tiny`` exists because this project's CPU budget cannot train even MobileFaceNet-S on
112x112 faces for hundreds of steps (tens of seconds per step under a busy machine); it is
a smoke-test model on 32x32 faces and never stands in for the paper's numbers.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

import torch
from torch import Tensor, nn

import facecore.models  # noqa: F401  (registers the registry's backbones)
from facecore.losses import MarginHead, make_margin_head
from facecore.models.registry import get_backbone

TINY_INPUT = 32


class TinyFaceNet(nn.Module):
    """Three stride-2 conv blocks and a BN-ed linear embedding, for 32x32 faces on a CPU."""

    name = "tiny"
    input_size = TINY_INPUT

    def __init__(self, embedding_dim: int = 64, width: int = 16) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        layers: list[nn.Module] = []
        channels = 3
        for out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(channels, out, 3, 2, 1, bias=False), nn.BatchNorm2d(out), nn.PReLU(out)]
            channels = out
        self.features = nn.Sequential(*layers)
        side = TINY_INPUT // 8
        self.embed = nn.Sequential(nn.Flatten(), nn.Linear(channels * side * side, embedding_dim, bias=False), nn.BatchNorm1d(embedding_dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.embed(self.features(x))


def build_backbone(name: str, embedding_dim: int | None = None, seed: int = 0) -> nn.Module:
    """Same ``seed``, same initial weights: every party and baseline starts from one model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "tiny":
            return TinyFaceNet(embedding_dim or 64)
        return get_backbone(name, embedding_dim)


def build_head(loss: str, embedding_dim: int, classes: int, seed: int) -> MarginHead:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make_margin_head(loss, embedding_dim, classes)


def input_size(backbone: nn.Module) -> int:
    return int(getattr(backbone, "input_size", 112))


M = TypeVar("M", bound=nn.Module)


def place(module: M, device: str) -> M:
    """On CUDA, channels_last: convolutions then run in NHWC, the layout tensor cores want."""
    if device == "cuda":
        return module.to(device=device, memory_format=torch.channels_last)  # type: ignore[call-overload]  # documented; Module.to's overloads omit it
    return module.to(device)


@contextlib.contextmanager
def backbone_autocast(device: str) -> Iterator[None]:
    """bf16 autocast for the backbone's forward on CUDA; a no-op on CPU.

    The margin heads run outside it on float32 embeddings: the ArcFace margin
    (cos(theta + m) with s = 64) is too coarse in bf16. Parameters and momentum stay float32.
    """
    if device == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield


def configure_cpu_threads(device: str) -> None:
    # Measured here: on a busy 2-core machine two intra-op threads made a step ~20x slower.
    if device == "cpu":
        torch.set_num_threads(1)
