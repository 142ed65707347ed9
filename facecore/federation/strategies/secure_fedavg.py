"""FedAvg over securely aggregated updates: the strategy only ever holds the masked running sum.

Each device sends y_u = quantize(n_u * delta_u) + masks (mod 2^32) over the model's float tensors
(facecore.secagg.weighted_update) and its n_u in the clear. The server adds the y_u as they stream in,
removes the masks with the survivors' shares, and divides by the sum of n_u: the sample-weighted
FedAvg of the survivors, to within the fixed-point rounding of 0.5 / scale per device and
coordinate. Integer buffers (BatchNorm's step counter) keep the base model's value.

Masking hides each input, so the server cannot check one; it checks their sum. Honest devices clip
delta_u to L2 norm `max_update_norm` (C) before weighting, so the unmasked sum is at most
sum(n_u) x C long, plus the rounding. A member that uploads anything else (random words, a scaled
update) makes the sum longer than that unless its own input is within about the same bound: the
round then fails (SecAggAborted) and publishes nothing. Within the bound, one member can still move
the mean by up to about 2 x C x n_u / sum(n_u) in L2.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, Weights
from facecore.federation.strategies.fedavg import cast_like
from facecore.secagg import Advert, SecAggAborted, dequantize, float_keys, unmask_total, unpack

MASKED = "masked"


@dataclass(frozen=True)
class UnmaskMaterial:
    """What the devices' step-1 and step-3 messages gave the server: public keys, who shared
    keys, and the survivors' answers (`{"s"|"b": {index: (x, share)}}` each)."""

    adverts: Mapping[int, Advert]
    key_sharers: Sequence[int]
    answers: Sequence[Mapping[str, Mapping[int, tuple[int, int]]]]
    threshold: int
    scale: float
    max_update_norm: float = math.inf


class SecureFedAvg(Strategy):
    """``ClientUpdate.weights[MASKED]`` is a device's uint32 masked vector, ``client_id`` its index."""

    name = "secure_fedavg"

    def __init__(self, material: UnmaskMaterial) -> None:
        self.material = material

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        keys = float_keys(base)
        length = sum(int(np.size(base[k])) for k in keys)
        total = np.zeros(length, np.uint32)
        senders: list[int] = []
        n_samples = 0
        metric_sums: dict[str, float] = {}
        metric_weights: dict[str, float] = {}
        for update in results:
            masked = np.asarray(update.weights[MASKED]).view(np.uint32)
            if masked.shape != (length,):
                raise ValueError(f"masked update of {update.client_id} has {masked.size} values, the model {length}")
            if update.client_id is None or int(update.client_id) not in self.material.adverts:
                raise ValueError(f"masked update from {update.client_id!r}, which is not a member of this round")
            total += masked
            senders.append(int(update.client_id))
            n_samples += update.n_samples
            for key, value in update.metrics.items():
                metric_sums[key] = metric_sums.get(key, 0.0) + float(value) * update.n_samples
                metric_weights[key] = metric_weights.get(key, 0.0) + update.n_samples
        if not senders:
            raise ValueError("no masked updates were sent")
        m = self.material
        summed = dequantize(unmask_total(total, senders, m.adverts, m.key_sharers, m.answers, m.threshold), m.scale)
        check_sum_bound(summed, n_samples, len(senders), m.max_update_norm, m.scale)
        mean = unpack(summed / n_samples, base, keys)
        weights: Weights = {
            k: cast_like(np.asarray(base[k], np.float64) + mean[k], np.asarray(base[k])) if k in mean else np.array(base[k], copy=True)
            for k in base
        }
        metrics = {k: metric_sums[k] / metric_weights[k] for k in metric_sums}
        return AggregateResult(weights=weights, n_clients=len(senders), n_samples=n_samples, metrics=metrics)


def check_sum_bound(summed: np.ndarray, n_samples: int, n_devices: int, max_update_norm: float, scale: float) -> None:
    """Fail the round when the unmasked sum of n_u x delta_u is longer than honest clipped inputs can make it:
    sum(n_u) x C, plus each device's rounding of at most 0.5 / scale per coordinate."""
    limit = n_samples * max_update_norm + n_devices * 0.5 / scale * math.sqrt(summed.size)
    length = float(np.linalg.norm(summed))
    if not length <= limit:
        raise SecAggAborted(f"the unmasked sum of the updates is {length:.4g} long, above the {limit:.4g} that {n_devices} inputs clipped to "
                            f"L2 {max_update_norm:g} and weighted by {n_samples} photos allow: a member's masked input was not a bounded "
                            "update; nothing is published")

