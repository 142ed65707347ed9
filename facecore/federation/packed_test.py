"""Packed arrays: the layout's offsets, the mapping every consumer reads, and what a pack refuses."""
import pickle
import subprocess
import sys

import numpy as np
import pytest

from facecore.federation.packed import Layout, PackedArrays


def test_a_packed_update_reads_like_its_arrays_as_views_of_one_buffer() -> None:
    # Prepare: two floating entries and an integer counter kept aside
    layout = Layout.of({"conv": (2, 3), "bias": (4,)})
    flat = np.arange(10, dtype=np.float16)
    # Execute
    packed = PackedArrays(layout, flat, {"steps": np.array(7)})
    # Assert: the layout's order, then the rest; each entry a view of the buffer at its offset
    assert (layout.offsets, layout.sizes, layout.size) == ((0, 6), (6, 4), 10)
    assert list(packed) == ["conv", "bias", "steps"] and len(packed) == 3 and "bias" in packed and "other" not in packed
    np.testing.assert_array_equal(packed["conv"], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(packed["bias"], np.arange(6, 10))
    assert np.shares_memory(packed["bias"], flat) and int(packed["steps"]) == 7
    flat[6] = 100
    assert packed["bias"][0] == 100  # a view, not a copy


def test_equal_layouts_are_equal_keys_and_shapes() -> None:
    # Prepare, Execute
    a, b = Layout.of({"x": (2,), "y": (3, 1)}), Layout.of({"x": (2,), "y": (3, 1)})
    # Assert
    assert a == b and a != Layout.of({"x": (2,), "y": (1, 3)}) and a != Layout.of({"y": (3, 1), "x": (2,)})


def test_a_pack_refuses_a_buffer_that_is_not_its_layout_and_an_entry_in_both_parts() -> None:
    # Prepare
    layout = Layout.of({"w": (3,)})
    # Execute, Assert
    with pytest.raises(ValueError, match="3 values"):
        PackedArrays(layout, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="floating"):
        PackedArrays(layout, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="both packed and kept aside"):
        PackedArrays(layout, np.zeros(3, np.float32), {"w": np.zeros(3)})
    with pytest.raises(ValueError, match="2 keys but 1 shapes"):
        Layout(("a", "b"), ((1,),))


def test_a_pickled_pack_carries_its_buffer_once_and_reads_back_alike() -> None:
    # Prepare: a pack whose views were made by a lookup, as a worker's could be before it sends the pack
    layout = Layout.of({"w": (1000,)})
    packed = PackedArrays(layout, np.ones(1000, np.float32), {"steps": np.array(3)})
    assert packed["w"].sum() == 1000
    # Execute
    sent = pickle.dumps(packed, protocol=5)
    back = pickle.loads(sent)
    # Assert
    assert len(sent) < 2 * 4000 and back.layout == layout and int(back["steps"]) == 3
    np.testing.assert_array_equal(back.flat, packed.flat)
    assert np.shares_memory(back["w"], back.flat)


def test_importing_packed_arrays_loads_no_torch() -> None:
    # Prepare
    script = "import sys, facecore.federation.packed, facecore.federation.strategies.fedavg; print('torch' in sys.modules)"
    # Execute
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    # Assert: the server's summing processes read packed updates without torch
    assert loaded == "False"
