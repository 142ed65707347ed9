"""`fedface bench secagg`: what secure aggregation costs a round, in bytes and seconds.

Bytes are exact: the sizes of the protocol's messages for n devices and a d-parameter update,
against the plain upload of the same update in fp16 and in fp32.

Seconds are measured with `facecore.federation.secagg` at the full update size:
- per device: share_keys, masked_input over every peer, unmask_shares;
- server: rebuilding the secrets and removing the masks of dropped devices.
Below `full_protocol_max` devices the whole protocol runs end to end, and its sum is checked.
Above it, one device's steps are timed and the server's cost is built from timed units (one
secret rebuilt, one mask stream, one vector sum) times their exact counts. The report says which.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from facecore.federation.secagg import (
    SHARE_BYTES,
    SHARE_CIPHERTEXT_BYTES,
    SecAggClient,
    combine_shares,
    dequantize,
    lagrange_weights,
    prg,
    quantize,
    split_secret,
    unmask_sum,
)
from fedface_bench.goals import with_goals
from fedface_bench.progress import QUIET, Progress

ADVERT_BYTES = 4 + 32 + 32  # index, two X25519 public keys
UNMASK_SHARE_BYTES = 4 + SHARE_BYTES  # whose secret, this device's share of it
SCALE, BOUND = 2.0**16, 1.0


def bytes_per_device(n: int, d: int, drop: float) -> dict[str, int]:
    """Up + down bytes of one surviving device in a round of n with a fraction `drop` dropping."""
    up = ADVERT_BYTES + (n - 1) * SHARE_CIPHERTEXT_BYTES + 4 * d + (n - 1) * UNMASK_SHARE_BYTES
    down = n * ADVERT_BYTES + (n - 1) * SHARE_CIPHERTEXT_BYTES + 4 * n  # adverts, routed shares, who dropped/survived
    return {"secagg_up": up, "secagg_down": down, "plain_up_fp16": 2 * d, "plain_up_fp32": 4 * d}


def _keyed(n: int, t: int) -> tuple[dict[int, SecAggClient], dict, float]:  # type: ignore[type-arg]
    clients = {i: SecAggClient(i, t) for i in range(1, n + 1)}
    adverts = {i: c.advertise() for i, c in clients.items()}
    inbox: dict[int, dict[int, bytes]] = {i: {} for i in clients}
    started = time.perf_counter()
    for u, client in clients.items():
        for v, blob in client.share_keys(adverts).items():
            inbox[v][u] = blob
    share_s = (time.perf_counter() - started) / n
    for v, client in clients.items():
        client.receive_shares(inbox[v])
    return clients, adverts, share_s


def full_round(n: int, d: int, drop: float, seed: int = 0) -> dict[str, Any]:
    """Every step for real; the unmasked sum is compared with the plain one."""
    t = n * 2 // 3 + 1
    rng = np.random.default_rng(seed)
    clients, adverts, share_s = _keyed(n, t)
    dropped = set(rng.choice(np.arange(1, n + 1), int(drop * n), replace=False).tolist())
    senders = [u for u in clients if u not in dropped]
    x = {u: rng.uniform(-0.01, 0.01, d) for u in senders}
    started = time.perf_counter()
    masked = {u: clients[u].masked_input(quantize(x[u], BOUND, SCALE), list(clients)) for u in senders}
    mask_s = (time.perf_counter() - started) / len(senders)
    answers = [clients[u].unmask_shares(sorted(dropped), senders) for u in senders]
    started = time.perf_counter()
    total = unmask_sum(masked, adverts, list(clients), answers, t)
    server_s = time.perf_counter() - started
    error = float(np.abs(dequantize(total, SCALE) - sum(x.values())).max())
    return {"mode": "full protocol", "threshold": t, "device_share_keys_s": share_s, "device_mask_s": mask_s,
            "server_unmask_s": server_s, "max_abs_error": error, "error_bound": len(senders) * 0.5 / SCALE}


def extrapolated_round(n: int, d: int, drop: float) -> dict[str, Any]:
    """One device's steps timed for real at size n; the server from timed units x exact counts."""
    t = n * 2 // 3 + 1
    one = SecAggClient(1, t)
    peers = {i: SecAggClient(i, t).advertise() for i in range(2, n + 1)}
    adverts = {1: one.advertise(), **peers}
    started = time.perf_counter()
    one.share_keys(adverts)
    share_s = time.perf_counter() - started
    one.receive_shares({})
    x = quantize(np.zeros(d), BOUND, SCALE)
    started = time.perf_counter()
    y = one.masked_input(x, list(adverts))
    mask_s = time.perf_counter() - started
    # server units
    shares = split_secret(bytes(32), n, t)
    started = time.perf_counter()
    weights = lagrange_weights([x_ for x_, _ in shares[:t]])
    weights_s = time.perf_counter() - started
    cache = {tuple(x_ for x_, _ in shares[:t]): weights}
    started = time.perf_counter()
    for _ in range(10):
        combine_shares(shares[:t], t, weights=cache)
    secret_s = (time.perf_counter() - started) / 10
    started = time.perf_counter()
    y = y - prg(bytes(32), d)
    stream_s = time.perf_counter() - started  # one mask stream generated and removed
    started = time.perf_counter()
    y = y + x
    add_s = time.perf_counter() - started  # one masked input added to the running sum
    survivors, dropped = n - int(drop * n), int(drop * n)
    # sum the inputs; rebuild each survivor's b and each dropped device's s key; remove the survivors'
    # self masks and, for each dropped device, its pairwise mask with every survivor
    server_s = survivors * add_s + weights_s + (survivors + dropped) * secret_s + (survivors + dropped * survivors) * stream_s
    units = {"lagrange_weights_s": weights_s, "rebuild_secret_s": secret_s, "mask_stream_s": stream_s, "add_s": add_s}
    return {"mode": "extrapolated from timed units", "threshold": t, "device_share_keys_s": share_s, "device_mask_s": mask_s,
            "server_unmask_s": server_s, "server_units": units}


