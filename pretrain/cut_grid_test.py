from __future__ import annotations

from facecore.models import get_backbone
from facecore.models.dlib_cut import cut_name
from pretrain.cut_grid import file_sizes


def test_a_cuts_int8_file_is_about_half_its_fp16_file_and_both_grow_with_the_parameters() -> None:
    # Prepare
    small, large = get_backbone(cut_name(0.25)), get_backbone(cut_name(0.5))

    # Execute
    small_sizes, large_sizes = file_sizes(small), file_sizes(large)

    # Assert
    parameters = sum(p.numel() for p in large.parameters())
    assert 0.45 < large_sizes["int8_bytes"] / large_sizes["fp16_bytes"] < 0.6
    assert 2 * parameters < large_sizes["fp16_bytes"] < 2.1 * parameters
    assert small_sizes["fp16_bytes"] < large_sizes["fp16_bytes"] and small_sizes["int8_bytes"] < large_sizes["int8_bytes"]
