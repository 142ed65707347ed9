from __future__ import annotations

from pathlib import Path

import pytest
import torch

from facecore.models.checkpoint import int8_received, load_backbone, save_backbone
from facecore.models.registry import get_backbone


def test_an_int8_file_is_about_half_the_fp16_one_and_loads_as_fp32_within_half_a_step(tmp_path: Path) -> None:
    # Prepare
    torch.manual_seed(0)
    model = get_backbone("dlib-resnet-w0.5-short").eval()
    faces = torch.randn(4, 3, 150, 150)

    # Execute
    fp16 = save_backbone(model, tmp_path / "fp16.pt", half=True)
    int8 = save_backbone(model, tmp_path / "int8.pt", meta={"precision": "int8"}, int8=True)
    loaded = load_backbone(int8)

    # Assert
    assert int8.stat().st_size < 0.6 * fp16.stat().st_size
    assert loaded.meta == {"precision": "int8"}
    for key, original in model.state_dict().items():
        restored = loaded.state_dict()[key]
        assert restored.dtype == torch.float32
        if original.dim() >= 2:  # quantised: within half a step of its channel's scale
            step = original.abs().flatten(1).amax(1) / 127
            assert ((restored - original).abs().flatten(1).amax(1) <= step / 2 + 1e-7).all(), key
        else:  # biases ride in fp16
            torch.testing.assert_close(restored, original.half().float())
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(loaded(faces), model(faces))
    assert cosine.min() > 0.999


def test_a_file_is_fp16_or_int8_not_both(tmp_path: Path) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="fp16 or int8, not both"):
        save_backbone(get_backbone("dlib-resnet-w0.25"), tmp_path / "both.pt", half=True, int8=True)
    assert not (tmp_path / "both.pt").exists()


def test_an_int8_download_trains_from_exactly_the_weights_its_file_loads_as(tmp_path: Path) -> None:
    # Prepare
    torch.manual_seed(1)
    model = get_backbone("dlib-resnet-w0.25-short").eval()

    # Execute
    received = int8_received(model.state_dict())
    loaded = load_backbone(save_backbone(model, tmp_path / "int8.pt", int8=True)).state_dict()

    # Assert
    assert received.keys() == loaded.keys()
    for key, value in loaded.items():
        assert torch.equal(received[key], value), key
    assert any(not torch.equal(received[k], v) for k, v in model.state_dict().items() if v.dim() >= 2)  # it is rounded
