"""Pure parts: aggregation strategies, the tensor wire format, settings and secrets."""
from __future__ import annotations

import base64
import gc
import io
import json
import stat
import struct
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from facecore import tensorfile
from facecore.federation.strategies import ClientUpdate, FedAvg, FedFace, RunningWeightedSum
from facecore.losses import spreadout_loss, spreadout_optimize
from server_api.core.config import Settings, resolve_secrets
from server_api.errors import ConfigError


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"conv": rng.standard_normal((4, 3)).astype(np.float32), "bn.steps": np.array(10, dtype=np.int64)}


def test_running_sum_equals_direct_weighted_mean() -> None:
    # Prepare
    rng = np.random.default_rng(1)
    updates = [(_weights(rng), int(n)) for n in rng.integers(1, 50, size=7)]
    # Execute
    total = RunningWeightedSum()
    for weights, n in updates:
        total.add(weights, n)
    mean = total.mean()
    # Assert
    direct = sum(w["conv"].astype(np.float64) * n for w, n in updates) / sum(n for _, n in updates)
    np.testing.assert_allclose(mean["conv"], direct, rtol=1e-12)
    assert total.count == 7 and total.total_weight == sum(n for _, n in updates)


def test_fedavg_delta_and_full_updates_and_generator_input() -> None:
    # Prepare
    rng = np.random.default_rng(2)
    base = _weights(rng)
    deltas = [(_weights(rng), n) for n in (1, 3)]
    consumed: list[int] = []

    def stream():  # the server feeds a generator; nothing may be materialised by the strategy
        for index, (delta, n) in enumerate(deltas):
            consumed.append(index)
            yield ClientUpdate(weights=delta, n_samples=n, metrics={"loss": float(index)})

    # Execute
    result = FedAvg().aggregate_train(1, base, stream())
    full = FedAvg().aggregate_train(1, base, [ClientUpdate({k: base[k] + d[k] for k in base}, n, kind="full") for d, n in deltas])
    # Assert
    expected = base["conv"] + (deltas[0][0]["conv"] * 1 + deltas[1][0]["conv"] * 3) / 4
    np.testing.assert_allclose(result.weights["conv"], expected, atol=1e-6)
    assert result.weights["conv"].dtype == np.float32
    steps = 10 + round((deltas[0][0]["bn.steps"] + 3 * deltas[1][0]["bn.steps"]) / 4)  # integer buffers: rounded mean
    assert result.weights["bn.steps"].dtype == np.int64 and result.weights["bn.steps"] == steps
    np.testing.assert_allclose(full.weights["conv"], expected, atol=1e-6)
    assert (result.n_clients, result.n_samples, result.metrics) == (2, 4, {"loss": 0.75}) and consumed == [0, 1]


def test_fedavg_holds_a_constant_number_of_updates() -> None:
    # Prepare: a stream of fresh updates; weak references tell which are still alive.
    base = _weights(np.random.default_rng(5))
    refs: list[weakref.ref] = []

    def stream():  # type: ignore[no-untyped-def]
        for i in range(6):
            gc.collect()
            # Only the update just consumed may still be referenced (by the strategy's loop variable).
            assert all(ref() is None for ref in refs[:-1]), "FedAvg kept an older update alive"
            weights = {k: v + i for k, v in base.items()}
            refs.append(weakref.ref(weights["conv"]))
            yield ClientUpdate(weights, n_samples=i + 1)
            del weights

    # Execute
    result = FedAvg().aggregate_train(1, base, stream())
    # Assert
    assert result.n_clients == 6 and len(refs) == 6


def test_fedavg_rejects_mismatched_updates() -> None:
    rng = np.random.default_rng(3)
    base = _weights(rng)
    with pytest.raises(ValueError, match="mix"):
        FedAvg().aggregate_train(1, base, [ClientUpdate(base, 1), ClientUpdate(base, 1, kind="full")])
    with pytest.raises(ValueError, match="match"):
        FedAvg().aggregate_train(1, base, [ClientUpdate({"conv": base["conv"]}, 1)])
    with pytest.raises(ValueError, match="no updates"):
        FedAvg().aggregate_train(1, base, [])
    with pytest.raises(ValueError):
        ClientUpdate(base, 0)


