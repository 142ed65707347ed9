"""The arrays that cross the wire: the delta, precision, untouched integers, the update file's layout."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from facecore.federation.protocol import BACKBONE_PREFIX, EMBEDDING_KEY
from facecore.federation.quantize import received_deltas
from facecore.federation.wire import Precision, as_received, as_sent, delta, packed_delta, update_tensors, widened, wire_arrays


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
    read = received_deltas(tensors, {k: v.shape for k, v in deltas.items()})
    assert list(read) == list(deltas) and read["conv.weight"].dtype == np.float16


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be one of"):
        as_sent({"w": np.zeros(1, np.float32)}, "bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="precision must be one of"):
        wire_arrays({"w": torch.zeros(1)}, "bf16")  # type: ignore[arg-type]


def test_a_delta_is_trained_minus_base_and_an_update_files_is_zero_where_training_left_an_entry_out() -> None:
    # Prepare: a base of a frozen weight, a trained weight (a live parameter) and a counter; training changed the last two
    base = {"frozen.weight": torch.tensor([0.5, -0.25]), "head.weight": torch.nn.Parameter(torch.tensor([1.0, 2.0])),
            "bn.num_batches_tracked": torch.tensor(3)}
    trained = {"head.weight": torch.tensor([1.5, 1.0]), "bn.num_batches_tracked": torch.tensor(5)}
    # Execute
    streamed, carried = delta(trained, base), delta(trained, base, every_entry=True)
    # Assert: the simulator's streams only the trained entries; an update file's has every base entry, in the base's order
    assert list(streamed) == list(trained) and list(carried) == list(base)
    assert torch.equal(streamed["head.weight"], torch.tensor([0.5, -1.0])) and not streamed["head.weight"].requires_grad
    assert torch.equal(carried["frozen.weight"], torch.zeros(2)) and int(carried["bn.num_batches_tracked"]) == 2
    assert carried["bn.num_batches_tracked"].dtype == torch.int64


def test_a_delta_of_no_entries_is_empty_or_all_zeros() -> None:
    # Prepare: a trained part with no integer entries leaves a packed update nothing aside
    base = {"w": torch.ones(3)}
    # Execute, Assert
    assert delta({}, base) == {}
    assert torch.equal(delta({}, base, every_entry=True)["w"], torch.zeros(3))


def test_a_delta_by_torch_is_numpys_difference_bit_for_bit() -> None:
    # Prepare: the values the simulator's worker processes once subtracted with numpy
    rng = np.random.default_rng(1)
    base, trained = (rng.standard_normal(10_000).astype(np.float32) for _ in range(2))
    # Execute
    moved = delta({"w": torch.from_numpy(trained)}, {"w": torch.from_numpy(base)})["w"].numpy()
    # Assert
    np.testing.assert_array_equal(moved.view(np.uint32), (trained - base).view(np.uint32))


def test_wire_arrays_cast_like_numpy_bit_for_bit_on_the_tiny_values_of_a_delta() -> None:
    # Prepare: delta-sized values, many of them fp16 subnormals, and an integer counter
    values = torch.from_numpy((np.random.default_rng(0).standard_normal(10_000) * 1e-5).astype(np.float32))
    tensors = {"w": values, "n": torch.tensor(3)}
    # Execute
    half, single = wire_arrays(tensors, "fp16"), wire_arrays(tensors, "fp32")
    # Assert
    np.testing.assert_array_equal(half["w"].view(np.uint16), values.numpy().astype(np.float16).view(np.uint16))
    assert single["w"].dtype == np.float32 and half["n"].dtype == np.int64 and int(half["n"]) == 3
    np.testing.assert_array_equal(half["w"], as_sent({"w": values.numpy()}, "fp16")["w"])


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_a_packed_delta_is_the_entries_deltas_on_the_wire_bit_for_bit(precision: Precision) -> None:
    # Prepare: two entries' trained and base values, and the same packed end to end
    rng = np.random.default_rng(2)
    base = {k: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for k, shape in (("a", (30, 4)), ("b", (5,)))}
    trained = {k: v + torch.from_numpy((rng.standard_normal(v.shape) * 1e-5).astype(np.float32)) for k, v in base.items()}
    # Execute
    packed = packed_delta(torch.cat([trained[k].reshape(-1) for k in "ab"]), torch.cat([base[k].reshape(-1) for k in "ab"]), precision)
    # Assert
    entries = wire_arrays(delta(trained, base), precision)
    np.testing.assert_array_equal(packed, np.concatenate([entries[k].reshape(-1) for k in "ab"]))
    assert packed.dtype == entries["a"].dtype == {"fp16": np.float16, "fp32": np.float32}[precision]


def test_importing_the_wire_loads_no_torch() -> None:
    # Prepare
    script = "import sys, facecore.federation.wire; print('torch' in sys.modules)"
    # Execute
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    # Assert: the server's validation processes read `widened` from here without torch
    assert loaded == "False"


def test_widening_by_table_is_exact_for_every_half_value() -> None:
    # Prepare: every 16-bit pattern: normals, subnormals, zeros, infinities and NaNs
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    # Execute
    wide = widened(every)
    # Assert
    np.testing.assert_array_equal(wide, every.astype(np.float32))  # NaNs compare equal here
    assert widened(np.array([1.5], np.float64)).dtype == np.float32
