"""dlib's face-recognition ResNet (dlib_face_recognition_resnet_model_v1), ported to torch.

Architecture, read from the layer list of the published weights: a 7x7 stride-2 stem with 32
channels, a 3x3 stride-2 max pool, then residual stages of 32 (3 blocks), 64 (1 down + 3),
128 (1 down + 2) and 256 (1 down + 2 + 1 down) channels, a global mean and a 128x256 linear map
without bias. Every convolution carries a bias and a fixed per-channel affine (dlib's `affine`
layer, its frozen batch norm); both fold into the convolution's weight and bias when loading, so
the torch module is plain Conv2d + ReLU and trains like any other backbone.

Invariants of the port, which parity with the original depends on:
* stride-2 convolutions and pools use no padding ("valid"); 3x3 stride-1 convolutions pad 1;
* a down block adds a 2x2 stride-2 average pool of its input, zero-padded along channels when the
  block widens, and when the convolution path comes out one pixel smaller than the pool, the
  convolution path is zero-padded at the bottom and the right (dlib's add_prev adds the
  overlapping region);
* the input is the project's [-1, 1] RGB; dlib's own convention ((pixel - channel mean) / 255)
  is reached inside `forward` with fixed, non-trainable buffers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from facecore.align.geometry import FaceGeometry, scaled_arcface
from facecore.models.preprocess import PIXEL_MEAN, PIXEL_STD
from facecore.models.registry import register_backbone

INPUT_SIZE = 150
# The channel means dlib subtracts, and the divisor of the published TF.js port.
DLIB_RGB_MEAN = (122.782, 117.001, 104.298)
DLIB_PIXEL_DIVISOR = 255.0

# The crop this backbone is evaluated and trained with: the ArcFace template mapped into 150x150,
# scaled about the centre and moved up, the best of 16 crops on LFW people folds 1-5 by pairs
# accuracy with the default detector's landmarks, which are MTCNN's points; MTCNN alone chose the
# same crop (`fedface eval geometry`; both grids are in facecore/weights/MODEL_CARD.md).
DLIB_GEOMETRY: FaceGeometry = scaled_arcface(INPUT_SIZE, scale=1.12, shift_y=24.0)

# (name, in channels, out channels, down) in forward order, after the stem.
BLOCKS: tuple[tuple[str, int, int, bool], ...] = (
    ("conv32_1", 32, 32, False), ("conv32_2", 32, 32, False), ("conv32_3", 32, 32, False),
    ("conv64_down", 32, 64, True), ("conv64_1", 64, 64, False), ("conv64_2", 64, 64, False), ("conv64_3", 64, 64, False),
    ("conv128_down", 64, 128, True), ("conv128_1", 128, 128, False), ("conv128_2", 128, 128, False),
    ("conv256_down", 128, 256, True), ("conv256_1", 256, 256, False), ("conv256_2", 256, 256, False),
    ("conv256_down_out", 256, 256, True),
)


@dataclass(frozen=True)
class BlockShape:
    """One residual block's channels: the stream's in and out, and the width between its two convolutions."""

    name: str
    in_channels: int
    out_channels: int
    down: bool
    mid_channels: int


@dataclass(frozen=True)
class DlibShape:
    """The channel counts of a dlib-ResNet-shaped network; cuts of the teacher (facecore.models.dlib_cut) differ only here."""

    stem_channels: int
    blocks: tuple[BlockShape, ...]

    @property
    def out_channels(self) -> int:
        return self.blocks[-1].out_channels


TEACHER_SHAPE = DlibShape(32, tuple(BlockShape(name, c_in, c_out, down, c_out) for name, c_in, c_out, down in BLOCKS))


class ResidualBlock(nn.Module):
    """conv-ReLU-conv plus the input (average-pooled and zero-widened when `down`), then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, down: bool, mid_channels: int | None = None) -> None:
        super().__init__()
        if not down and in_channels != out_channels:
            raise ValueError("a block that keeps the resolution keeps the width")
        if in_channels > out_channels:
            raise ValueError("a block never narrows the stream")
        mid = out_channels if mid_channels is None else mid_channels
        self.down = down
        self.conv1 = nn.Conv2d(in_channels, mid, 3, stride=2 if down else 1, padding=0 if down else 1)
        self.conv2 = nn.Conv2d(mid, out_channels, 3, padding=1)
        self.extra_channels = out_channels - in_channels

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv2(F.relu(self.conv1(x)))
        if not self.down:
            return F.relu(out + x)
        shortcut = F.avg_pool2d(x, 2, 2)
        if self.extra_channels:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.extra_channels))
        grow_h, grow_w = shortcut.shape[2] - out.shape[2], shortcut.shape[3] - out.shape[3]
        if grow_h or grow_w:
            out = F.pad(out, (0, grow_w, 0, grow_h))
        return F.relu(out + shortcut)


class DlibStem(nn.Module):
    """[-1, 1] RGB -> dlib's pixel convention -> 7x7 stride-2 conv, ReLU, 3x3 stride-2 max pool."""

    input_scale: Tensor  # buffers, registered in __init__
    input_shift: Tensor

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 7, stride=2)
        # [-1, 1] -> (pixel - mean) / 255, per channel: architecture constants, not weights.
        mean = torch.tensor(DLIB_RGB_MEAN).view(1, 3, 1, 1)
        self.register_buffer("input_scale", torch.full((1, 1, 1, 1), PIXEL_STD / DLIB_PIXEL_DIVISOR), persistent=False)
        self.register_buffer("input_shift", (PIXEL_MEAN - mean) / DLIB_PIXEL_DIVISOR, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(F.relu(self.conv(x * self.input_scale + self.input_shift)), 3, 2)


class DlibHead(nn.Module):
    """Global mean over the 2x2 map, then a linear map without bias."""

    def __init__(self, embedding_dim: int, channels: int = 256) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, embedding_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.mean((2, 3)))


class DlibResNet(nn.Module):
    """``(N, 3, 150, 150)`` RGB in [-1, 1] -> ``(N, 128)`` embeddings (unnormalised).

    ``stem``, ``blocks`` and ``head`` follow the backbone contract of the other architectures, so
    a device can freeze a prefix of blocks (device_sdk.training.split_backbone)."""

    input_size: int = INPUT_SIZE
    geometry: FaceGeometry = DLIB_GEOMETRY

    def __init__(self, embedding_dim: int = 128, name: str = "dlib-resnet", shape: DlibShape = TEACHER_SHAPE) -> None:
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
        if shape.blocks[0].in_channels != shape.stem_channels:
            raise ValueError("the first block reads the stem's channels")
        self.name = name
        self.embedding_dim = embedding_dim
        self.shape = shape
        self.stem = DlibStem(shape.stem_channels)
        self.blocks = nn.Sequential(*(ResidualBlock(b.in_channels, b.out_channels, b.down, b.mid_channels) for b in shape.blocks))
        self.head = DlibHead(embedding_dim, shape.out_channels)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                assert module.bias is not None  # every conv here has one
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))


@register_backbone("dlib-resnet")
def build_dlib_resnet(embedding_dim: int = 128) -> DlibResNet:
    """Untrained; `facecore.models.face_api.load_dlib_resnet` gives the published weights."""
    return DlibResNet(embedding_dim=embedding_dim)
