"""IResNet-18/34 as in insightface ``arcface_torch`` (Deng et al., ArcFace).

"Improved" ResNet for 112x112 faces: BN -> conv -> BN -> PReLU -> conv -> BN inside
each block (no activation after the addition), a stride-1 3x3 stem, and an
"output layer E" head (BN, flatten, FC over the 7x7 map, BN1d).

Exposed as ``stem -> blocks -> head`` like every backbone here: ``blocks`` is the
flat sequence of residual blocks in execution order (stages are not grouped, so a
frozen prefix can end inside a stage).
"""
from __future__ import annotations

from torch import Tensor, nn

from facecore.models.registry import register_backbone

INPUT_SIZE = 112
_STAGE_CHANNELS = (64, 128, 256, 512)
# Four stride-2 stages take 112 down to 7.
_FINAL_MAP = INPUT_SIZE // 16


class IBasicBlock(nn.Module):
    def __init__(self, in_c: int, out_c: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_c, eps=1e-5)
        self.conv1 = nn.Conv2d(in_c, out_c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_c, eps=1e-5)
        self.prelu = nn.PReLU(out_c)
        self.conv2 = nn.Conv2d(out_c, out_c, 3, stride, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_c, eps=1e-5)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_c != out_c:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_c, out_c, 1, stride, bias=False),
                nn.BatchNorm2d(out_c, eps=1e-5),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        identity = x if self.downsample is None else self.downsample(x)
        return out + identity


class IResNetHead(nn.Module):
    """BN -> flatten -> (dropout) -> FC -> BN1d, insightface's output layer "E"."""

    def __init__(self, in_c: int, embedding_dim: int, dropout: float) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_c, eps=1e-5)
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(in_c * _FINAL_MAP * _FINAL_MAP, embedding_dim)
        self.features = nn.BatchNorm1d(embedding_dim, eps=1e-5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.dropout(self.bn(x).flatten(1))
        return self.features(self.fc(x))


class IResNet(nn.Module):
    """IResNet backbone: ``(N, 3, 112, 112) -> (N, embedding_dim)``.

    Args:
        layers: residual blocks per stage, e.g. ``(2, 2, 2, 2)`` for IResNet18.
        embedding_dim: size of the output embedding (512 in insightface).
        dropout: dropout before the FC layer (insightface uses 0 for r18/r34).
        name: registry name reported by the ``name`` attribute.
    """

    input_size: int = INPUT_SIZE

    def __init__(
        self, layers: tuple[int, int, int, int], embedding_dim: int = 512, dropout: float = 0.0, name: str = "iresnet"
    ) -> None:
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
        self.name = name
        self.embedding_dim = embedding_dim

        stem_c = _STAGE_CHANNELS[0]
        self.stem = nn.Sequential(
            nn.Conv2d(3, stem_c, 3, 1, 1, bias=False),
            nn.BatchNorm2d(stem_c, eps=1e-5),
            nn.PReLU(stem_c),
        )
        blocks: list[nn.Module] = []
        in_c = stem_c
        for out_c, repeats in zip(_STAGE_CHANNELS, layers, strict=True):
            for i in range(repeats):
                blocks.append(IBasicBlock(in_c, out_c, stride=2 if i == 0 else 1))
                in_c = out_c
        self.blocks = nn.Sequential(*blocks)
        self.head = IResNetHead(in_c, embedding_dim, dropout)
        self._init_weights()

    def _init_weights(self) -> None:
        # insightface initialisation. Unlike insightface we do not freeze the final
        # BN scale here: which parameters train is decided by the fine-tuning code.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.1)
            elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))


@register_backbone("iresnet18")
def build_iresnet18(embedding_dim: int = 512, dropout: float = 0.0) -> IResNet:
    return IResNet((2, 2, 2, 2), embedding_dim=embedding_dim, dropout=dropout, name="iresnet18")


@register_backbone("iresnet34")
def build_iresnet34(embedding_dim: int = 512, dropout: float = 0.0) -> IResNet:
    return IResNet((3, 4, 6, 3), embedding_dim=embedding_dim, dropout=dropout, name="iresnet34")
