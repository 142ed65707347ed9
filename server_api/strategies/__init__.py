"""Aggregation strategies: pure numpy/torch code with no HTTP or database imports,
shared by the round server and the simulator (Flower-style: configure, then aggregate).

- :mod:`.base`: the :class:`Strategy` ABC and the typed records passed to it.
- :mod:`.fedavg`: FedAvg as a streaming weighted running sum.
- :mod:`.fedface`: FedAvg (or a robust aggregator) for the backbone plus spreadout on the class embeddings.
- :mod:`.coordinate`: coordinate-wise median and trimmed mean (hold a round's updates in memory).
- :mod:`.norm_bounded`: equal-weight FedAvg of deltas clipped to an L2 bound (streams).
- :mod:`.dp_fedavg`: DP-FedAvg: clipped, summed over a fixed denominator, Gaussian noise; Poisson selection; its RDP accountant (streams).
- :mod:`.pfm`, :mod:`.fedval`: cross-silo PFM and Federated Validation.
"""
from server_api.strategies.base import AggregateResult, ClientUpdate, Strategy, TrainInstructions
from server_api.strategies.coordinate import CoordinateMedian, TrimmedMean
from server_api.strategies.dp_fedavg import DPFedAvg
from server_api.strategies.fedavg import FedAvg, RunningWeightedSum
from server_api.strategies.fedface import FedFace
from server_api.strategies.fedval import FederatedValidation, FVConfig, FVStep
from server_api.strategies.norm_bounded import NormBoundedFedAvg
from server_api.strategies.pfm import PFM, PFMResult, WeightedFedAvg

STRATEGIES: dict[str, type[Strategy]] = {"fedavg": FedAvg, "fedface": FedFace}


def backbone_aggregator(
    method: str, trim_beta: float = 0.2, max_update_norm: float = 1.0, dp_noise_multiplier: float = 1.0, seed: int | None = None,
    expected_clients: int | None = None,
) -> Strategy:
    """The backbone step a round asked for (see server_api.schemas.AggregationSettings).
    `expected_clients`: DP-FedAvg's fixed denominator, the round's target participants."""
    if method == "fedavg":
        return FedAvg()
    if method == "median":
        return CoordinateMedian()
    if method == "trimmed_mean":
        return TrimmedMean(trim_beta)
    if method == "norm_bounded":
        return NormBoundedFedAvg(max_update_norm)
    if method == "dp_fedavg":
        if expected_clients is None:
            raise ValueError("dp_fedavg needs expected_clients, the fixed denominator of its mean")
        return DPFedAvg(max_update_norm, dp_noise_multiplier, expected_clients, seed=seed)
    raise ValueError(f"unknown backbone aggregation {method!r}")


__all__ = [
    "PFM", "STRATEGIES", "AggregateResult", "ClientUpdate", "CoordinateMedian", "DPFedAvg", "FVConfig", "FVStep", "FedAvg", "FedFace",
    "FederatedValidation", "NormBoundedFedAvg", "PFMResult", "RunningWeightedSum", "Strategy", "TrainInstructions", "TrimmedMean",
    "WeightedFedAvg", "backbone_aggregator",
]
