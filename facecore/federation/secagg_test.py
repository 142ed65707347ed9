"""Secure aggregation: masks cancel, dropouts are recovered, single updates stay hidden."""
from __future__ import annotations

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.federation.secagg import (
    SecAggAborted,
    SecAggClient,
    combine_shares,
    dequantize,
    key_in_process,
    prg,
    quantize,
    split_secret,
    unmask_sum,
)

SCALE, BOUND = 2.0**20, 1.0


def _keyed(n: int, t: int) -> tuple[dict[int, SecAggClient], dict]:  # type: ignore[type-arg]
    clients = {i: SecAggClient(i, t) for i in range(1, n + 1)}
    return clients, key_in_process(clients)


def test_shamir_rebuilds_from_any_t_shares_and_refuses_fewer() -> None:
    secret = bytes(range(32))
    shares = split_secret(secret, 7, 4)
    assert combine_shares(shares[3:], 4) == secret
    assert combine_shares([shares[0], shares[2], shares[4], shares[6]], 4) == secret
    with pytest.raises(SecAggAborted, match="3 share"):
        combine_shares(shares[:3], 4)


def test_masks_cancel_exactly_when_nobody_drops() -> None:
    # Prepare
    rng = np.random.default_rng(0)
    clients, adverts = _keyed(6, 4)
    quantized = {u: quantize(rng.uniform(-0.5, 0.5, 257), BOUND, SCALE) for u in clients}
    # Execute
    masked = {u: c.masked_input(quantized[u], list(clients)) for u, c in clients.items()}
    answers = [c.unmask_shares([], list(clients)) for c in clients.values()]
    total = unmask_sum(masked, adverts, list(clients), answers, 4)
    # Assert: bit-exact mod 2^32
    expected = np.zeros(257, np.uint32)
    for q in quantized.values():
        expected += q
    np.testing.assert_array_equal(total, expected)


@pytest.mark.parametrize("when", ["after upload", "before upload"])
def test_a_third_dropping_still_gives_the_plain_sum(when: str) -> None:
    # Prepare: 12 devices, threshold 8; devices 3, 6, 9, 12 drop
    rng = np.random.default_rng(1)
    clients, adverts = _keyed(12, 8)
    x = {u: rng.uniform(-0.01, 0.01, 1000) for u in clients}
    dropped = [3, 6, 9, 12]
    stay = [u for u in clients if u not in dropped]
    # Execute: "after upload" devices sent y then vanished; "before upload" they never sent y
    senders = list(clients) if when == "after upload" else stay
    masked = {u: clients[u].masked_input(quantize(x[u], BOUND, SCALE), list(clients)) for u in senders}
    answers = [clients[u].unmask_shares([v for v in clients if v not in masked], list(masked)) for u in stay]
    got = dequantize(unmask_sum(masked, adverts, list(clients), answers, 8), SCALE)
    # Assert: within the fixed-point rounding of each summand
    plain = sum(x[u] for u in senders)
    assert np.abs(got - plain).max() <= len(senders) * 0.5 / SCALE


def test_below_the_threshold_the_round_aborts() -> None:
    clients, adverts = _keyed(6, 4)
    # a device refuses to help unmask fewer inputs than the threshold
    with pytest.raises(SecAggAborted, match="threshold is 4"):
        clients[1].unmask_shares([4, 5, 6], [1, 2, 3])
    # every input arrived, but only 3 devices stayed to answer: the server cannot rebuild the masks
    masked = {u: c.masked_input(np.zeros(8, np.uint32), list(clients)) for u, c in clients.items()}
    answers = [clients[u].unmask_shares([], list(clients)) for u in (1, 2, 3)]
    with pytest.raises(SecAggAborted, match="threshold is 4"):
        unmask_sum(masked, adverts, list(clients), answers, 4)
    with pytest.raises(SecAggAborted, match="threshold is 4"):
        SecAggClient(9, 4).share_keys({1: adverts[1], 2: adverts[2]})


def test_the_server_cannot_unmask_one_device() -> None:
    # Prepare
    rng = np.random.default_rng(2)
    clients, _ = _keyed(5, 3)
    x = quantize(rng.uniform(-0.5, 0.5, 20_000), BOUND, SCALE)
    # Execute
    y = clients[1].masked_input(x, list(clients))
    # Assert: (1) the masked vector is uniform noise to the server: no correlation with x
    assert abs(np.corrcoef(y.astype(np.float64), x.view(np.int32).astype(np.float64))[0, 1]) < 0.05
    # (2) no device hands out both secrets of one device, which is what unmasking it alone needs
    with pytest.raises(FaceCoreError, match="both dropped and surviving"):
        clients[2].unmask_shares([1], [1, 3])
    # (3) even after rebuilding device 1's self mask from t honest answers (it survived), what is
    # left still carries its pairwise masks and says nothing about x
    answers = [clients[u].unmask_shares([], [1, 3, 5]) for u in (2, 3, 4)]
    b = combine_shares([a["b"][1] for a in answers], 3)
    without_self_mask = y - prg(b, y.size)
    assert not np.array_equal(without_self_mask, x)
    assert abs(np.corrcoef(without_self_mask.astype(np.float64), x.view(np.int32).astype(np.float64))[0, 1]) < 0.05


def test_the_keystream_is_chacha20_deterministic_per_seed() -> None:
    seed = bytes(32)
    np.testing.assert_array_equal(prg(seed, 100), prg(seed, 100))
    assert not np.array_equal(prg(seed, 100), prg(bytes([1]) + bytes(31), 100))
