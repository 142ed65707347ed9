"""Secure aggregation as the transport of FedAvg's sum: the strategy only ever holds the masked running sum.

Each device sends y_u = quantize(n_u * delta_u) + masks (mod 2^32) over the model's float tensors
(facecore.federation.secagg.weighted_update) and its n_u in the clear. The server adds the y_u as they stream in,
removes the masks with the survivors' shares, and divides by the sum of n_u: the sample-weighted
FedAvg of the survivors, to within the fixed-point rounding of 0.5 / scale per device and
coordinate. Integer buffers (BatchNorm's step counter) keep the base model's value.

Masking hides each input, so the server cannot check one; it checks their sum. Honest devices clip
delta_u to L2 norm `max_update_norm` (C) before weighting, so the unmasked sum is at most
sum(n_u) x C long, plus the rounding. A member that uploads anything else (random words, a scaled
update) makes the sum longer than that unless its own input is within about the same bound: the
round then fails (SecAggAborted) and publishes nothing. Within the bound, one member can still move
the mean by up to about 2 x C x n_u / sum(n_u) in L2.

In the chain this stage sits directly on FedAvg by samples: the server cannot clip an update it cannot
read (devices clip, the server bounds the sum), so norm clipping and DP noise cannot wrap it, and a
median or trimmed mean has no sum to receive. `RoundConfig` refuses those combinations.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from facecore.federation.secagg import Advert, SecAggAborted, dequantize, float_keys, unmask_total, unpack
from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, Wrapper
from facecore.federation.strategies.fedavg import FedAvg, MetricMeans, RoundSum, SumStrategy

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


class SecureSum(SumStrategy, Wrapper):
    """The secure aggregation stage: ``inner`` (FedAvg by samples) receives its sum unmasked from the
    devices' masked inputs instead of adding updates it can read. ``ClientUpdate.weights[MASKED]`` is a
    device's uint32 masked vector, ``client_id`` its index. ``material`` is None until the round has
    reached its unmasking step (a check-in asks only for instructions); aggregating without it is refused."""

    name = "secure_sum"
    inner: FedAvg

    def __init__(self, inner: Strategy, material: UnmaskMaterial | None) -> None:
        # Devices multiply their delta by their photo count before masking; a sum of those is FedAvg by samples.
        if type(inner) is not FedAvg or inner.each_client_once:
            raise TypeError(f"secure aggregation delivers the sum of photo-weighted updates: only FedAvg by samples can divide it, not {inner.name}")
        super().__init__(inner)
        self.material = material

    def summed(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> RoundSum:
        if self.material is None:
            raise ValueError("a secure round is aggregated with its unmasking material (the adverts, key sharers and answers)")
        keys = float_keys(base)
        length = sum(int(np.size(base[k])) for k in keys)
        total = np.zeros(length, np.uint32)
        senders: list[int] = []
        n_samples = 0
        metrics = MetricMeans()
        for update in results:
            masked = np.asarray(update.weights[MASKED]).view(np.uint32)
            if masked.shape != (length,):
                raise ValueError(f"masked update of {update.client_id} has {masked.size} values, the model {length}")
            if update.client_id is None or int(update.client_id) not in self.material.adverts:
                raise ValueError(f"masked update from {update.client_id!r}, which is not a member of this round")
            total += masked
            senders.append(int(update.client_id))
            n_samples += update.n_samples
            metrics.add(update.metrics, update.n_samples)
        if not senders:
            raise ValueError("no masked updates were sent")
        m = self.material
        summed = dequantize(unmask_total(total, senders, m.adverts, m.key_sharers, m.answers, m.threshold), m.scale)
        check_sum_bound(summed, n_samples, len(senders), m.max_update_norm, m.scale)
        return RoundSum(unpack(summed, base, keys), n_samples, len(senders), n_samples, metrics.means())

    def publish(self, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        return self.inner.publish(base, total)


def check_sum_bound(summed: np.ndarray, n_samples: int, n_devices: int, max_update_norm: float, scale: float) -> None:
    """Fail the round when the unmasked sum of n_u x delta_u is longer than honest clipped inputs can make it:
    sum(n_u) x C, plus each device's rounding of at most 0.5 / scale per coordinate."""
    limit = n_samples * max_update_norm + n_devices * 0.5 / scale * math.sqrt(summed.size)
    length = float(np.linalg.norm(summed))
    if not length <= limit:
        raise SecAggAborted(f"the unmasked sum of the updates is {length:.4g} long, above the {limit:.4g} that {n_devices} inputs clipped to "
                            f"L2 {max_update_norm:g} and weighted by {n_samples} photos allow: a member's masked input was not a bounded "
                            "update; nothing is published")

