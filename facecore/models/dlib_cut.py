"""Cuts of the dlib ResNet: the teacher's own architecture with a fraction of its channels, and
optionally fewer blocks, registered as backbones (`dlib-resnet-w0.5`, `dlib-resnet-w0.5-short`).

Invariants:
* A cut's shape is a function of its name alone, so a backbone file names its architecture with a
  string, as every other backbone does. Which of the teacher's channels a cut starts from is
  `pretrain.teacher_cut`'s business, not the architecture's.
* Width W scales the stem and every stage's stream by W, and inner width I (W unless named) every
  block's inner channels, each rounded to a multiple of 4 and never below 4; a wider stage stays at
  least as wide as the one before, because a down block's shortcut widens its input with zeros and
  never narrows it. A block's parameters scale with its stream times its inner width, so at one size
  a cut can keep the stream the blocks share and thin what each block adds to it, or the reverse.
* Every down block stays (they set the resolution and the widening). The `short` cut drops the
  last identity block of each stage, the cheapest place to lose depth in a residual network;
  `short-last` only the last stage's, which holds most of the parameters (the early stages' blocks
  cost few parameters and much accuracy when dropped).
* Input size, crop geometry and embedding size are the teacher's, so a cut embeds the same crops.
"""
from __future__ import annotations

from functools import partial

from facecore.models.dlib_resnet import TEACHER_SHAPE, BlockShape, DlibResNet, DlibShape
from facecore.models.registry import register_backbone

WIDTHS = (0.25, 0.375, 0.5, 0.625, 0.75)
# (stream width, inner width) pairs whose inner width differs from the stream's; every one near the
# 2.5 MB in int8 at one of the two depths (pretrain/TEACHER_CUT.md)
THIN_BLOCK_CUTS = ((1.0, 0.375), (1.0, 0.5), (1.0, 0.5625), (0.875, 0.4375), (0.875, 0.625), (0.875, 0.6875), (0.75, 0.5625), (0.75, 0.6875))
DEPTHS: dict[str, frozenset[str]] = {
    "full": frozenset(),
    "short": frozenset({"conv32_3", "conv64_3", "conv128_2", "conv256_2"}),
    "short-last": frozenset({"conv256_2"}),
}


def _scaled(channels: int, width: float) -> int:
    return max(4, 4 * round(channels * width / 4))


def cut_shape(width: float, depth: str = "full", inner: float | None = None) -> DlibShape:
    """The teacher's shape with `width` of its stream channels, `inner` of each block's inner channels
    (`width` when None) and the blocks `depth` keeps."""
    inner = width if inner is None else inner
    for flag, value in (("width", width), ("inner width", inner)):
        if not 0 < value <= 1:
            raise ValueError(f"{flag} must be in (0, 1], got {value}")
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {', '.join(DEPTHS)}, got {depth!r}")
    blocks = tuple(
        BlockShape(b.name, _scaled(b.in_channels, width), _scaled(b.out_channels, width), b.down, _scaled(b.mid_channels, inner))
        for b in TEACHER_SHAPE.blocks if b.name not in DEPTHS[depth]
    )
    return DlibShape(_scaled(TEACHER_SHAPE.stem_channels, width), blocks)


def cut_name(width: float, depth: str = "full", inner: float | None = None) -> str:
    thin = "" if inner is None or inner == width else f"-i{inner:g}"
    return f"dlib-resnet-w{width:g}{thin}" + ("" if depth == "full" else f"-{depth}")


def build_cut(width: float, depth: str, embedding_dim: int = 128, inner: float | None = None) -> DlibResNet:
    return DlibResNet(embedding_dim=embedding_dim, name=cut_name(width, depth, inner), shape=cut_shape(width, depth, inner))


for _width, _inner in [(w, None) for w in WIDTHS] + list(THIN_BLOCK_CUTS):
    for _depth in DEPTHS:
        register_backbone(cut_name(_width, _depth, _inner))(partial(build_cut, _width, _depth, inner=_inner))
