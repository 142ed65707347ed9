"""A shard's partial sum as the replicas store it: read back to the same bits, and read without unpickling."""
from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
import pytest

from facecore.federation.strategies.fedavg import RoundSum, merge_sums
from server_api.services.aggregation_shards import partial_bytes, partial_from_bytes


def _partial(seed: int, **fields: object) -> RoundSum:
    rng = np.random.default_rng(seed)
    sums = {"layer1.0.conv.weight": rng.normal(size=(4, 3, 3, 3)), "fc.bias": rng.normal(size=7), "bn.num_batches_tracked": np.array(12.0)}
    values: dict[str, Any] = dict(total_weight=11.0 / 3, count=3, n_samples=11, metrics={"loss": 0.1 + seed / 7}, kind="delta",
                                  clipped=1, metric_weights={"loss": 2.5})
    return RoundSum(sums, **(values | fields))


@pytest.mark.parametrize("fields", [{}, {"metric_weights": None, "clipped": 0}, {"kind": None, "metrics": {}}])
def test_a_partial_sum_reads_back_to_the_same_bits(fields: dict[str, Any]) -> None:
    # Prepare
    partial = _partial(1, **fields)
    # Execute
    data = partial_bytes(partial)
    back = partial_from_bytes(data)
    # Assert: every field, and the sums' keys in order, dtype and bits; the bytes depend on the sum only
    assert list(back.sums) == list(partial.sums)
    for key, value in partial.sums.items():
        assert back.sums[key].dtype == np.float64 and back.sums[key].tobytes() == value.tobytes(), key
    assert (back.total_weight, back.count, back.n_samples, back.metrics, back.kind, back.clipped, back.metric_weights) == (
        partial.total_weight, partial.count, partial.n_samples, partial.metrics, partial.kind, partial.clipped, partial.metric_weights)
    assert partial_bytes(_partial(1, **fields)) == data


def test_partials_read_back_merge_as_the_originals() -> None:
    # Prepare
    parts = [_partial(seed) for seed in range(3)]
    # Execute
    merged, merged_back = merge_sums(parts), merge_sums(partial_from_bytes(partial_bytes(p)) for p in parts)
    # Assert
    assert merged.metrics == merged_back.metrics and merged.total_weight == merged_back.total_weight
    assert all(merged.sums[k].tobytes() == merged_back.sums[k].tobytes() for k in merged.sums)


def test_a_partial_holding_a_pickle_is_refused() -> None:
    # Prepare: an archive whose sum is an object array (np.save pickles it)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        entry = io.BytesIO()
        np.save(entry, np.array([{"x": 1}], dtype=object), allow_pickle=True)
        archive.writestr("sum_0.npy", entry.getvalue())
        meta = io.BytesIO()
        np.save(meta, np.frombuffer(b'{"keys": ["x"]}', dtype=np.uint8))
        archive.writestr("meta.npy", meta.getvalue())
    # Execute / Assert
    with pytest.raises(ValueError, match="allow_pickle"):
        partial_from_bytes(buffer.getvalue())
