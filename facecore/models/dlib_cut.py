"""Cuts of the dlib ResNet: the teacher's own architecture with a fraction of its channels, and
optionally fewer blocks, registered as backbones (`dlib-resnet-w0.5`, `dlib-resnet-w0.5-short`).

Invariants:
* A cut's shape is a function of its name alone, so a backbone file names its architecture with a
  string, as every other backbone does. Which of the teacher's channels a cut starts from is
  `pretrain.teacher_cut`'s business, not the architecture's.
* Width W scales the stem, every stage's stream and every block's inner width by W, rounded to a
  multiple of 4 and never below 4; a wider stage stays at least as wide as the one before, because a
  down block's shortcut widens its input with zeros and never narrows it.
* Every down block stays (they set the resolution and the widening). The `short` cut drops the
  last identity block of each stage, the cheapest place to lose depth in a residual network.
* Input size, crop geometry and embedding size are the teacher's, so a cut embeds the same crops.
"""
from __future__ import annotations

from functools import partial

from facecore.models.dlib_resnet import TEACHER_SHAPE, BlockShape, DlibResNet, DlibShape
from facecore.models.registry import register_backbone

WIDTHS = (0.25, 0.375, 0.5, 0.625, 0.75)
DEPTHS: dict[str, frozenset[str]] = {
    "full": frozenset(),
    "short": frozenset({"conv32_3", "conv64_3", "conv128_2", "conv256_2"}),
}


def _scaled(channels: int, width: float) -> int:
    return max(4, 4 * round(channels * width / 4))


def cut_shape(width: float, depth: str = "full") -> DlibShape:
    """The teacher's shape with `width` of its channels and the blocks `depth` keeps."""
    if not 0 < width <= 1:
        raise ValueError(f"width must be in (0, 1], got {width}")
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {', '.join(DEPTHS)}, got {depth!r}")
    blocks = tuple(
        BlockShape(b.name, _scaled(b.in_channels, width), _scaled(b.out_channels, width), b.down, _scaled(b.mid_channels, width))
        for b in TEACHER_SHAPE.blocks if b.name not in DEPTHS[depth]
    )
    return DlibShape(_scaled(TEACHER_SHAPE.stem_channels, width), blocks)


def cut_name(width: float, depth: str = "full") -> str:
    return f"dlib-resnet-w{width:g}" + ("" if depth == "full" else f"-{depth}")


def build_cut(width: float, depth: str, embedding_dim: int = 128) -> DlibResNet:
    return DlibResNet(embedding_dim=embedding_dim, name=cut_name(width, depth), shape=cut_shape(width, depth))


for _width in WIDTHS:
    for _depth in DEPTHS:
        register_backbone(cut_name(_width, _depth))(partial(build_cut, _width, _depth))
