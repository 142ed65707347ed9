"""The strategy a round configuration asks for: one factory for the round server and the simulator, so
a setting means the same aggregation in both."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from facecore.federation.config import AggregationSettings, RoundConfig, SpreadoutSettings
from facecore.federation.strategies.base import Strategy
from facecore.federation.strategies.coordinate import CoordinateMedian, TrimmedMean
from facecore.federation.strategies.dp_fedavg import DPFedAvg
from facecore.federation.strategies.fedavg import FedAvg
from facecore.federation.strategies.fedface import FedFace
from facecore.federation.strategies.norm_bounded import NormBoundedFedAvg
from facecore.federation.strategies.server_momentum import ServerMomentum
from facecore.losses import SpreadoutConfig


def backbone_aggregator(settings: AggregationSettings, expected_clients: int, seed: int | None = None) -> Strategy:
    """The backbone step `settings` asks for. `expected_clients` is DP-FedAvg's fixed denominator (the
    round's target participants); `seed` fixes its noise (None: fresh randomness, as a live server wants)."""
    if settings.method == "fedavg":
        return FedAvg(settings.weighting)
    if settings.method == "median":
        return CoordinateMedian()
    if settings.method == "trimmed_mean":
        return TrimmedMean(settings.trim_beta)
    if settings.method == "norm_bounded":
        return NormBoundedFedAvg(settings.max_update_norm)
    if settings.method == "dp_fedavg":
        return DPFedAvg(settings.max_update_norm, settings.dp_noise_multiplier, expected_clients, seed=seed)
    raise ValueError(f"unknown backbone aggregation {settings.method!r}")


def spreadout_of(settings: SpreadoutSettings) -> SpreadoutConfig:
    return SpreadoutConfig(**settings.model_dump())


def strategy_for(
    config: RoundConfig, *, seed: int | None = None, backbone: Strategy | None = None, previous_step: Mapping[str, np.ndarray] | None = None,
) -> Strategy:
    """FedFace (the backbone step, then spreadout on the class embeddings) or the backbone step alone.
    `backbone` replaces the configured step (secure aggregation brings its own unmasking sum). With
    server momentum, `previous_step` is the step that made the round's base (server_momentum.last_step)."""
    step = backbone if backbone is not None else backbone_aggregator(config.aggregation, config.target_participants, seed)
    if config.aggregation.server_momentum:
        step = ServerMomentum(step, config.aggregation.server_momentum, previous_step)
    if config.strategy == "fedface":
        return FedFace(spreadout_of(config.spreadout), backbone=step)
    return step
