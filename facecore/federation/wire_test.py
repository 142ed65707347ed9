"""The arrays that cross the wire: precision, untouched integers, the update file's layout."""
import numpy as np
import pytest

from facecore.federation.protocol import BACKBONE_PREFIX, EMBEDDING_KEY
from facecore.federation.wire import as_received, as_sent, backbone_deltas, update_tensors, widened


def test_floats_cross_at_the_wire_precision_and_counters_as_they_are() -> None:
    # Prepare
    weights: dict[str, np.ndarray] = {"w": np.array([1.0001, -3.14159265], np.float32), "n": np.array(7, np.int64)}
    # Execute
    sent, received = as_sent(weights, "fp16"), as_received(weights, "fp16")
    # Assert
    assert sent["w"].dtype == np.float16 and sent["n"].dtype == np.int64 and sent["n"] == 7
    assert received["w"].dtype == np.float32
    np.testing.assert_array_equal(received["w"], weights["w"].astype(np.float16).astype(np.float32))
    assert not np.array_equal(received["w"], weights["w"])  # 1.0001 is not a half
    np.testing.assert_array_equal(as_received(weights, "fp32")["w"], weights["w"])


def test_an_update_files_tensors_hold_the_deltas_then_the_float32_embedding() -> None:
    # Prepare
    deltas: dict[str, np.ndarray] = {"conv.weight": np.full((2, 2), 0.5, np.float32), "bn.num_batches_tracked": np.array(0, np.int64)}
    # Execute
    tensors = update_tensors(deltas, np.array([0.6, 0.8], np.float64), "fp16")
    # Assert
    assert list(tensors) == [BACKBONE_PREFIX + "conv.weight", BACKBONE_PREFIX + "bn.num_batches_tracked", EMBEDDING_KEY]
    assert tensors[EMBEDDING_KEY].dtype == np.float32
    read = backbone_deltas(tensors)
    assert list(read) == list(deltas) and read["conv.weight"].dtype == np.float16


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision"):
        as_sent({"w": np.zeros(1, np.float32)}, "bf16")  # type: ignore[arg-type]


def test_widening_by_table_is_exact_for_every_half_value() -> None:
    # Prepare: every 16-bit pattern: normals, subnormals, zeros, infinities and NaNs
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    # Execute
    wide = widened(every)
    # Assert
    np.testing.assert_array_equal(wide, every.astype(np.float32))  # NaNs compare equal here
    assert widened(np.array([1.5], np.float64)).dtype == np.float32