def run_secagg_bench(devices: tuple[int, ...] = (100, 1000), dim: int = 1_022_720, drop: float = 0.1, full_protocol_max: int = 100,
                     progress: Progress = QUIET) -> dict[str, Any]:
    """One row per device count; secure aggregation has no speed goal here (`goals_met` is empty)."""
    rows = []
    for n in devices:
        mode = "every device for real" if n <= full_protocol_max else "one device's steps and the server's units, timed"
        progress(f"{n} devices, {dim:,} parameters: {mode}")
        if n <= full_protocol_max:
            # also the unit-cost model at the same size, so the extrapolated rows can be judged
            timing = full_round(n, dim, drop) | {"server_unmask_s_model": extrapolated_round(n, dim, drop)["server_unmask_s"]}
        else:
            timing = extrapolated_round(n, dim, drop)
        size = bytes_per_device(n, dim, drop)
        rows.append({
            "devices": n, "dim": dim, "drop": drop, **size, **timing,
            "up_ratio_vs_fp16": size["secagg_up"] / size["plain_up_fp16"], "up_ratio_vs_fp32": size["secagg_up"] / size["plain_up_fp32"],
            "expansion_vs_fp32_total": (size["secagg_up"] + size["secagg_down"]) / size["plain_up_fp32"],
        })
    return with_goals({"rows": rows}, {})


def describe(result: dict[str, Any]) -> str:
    lines = []
    for r in result["rows"]:
        lines.append(
            f"{r['devices']} devices, {r['dim']:,} params, {r['drop']:.0%} dropping ({r['mode']}, t={r['threshold']}): "
            f"up {r['secagg_up'] / 1e6:.2f} MB = {r['up_ratio_vs_fp32']:.3f}x fp32 / {r['up_ratio_vs_fp16']:.3f}x fp16; "
            f"down {r['secagg_down'] / 1e3:.0f} kB; device: share keys {r['device_share_keys_s']:.3f} s, mask {r['device_mask_s']:.3f} s; "
            f"server unmask {r['server_unmask_s']:.2f} s"
            + (f" (unit-cost model: {r['server_unmask_s_model']:.2f} s); sum error {r['max_abs_error']:.2e} "
               f"(bound {r['error_bound']:.2e})" if "max_abs_error" in r else "")
        )
    return "\n".join(lines)


__all__ = ["bytes_per_device", "describe", "run_secagg_bench"]
