"""Aggregation strategies: pure numpy/torch code with no HTTP or database imports,
shared by the round server and the simulator (Flower-style: configure, then aggregate).

- :mod:`.base`: the :class:`Strategy` ABC and the typed records passed to it.
- :mod:`.fedavg`: FedAvg as a streaming weighted running sum.
- :mod:`.fedface`: FedAvg for the backbone plus spreadout on the class embeddings.

Later algorithms (PFM/FV for cross-silo, coordinate median and other robust
aggregators) are new modules implementing the same ABC; robust ones may need to
materialise all updates, which the ``Iterable`` argument allows.
"""
from server_api.strategies.base import AggregateResult, ClientUpdate, Strategy, TrainInstructions
from server_api.strategies.fedavg import FedAvg, RunningWeightedSum
from server_api.strategies.fedface import FedFace
from server_api.strategies.fedval import FederatedValidation, FVConfig, FVStep
from server_api.strategies.pfm import PFM, PFMResult, WeightedFedAvg

STRATEGIES: dict[str, type[Strategy]] = {"fedavg": FedAvg, "fedface": FedFace}

__all__ = [
    "PFM", "STRATEGIES", "AggregateResult", "ClientUpdate", "FVConfig", "FVStep", "FedAvg", "FedFace", "FederatedValidation",
    "PFMResult", "RunningWeightedSum", "Strategy", "TrainInstructions", "WeightedFedAvg",
]
