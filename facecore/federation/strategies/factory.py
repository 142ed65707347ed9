"""The strategy a round configuration asks for: one factory for the round server and the simulator, so
a setting means the same aggregation in both.

Invariant: the built chain is `RoundConfig.chain`, stage for stage (`chain_of(strategy_for(c)) ==
c.chain`): the factory reads the stage names and nests them inside out, so the order lives in one
place (`AggregationSettings.CHAIN_ORDER`) and combinations the config refuses are never built.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from facecore.federation.config import RoundConfig, SpreadoutSettings
from facecore.federation.strategies.base import Strategy
from facecore.federation.strategies.coordinate import CoordinateMedian, TrimmedMean
from facecore.federation.strategies.dp_fedavg import DPFedAvg, is_frozen_statistic
from facecore.federation.strategies.fedavg import FedAvg
from facecore.federation.strategies.fedface import FedFace
from facecore.federation.strategies.norm_bounded import NormClipping
from facecore.federation.strategies.secure_fedavg import SecureSum, UnmaskMaterial
from facecore.federation.strategies.server_momentum import ServerMomentum
from facecore.spreadout import SpreadoutConfig


def spreadout_of(settings: SpreadoutSettings) -> SpreadoutConfig:
    return SpreadoutConfig(**settings.model_dump())


def strategy_for(
    config: RoundConfig, *, seed: int | None = None, previous_step: Mapping[str, np.ndarray] | None = None,
    secure: UnmaskMaterial | None = None,
) -> Strategy:
    """The chain `config.chain` names. `seed` fixes DP noise (None: fresh randomness, as a live server
    wants); with server momentum, `previous_step` is the step that made the round's base
    (server_momentum.last_step); `secure` is a secure round's unmasking material, known once its
    devices have answered (without it such a chain gives instructions but refuses to aggregate)."""
    if secure is not None and not config.secure_aggregation.enabled:
        raise ValueError("unmasking material was given for a round without secure aggregation")
    settings = config.aggregation
    *wrappers, base = config.chain
    step: Strategy
    if base == "median":
        step = CoordinateMedian()
    elif base == "trimmed_mean":
        step = TrimmedMean(settings.trim_beta)
    else:
        step = FedAvg("devices" if base == "fedavg_by_devices" else "samples")
    for stage in reversed(wrappers):
        if stage == "secure_sum":
            step = SecureSum(step, secure)
        elif stage == "norm_clipping":
            # DP's clipping leaves BatchNorm statistics out of the norm: devices do not train them
            step = NormClipping(step, settings.max_update_norm, is_frozen_statistic if "dp_noise" in wrappers else None)
        elif stage == "dp_noise":
            # The fixed denominator is the round's target: the expected size of its Poisson sample
            step = DPFedAvg(step, settings.dp_noise_multiplier, config.target_participants, seed)
        elif stage == "server_momentum":
            step = ServerMomentum(step, settings.server_momentum, previous_step)
        elif stage == "spreadout":
            step = FedFace(step, spreadout_of(config.spreadout))
        else:
            raise ValueError(f"unknown aggregation stage {stage!r}")
    return step
