"""Aggregation strategies: pure numpy/torch code with no HTTP or database imports,
shared by the round server, the cross-device simulator and the cross-silo mode (Flower-style: configure, then aggregate).

- :mod:`.base`: the :class:`Strategy` ABC and the typed records passed to it.
- :mod:`.fedavg`: FedAvg as a streaming weighted running sum.
- :mod:`.fedface`: FedAvg (or a robust aggregator) for the backbone plus spreadout on the class embeddings.
- :mod:`.coordinate`: coordinate-wise median and trimmed mean (hold a round's updates in memory).
- :mod:`.norm_bounded`: equal-weight FedAvg of deltas clipped to an L2 bound (streams).
- :mod:`.dp_fedavg`: DP-FedAvg: clipped, summed over a fixed denominator, Gaussian noise; Poisson selection; its RDP accountant (streams).
- :mod:`.server_momentum`: heavy-ball momentum on any backbone step (FedAvgM); its state is the model lineage.
- :mod:`.pfm`, :mod:`.fedval`: cross-silo PFM and Federated Validation.
- :mod:`.factory`: the strategy a typed round configuration asks for; the server and the simulator both build theirs there.
"""
from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, TrainInstructions
from facecore.federation.strategies.coordinate import CoordinateMedian, TrimmedMean
from facecore.federation.strategies.dp_fedavg import DPFedAvg
from facecore.federation.strategies.factory import backbone_aggregator, spreadout_of, strategy_for
from facecore.federation.strategies.fedavg import FedAvg, RunningWeightedSum
from facecore.federation.strategies.fedface import FedFace
from facecore.federation.strategies.fedval import FederatedValidation, FVConfig, FVStep
from facecore.federation.strategies.norm_bounded import NormBoundedFedAvg
from facecore.federation.strategies.pfm import PFM, PFMResult, WeightedFedAvg
from facecore.federation.strategies.server_momentum import ServerMomentum, last_step

__all__ = [
    "PFM", "AggregateResult", "ClientUpdate", "CoordinateMedian", "DPFedAvg", "FVConfig", "FVStep", "FedAvg", "FedFace",
    "FederatedValidation", "NormBoundedFedAvg", "PFMResult", "RunningWeightedSum", "ServerMomentum", "Strategy", "TrainInstructions", "TrimmedMean",
    "WeightedFedAvg", "backbone_aggregator", "last_step", "spreadout_of", "strategy_for",
]