def test_fedface_applies_spreadout_and_fedavg_leaves_embeddings() -> None:
    # Prepare: crowded identities, so spreadout has work to do.
    rng = np.random.default_rng(4)
    W = (np.ones((6, 16)) + 0.1 * rng.standard_normal((6, 16))).astype(np.float32)
    # Execute
    spread = FedFace().aggregate_embeddings(W)
    unchanged = FedAvg().aggregate_embeddings(W)
    # Assert
    expected = spreadout_optimize(torch.from_numpy(W), steps=10, lr=0.01, momentum=0.9, nu=0.3).numpy()
    np.testing.assert_allclose(spread, expected, atol=1e-7)
    assert spreadout_loss(torch.from_numpy(spread)) < spreadout_loss(torch.from_numpy(W))
    np.testing.assert_array_equal(unchanged, W)


def test_tensorfile_roundtrip_and_rejects_malformed_headers() -> None:
    # Prepare
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(7, dtype=np.int64), "c": np.ones(3, np.float16)}
    data = tensorfile.dumps(tensors, {"k": "v"})

    def header_file(header: dict, payload: bytes = b"") -> bytes:
        encoded = json.dumps(header).encode()
        return struct.pack("<Q", len(encoded)) + encoded + payload

    bad = {
        "overlap": header_file({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                               b"\0" * 8),
        "size mismatch": header_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
        "trailing bytes": header_file({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9),
        "negative shape": header_file({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
        "extra key": header_file({"x": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0], "code": "x"}}),
        "metadata not str": header_file({"__metadata__": {"n": 1}}),
        "not json": struct.pack("<Q", 3) + b"\xff\xfe{",
    }
    # Execute
    header = tensorfile.read_header(io.BytesIO(data), len(data))
    loaded = dict(tensorfile.iter_tensors(io.BytesIO(data), header))
    # Assert
    assert header.metadata == {"k": "v"} and header.data_start % 8 == 0
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape
        np.testing.assert_array_equal(loaded[name], value)
    for name, blob in bad.items():
        with pytest.raises(tensorfile.TensorFileError):
            tensorfile.read_header(io.BytesIO(blob), len(blob))
            pytest.fail(name)


def test_production_secrets_are_required_and_checked(tmp_path: Path) -> None:
    key = base64.b64encode(bytes(range(32))).decode()
    strong = "Zt4kQw9-Lp2mXc7vB1nR5sT8yU3oP6aD"
    with pytest.raises(ConfigError, match="FEDFACE_ADMIN_TOKEN is not set"):
        resolve_secrets(Settings(data_dir=tmp_path, template_key=key))
    with pytest.raises(ConfigError, match="weak"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token="changeme", template_key=key))
    with pytest.raises(ConfigError, match="at least 32"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token="Zt4kQw9#Lp2", template_key=key))
    with pytest.raises(ConfigError, match="no template key"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong))
    with pytest.raises(ConfigError, match="weak key"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key=base64.b64encode(b"\0" * 32).decode()))
    with pytest.raises(ConfigError, match="32 bytes"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key=base64.b64encode(b"short").decode()))
    (tmp_path / "key").write_text(key)
    secrets = resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key_file=tmp_path / "key"))
    assert secrets.template_key == bytes(range(32)) and "Zt4k" not in repr(secrets)


def test_dev_mode_generates_private_secrets_once(tmp_path: Path) -> None:
    # Execute
    first = resolve_secrets(Settings(data_dir=tmp_path / "d", dev=True))
    second = resolve_secrets(Settings(data_dir=tmp_path / "d", dev=True))
    # Assert
    assert first == second and len(first.admin_token) >= 32 and len(first.template_key) == 32
    for name in ("admin_token", "template.key"):
        assert stat.S_IMODE((tmp_path / "d" / name).stat().st_mode) == 0o600


def test_database_urls_are_normalised(tmp_path: Path) -> None:
    assert Settings(database_url="postgresql://u:p@h/db").resolved_database_url() == "postgresql+psycopg://u:p@h/db"
    assert Settings(database_url="postgres://u@h/db").resolved_database_url() == "postgresql+psycopg://u@h/db"
    assert Settings(data_dir=tmp_path).resolved_database_url() == f"sqlite:///{tmp_path.resolve()}/fedface.db"
    with pytest.raises(ConfigError, match="unsupported"):
        Settings(database_url="mysql://x").resolved_database_url()
