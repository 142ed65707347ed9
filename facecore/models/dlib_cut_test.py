from __future__ import annotations

import pytest
import torch

from facecore.models import backbone_names, get_backbone
from facecore.models.dlib_cut import DEPTHS, THIN_BLOCK_CUTS, WIDTHS, cut_name, cut_shape
from facecore.models.registry import backbone_geometry


def _parameters(name: str) -> int:
    return sum(p.numel() for p in get_backbone(name).parameters())


@pytest.mark.parametrize("depth", sorted(DEPTHS))
@pytest.mark.parametrize(("width", "inner"), [(w, None) for w in WIDTHS] + list(THIN_BLOCK_CUTS))
def test_every_cut_is_a_registered_backbone_that_embeds_the_teachers_crop(width: float, inner: float | None, depth: str) -> None:
    # Prepare
    name = cut_name(width, depth, inner)
    model = get_backbone(name).eval()

    # Execute
    with torch.no_grad():
        embeddings = model(torch.randn(2, 3, 150, 150))

    # Assert
    assert name in backbone_names()
    assert embeddings.shape == (2, 128)
    assert model.name == name
    assert backbone_geometry(name) == backbone_geometry("dlib-resnet")


def test_a_narrower_or_shallower_cut_has_fewer_parameters_than_the_teacher() -> None:
    # Execute
    full = [_parameters(cut_name(w)) for w in WIDTHS]
    short = [_parameters(cut_name(w, "short")) for w in WIDTHS]

    # Assert
    assert full == sorted(full) and short == sorted(short)
    assert all(s < f for s, f in zip(short, full))
    assert full[-1] < _parameters("dlib-resnet")


def test_a_cut_keeps_every_down_block_and_never_narrows_the_stream() -> None:
    # Execute
    shape = cut_shape(0.375, "short")

    # Assert
    assert [b.name for b in shape.blocks if b.down] == ["conv64_down", "conv128_down", "conv256_down", "conv256_down_out"]
    assert len(shape.blocks) == 10
    assert all(b.in_channels <= b.out_channels for b in shape.blocks)
    assert shape.stem_channels == 12 and shape.out_channels == 96


def test_a_thin_block_cut_keeps_the_stream_and_thins_only_each_blocks_inner_channels() -> None:
    # Execute
    thin, plain = cut_shape(1.0, "full", 0.375), cut_shape(1.0)

    # Assert
    assert cut_name(1.0, "full", 0.375) == "dlib-resnet-w1-i0.375" and cut_name(0.75, "short", 0.75) == "dlib-resnet-w0.75-short"
    assert [(b.in_channels, b.out_channels) for b in thin.blocks] == [(b.in_channels, b.out_channels) for b in plain.blocks]
    assert thin.stem_channels == plain.stem_channels
    assert [b.mid_channels for b in thin.blocks] == [12] * 3 + [24] * 4 + [48] * 3 + [96] * 4


@pytest.mark.parametrize(
    ("width", "depth", "inner", "message"),
    [(0.0, "full", None, "width must be in"), (0.5, "deep", None, "depth must be one of"), (1.0, "full", 1.5, "inner width must be in")],
)
def test_a_cut_outside_the_family_is_refused(width: float, depth: str, inner: float | None, message: str) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        cut_shape(width, depth, inner)
