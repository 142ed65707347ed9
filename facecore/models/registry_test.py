from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from facecore.errors import UnknownBackbone
from facecore.models import backbone_names, get_backbone, register_backbone
from facecore.models.dlib_cut import DEPTHS, THIN_BLOCK_CUTS, WIDTHS

EXPECTED_DEFAULT_DIMS = {"dlib-resnet": 128, "mobilefacenet": 128, "mobilefacenet_s": 128, "iresnet18": 512, "iresnet34": 512}
EXPECTED_INPUT_SIZE = {"dlib-resnet": 150}


def _faces(batch: int = 2, size: int = 112) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(batch, 3, size, size)


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registered_names() -> None:
    # Execute
    names = backbone_names()

    # Assert: the architectures, and the cuts of the dlib ResNet (facecore/models/dlib_cut_test.py checks those)
    assert [name for name in names if not name.startswith("dlib-resnet-w")] == sorted(EXPECTED_DEFAULT_DIMS)
    assert len(names) == len(EXPECTED_DEFAULT_DIMS) + (len(WIDTHS) + len(THIN_BLOCK_CUTS)) * len(DEPTHS)


@pytest.mark.parametrize("name", sorted(EXPECTED_DEFAULT_DIMS))
def test_output_shape_and_attributes(name: str) -> None:
    # Prepare
    model = get_backbone(name).eval()
    size = EXPECTED_INPUT_SIZE.get(name, 112)

    # Execute
    with torch.no_grad():
        out = model(_faces(size=size))

    # Assert
    assert out.shape == (2, EXPECTED_DEFAULT_DIMS[name])
    assert torch.isfinite(out).all()
    assert model.name == name
    assert model.embedding_dim == EXPECTED_DEFAULT_DIMS[name]
    assert model.input_size == size


def test_mobilefacenet_parameter_count_matches_paper() -> None:
    # Prepare
    model = get_backbone("mobilefacenet")

    # Execute
    count = _param_count(model)

    # Assert: the paper reports 0.99M parameters
    assert 800_000 <= count <= 1_200_000


def test_mobilefacenet_s_is_cheaper() -> None:
    # Prepare
    full, small = get_backbone("mobilefacenet"), get_backbone("mobilefacenet_s")

    # Execute
    full_count, small_count = _param_count(full), _param_count(small)

    # Assert
    assert small_count < full_count / 2


def test_unknown_name_lists_valid_names() -> None:
    # Execute
    with pytest.raises(UnknownBackbone, match="^unknown backbone 'resnet9000'; valid names: ") as excinfo:
        get_backbone("resnet9000")

    # Assert
    message = str(excinfo.value)
    assert "resnet9000" in message
    for name in EXPECTED_DEFAULT_DIMS:
        assert name in message


@pytest.mark.parametrize(("name", "dim"), [("mobilefacenet", 512), ("mobilefacenet_s", 64), ("iresnet18", 128)])
def test_embedding_dim_option(name: str, dim: int) -> None:
    # Prepare
    model = get_backbone(name, embedding_dim=dim).eval()

    # Execute
    with torch.no_grad():
        out = model(_faces())

    # Assert
    assert out.shape == (2, dim)
    assert model.embedding_dim == dim


def test_width_option_changes_capacity() -> None:
    # Prepare
    narrow = get_backbone("mobilefacenet", width=0.25).eval()

    # Execute
    with torch.no_grad():
        out = narrow(_faces())

    # Assert
    assert out.shape == (2, 128)
    assert _param_count(narrow) < _param_count(get_backbone("mobilefacenet_s"))


def test_invalid_embedding_dim_rejected() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="embedding_dim"):
        get_backbone("mobilefacenet", embedding_dim=0)


@pytest.mark.parametrize("name", ["mobilefacenet", "iresnet18"])
def test_channels_last_input_matches_contiguous(name: str) -> None:
    # Prepare
    model = get_backbone(name).eval()
    faces = _faces()

    # Execute
    with torch.no_grad():
        expected = model(faces)
        got = model(faces.to(memory_format=torch.channels_last))

    # Assert
    # Fresh eval-mode IResNet activations reach ~1e4, so compare directions
    # (what verification uses) instead of absolute values.
    assert got.shape == expected.shape
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=1)
    assert (cosine > 0.9999).all()


@pytest.mark.parametrize("name", ["mobilefacenet", "iresnet18"])
def test_stem_blocks_head_compose_to_forward(name: str) -> None:
    # Prepare: split in the middle as the frozen-prefix fine-tuning will
    model: Any = get_backbone(name).eval()  # the backbone contract's stem, blocks and head
    faces = _faces()
    split = len(model.blocks) // 2

    # Execute
    with torch.no_grad():
        prefix = model.blocks[:split](model.stem(faces))
        composed = model.head(model.blocks[split:](prefix))
        direct = model(faces)

    # Assert
    assert isinstance(model.blocks, nn.Sequential)
    assert len(model.blocks) > 1
    torch.testing.assert_close(composed, direct)


def test_embedding_is_not_normalised() -> None:
    # Prepare
    model = get_backbone("mobilefacenet_s").train()

    # Execute: train-mode BN1d output has unit variance per feature, not unit norm
    out = model(_faces(4))

    # Assert
    norms = out.norm(dim=1)
    assert not torch.allclose(norms, torch.ones_like(norms), atol=1e-3)


def test_duplicate_registration_rejected() -> None:
    # Prepare
    def other_factory(embedding_dim: int = 8) -> nn.Module:
        return nn.Identity()

    # Execute / Assert
    with pytest.raises(ValueError, match="already registered"):
        register_backbone("mobilefacenet")(other_factory)
