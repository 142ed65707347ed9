"""MobileFaceNet (Chen et al. 2018, "MobileFaceNets: Efficient CNNs for Accurate
Real-Time Face Verification on Mobile Devices").

Layout follows the widely used insightface / InsightFace_Pytorch port, which has
about 1.0M parameters at width 1 with a 128-d embedding (the paper reports 0.99M).

The network is exposed as ``stem -> blocks -> head`` so that training code can
freeze a prefix (stem plus the first ``k`` blocks) and fine-tune the rest:

* ``stem``: 3x3 stride-2 conv and a 3x3 depthwise conv (112 -> 56).
* ``blocks``: every inverted-residual unit, flattened into one ``nn.Sequential``
  in execution order (15 units; the downsampling units are the ones whose input
  and output sizes differ). Flattening rather than grouping by stage gives the
  finest possible split points.
* ``head``: 1x1 conv to 512, global depthwise conv (GDC), linear, BatchNorm1d.

The embedding is returned raw: normalisation belongs to the loss and to matching.
"""
from __future__ import annotations

from torch import Tensor, nn

from facecore.models.registry import register_backbone

INPUT_SIZE = 112


def scaled_channels(channels: int, width: float) -> int:
    """Channels after the width multiplier, kept a multiple of 8 (and >= 8) so
    depthwise groups stay integral and vectorised kernels stay efficient."""
    return max(8, int(round(channels * width / 8)) * 8)


class ConvBNPReLU(nn.Sequential):
    def __init__(
        self, in_c: int, out_c: int, kernel: int = 1, stride: int = 1, padding: int = 0, groups: int = 1
    ) -> None:
        super().__init__(
            nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_c),
            nn.PReLU(out_c),
        )


class ConvBN(nn.Sequential):
    """Linear bottleneck: no activation, as the paper prescribes after projection."""

    def __init__(
        self, in_c: int, out_c: int, kernel: int = 1, stride: int = 1, padding: int = 0, groups: int = 1
    ) -> None:
        super().__init__(
            nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_c),
        )


class DepthWiseUnit(nn.Module):
    """Inverted residual: 1x1 expand, 3x3 depthwise, 1x1 linear projection.

    The skip connection is used only when shapes match (stride 1, same channels).
    """

    def __init__(self, in_c: int, out_c: int, expanded: int, stride: int) -> None:
        super().__init__()
        self.residual = stride == 1 and in_c == out_c
        self.layers = nn.Sequential(
            ConvBNPReLU(in_c, expanded),
            ConvBNPReLU(expanded, expanded, kernel=3, stride=stride, padding=1, groups=expanded),
            ConvBN(expanded, out_c),
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(x)
        return x + out if self.residual else out


class GDCHead(nn.Module):
    """1x1 conv, global depthwise 7x7 conv, linear projection and BatchNorm1d.

    GDC replaces global average pooling because face images are aligned, so
    spatial positions are not equally important (paper section 3.2).
    """

    def __init__(self, in_c: int, hidden: int, embedding_dim: int) -> None:
        super().__init__()
        self.conv = ConvBNPReLU(in_c, hidden)
        self.gdc = ConvBN(hidden, hidden, kernel=7, groups=hidden)
        self.linear = nn.Linear(hidden, embedding_dim, bias=False)
        self.bn = nn.BatchNorm1d(embedding_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = self.gdc(self.conv(x))
        return self.bn(self.linear(x.flatten(1)))


# (out channels, expanded channels, stride, repeats) at width 1, after the stem.
_STAGES: tuple[tuple[int, int, int, int], ...] = (
    (64, 128, 2, 1),
    (64, 128, 1, 4),
    (128, 256, 2, 1),
    (128, 256, 1, 6),
    (128, 512, 2, 1),
    (128, 256, 1, 2),
)


class MobileFaceNet(nn.Module):
    """MobileFaceNet backbone: ``(N, 3, 112, 112) -> (N, embedding_dim)``.

    Args:
        embedding_dim: size of the output embedding (128 in the paper).
        width: channel multiplier; below 1 gives cheaper CPU variants.
        name: registry name reported by the ``name`` attribute.
    """

    input_size: int = INPUT_SIZE

    def __init__(self, embedding_dim: int = 128, width: float = 1.0, name: str = "mobilefacenet") -> None:
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
        if not width > 0:
            raise ValueError(f"width must be positive, got {width}")
        self.name = name
        self.embedding_dim = embedding_dim
        self.width = width

        stem_c = scaled_channels(64, width)
        self.stem = nn.Sequential(
            ConvBNPReLU(3, stem_c, kernel=3, stride=2, padding=1),
            ConvBNPReLU(stem_c, stem_c, kernel=3, padding=1, groups=stem_c),
        )

        units: list[nn.Module] = []
        in_c = stem_c
        for out, expanded, stride, repeats in _STAGES:
            out_c, exp_c = scaled_channels(out, width), scaled_channels(expanded, width)
            for _ in range(repeats):
                units.append(DepthWiseUnit(in_c, out_c, exp_c, stride))
                in_c = out_c
        self.blocks = nn.Sequential(*units)

        self.head = GDCHead(in_c, scaled_channels(512, width), embedding_dim)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))


@register_backbone("mobilefacenet")
def build_mobilefacenet(embedding_dim: int = 128, width: float = 1.0) -> MobileFaceNet:
    return MobileFaceNet(embedding_dim=embedding_dim, width=width, name="mobilefacenet")


@register_backbone("mobilefacenet_s")
def build_mobilefacenet_s(embedding_dim: int = 128) -> MobileFaceNet:
    """Half-width MobileFaceNet: roughly 4x fewer FLOPs, for CPU simulations."""
    return MobileFaceNet(embedding_dim=embedding_dim, width=0.5, name="mobilefacenet_s")
