"""Quantised deltas: each weight within half a step, through the tensor file, and error feedback that loses nothing."""
from __future__ import annotations

import io

import numpy as np
import pytest

from facecore import tensorfile
from facecore.federation.quantize import coded_shape, quantize, quantized_update, received_deltas


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", [(5, 3, 3, 3), (7,), (3, 5)])  # odd sizes: a 4-bit entry pads its last byte
def test_each_weight_comes_back_within_half_a_step_of_its_row(bits: int, shape: tuple[int, ...]) -> None:
    # Prepare: rows of very different scales, and one all-zero row where there are rows
    rng = np.random.default_rng(bits)
    values = (rng.standard_normal(shape) * np.logspace(-6, -2, shape[0]).reshape(-1, *[1] * (len(shape) - 1))).astype(np.float32)
    if len(shape) >= 2:
        values[1] = 0
    # Execute: through a real tensor file
    tensors, received, _ = quantized_update({"w": values, "n": np.array(3, np.int64)}, bits)
    body = tensorfile.dumps(tensors)
    handle = io.BytesIO(body)
    back = dict(tensorfile.iter_tensors(handle, tensorfile.read_header(handle, len(body))))
    read = received_deltas(back, {"w": shape, "n": ()})
    # Assert
    assert tensors["backbone.w"].shape == coded_shape(shape, bits) and tensors["backbone.w"].dtype == (np.int8 if bits == 8 else np.uint8)
    np.testing.assert_array_equal(read["w"], received["w"])
    step = tensors["scale.w"].reshape(-1, *[1] * (len(shape) - 1)) if len(shape) >= 2 else tensors["scale.w"]
    assert np.all(np.abs(read["w"] - values) <= step / 2 + 1e-12)
    assert read["n"] == 3 and "scale.n" not in tensors
    if len(shape) >= 2:
        assert not read["w"][1].any()


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_delivers_the_sum_of_the_deltas_up_to_the_last_residual(bits: int) -> None:
    # Prepare: five rounds of small deltas
    rng = np.random.default_rng(0)
    deltas = [{"w": (rng.standard_normal((16, 9)) * 1e-3).astype(np.float32)} for _ in range(5)]
    # Execute
    residual, delivered = None, np.zeros((16, 9), np.float64)
    for delta in deltas:
        _, received, residual = quantized_update(delta, bits, residual)
        delivered += received["w"]
    # Assert: what the server summed plus what the device still holds is everything the device trained
    assert residual is not None
    meant = sum(d["w"].astype(np.float64) for d in deltas)
    np.testing.assert_allclose(delivered + residual["w"], meant, atol=1e-9)
    without = sum(quantized_update(d, bits)[1]["w"].astype(np.float64) for d in deltas)
    assert np.abs(delivered - meant).max() < np.abs(without - meant).max()


def test_a_residual_for_other_entries_is_not_carried() -> None:
    delta = {"w": np.full((2, 2), 1e-3, np.float32)}
    _, received, _ = quantized_update(delta, 8, {"v": np.ones((2, 2), np.float32)})
    np.testing.assert_allclose(received["w"], delta["w"], rtol=1e-6)
    with pytest.raises(ValueError, match="upload bits"):
        quantize(delta["w"], 2)


def test_aggregation_reads_only_the_entries_it_asks_for() -> None:
    # Prepare: a file that also sends an entry the round froze
    tensors, _, _ = quantized_update({"trained": np.full((2, 3), 1e-3, np.float32), "frozen": np.ones((4, 2), np.float32)}, 4)
    # Execute
    read = received_deltas(tensors, {"trained": (2, 3)})
    # Assert
    assert list(read) == ["trained"] and read["trained"].shape == (2, 3)
