"""FedAvg whose sum arrives through secure aggregation equals FedAvg over the survivors, to the fixed-point rounding."""
from __future__ import annotations

import numpy as np
import pytest

from facecore.federation.secagg import SecAggAborted, SecAggClient, key_in_process, mask_bound, quantize, weighted_update
from facecore.federation.strategies import ClientUpdate, FedAvg
from facecore.federation.strategies.secure_fedavg import MASKED, SecureSum, UnmaskMaterial, check_sum_bound

SCALE = 2.0**14


def _base(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "conv.weight": rng.standard_normal((4, 3)).astype(np.float32), "bn.steps": np.array(7, np.int64),
        "fc.bias": rng.standard_normal(5).astype(np.float32),
    }


def test_secure_fedavg_matches_fedavg_of_the_survivors() -> None:
    # Prepare: 5 devices share keys (t = 3); device 5 drops before uploading
    rng = np.random.default_rng(0)
    base = _base(rng)
    clients = {i: SecAggClient(i, 3) for i in range(1, 6)}
    adverts = key_in_process(clients)
    deltas = {
        u: {k: (rng.standard_normal(np.shape(v)) * 0.01).astype(np.float32) if v.dtype.kind == "f" else np.array(2, np.int64) for k, v in base.items()}
        for u in clients
    }
    samples = {u: 3 * u for u in clients}
    senders = [1, 2, 3, 4]
    bound = mask_bound(len(clients), SCALE)
    updates = [
        ClientUpdate({MASKED: clients[u].masked_input(quantize(weighted_update(deltas[u], samples[u]), bound, SCALE), list(clients)).view(np.int32)},
                     samples[u], {"loss": float(u)}, client_id=str(u))
        for u in senders
    ]
    answers = [clients[u].unmask_shares([5], senders) for u in (1, 2, 3)]
    strategy = SecureSum(FedAvg(), UnmaskMaterial(adverts, list(clients), answers, 3, SCALE))
    # Execute
    secure = strategy.aggregate_train(1, base, updates)
    plain = FedAvg().aggregate_train(1, base, [ClientUpdate(deltas[u], samples[u], {"loss": float(u)}) for u in senders])
    # Assert: float tensors agree to the rounding; integer buffers keep the base value
    for key in ("conv.weight", "fc.bias"):
        np.testing.assert_allclose(secure.weights[key], plain.weights[key], rtol=0, atol=len(senders) * 0.5 / SCALE / sum(samples[u] for u in senders) + 1e-7)
    assert secure.weights["bn.steps"] == 7
    assert secure.n_clients == 4 and secure.n_samples == plain.n_samples and secure.metrics == pytest.approx(plain.metrics)


def test_an_update_from_a_non_member_is_refused() -> None:
    rng = np.random.default_rng(1)
    base = _base(rng)
    strategy = SecureSum(FedAvg(), UnmaskMaterial({1: SecAggClient(1, 2).advertise()}, [1], [], 2, SCALE))
    with pytest.raises(ValueError, match="not a member"):
        strategy.aggregate_train(1, base, [ClientUpdate({MASKED: np.zeros(17, np.int32)}, 1, client_id="9")])


def test_the_sum_bound_passes_clipped_inputs_and_fails_a_scaled_one() -> None:
    # Prepare: three devices' weighted deltas, each clipped to L2 1 and weighted by 4 photos; one scaled by 100
    rng = np.random.default_rng(0)
    inputs = [4 * v / np.linalg.norm(v) for v in rng.standard_normal((3, 1000))]
    # Execute / Assert: the honest sum is within 12 x 1 (plus rounding); the scaled member's is not
    check_sum_bound(np.sum(inputs, axis=0), 12, 3, 1.0, SCALE)
    with pytest.raises(SecAggAborted, match="not a bounded update"):
        check_sum_bound(inputs[0] + inputs[1] + 100 * inputs[2], 12, 3, 1.0, SCALE)
