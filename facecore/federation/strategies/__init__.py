"""Aggregation strategies: pure numpy/torch code with no HTTP or database imports,
shared by the round server, the cross-device simulator and the cross-silo mode (Flower-style: configure, then aggregate).

A round's aggregation is a chain: one base strategy inside wrappers (:class:`~.base.Wrapper`), each
passing through what it does not change. `RoundConfig.chain` names it and :func:`strategy_for` builds
it; the wrappers always nest in this order, outermost first:

1. ``spreadout`` (:class:`FedFace`): spreadout on the class embeddings; the backbone step passes through.
2. ``server_momentum`` (:class:`ServerMomentum`): heavy-ball momentum on the step the stages inside publish.
   Outside the noise, it is post-processing of a private release.
3. ``dp_noise`` (:class:`DPFedAvg`): divides the sum of clipped updates by the fixed expected count and
   adds Gaussian noise; its accountant is :func:`.dp_fedavg.epsilon_of_history`. Needs ``norm_clipping``
   around FedAvg by devices directly beneath it: its noise is calibrated to one clipped update.
4. ``norm_clipping`` (:class:`NormClipping`): clips each delta before it enters the sum; streams.
5. ``secure_sum`` (:class:`SecureSum`): the sum arrives masked and is unmasked as a whole (Bonawitz et al.).
   The server cannot read an update, so it sits directly on FedAvg by samples and nothing clips inside it.

Bases: ``fedavg_by_samples`` / ``fedavg_by_devices`` (:class:`FedAvg`, a streaming weighted sum),
``median`` and ``trimmed_mean`` (:mod:`.coordinate`, which hold a round's updates in memory and take no
wrapper that needs a sum). Every stage except those two streams: the server holds one update at a time.
The configured methods are chains: ``norm_bounded`` = norm_clipping > fedavg_by_devices, ``dp_fedavg`` =
dp_noise > norm_clipping > fedavg_by_devices; ``strategy: fedface`` adds spreadout.

- :mod:`.base`: the :class:`Strategy` ABC, :class:`~.base.Wrapper`, the typed records, :func:`layers`, :func:`layer_of`, :func:`chain_of`.
- :mod:`.fedavg`: FedAvg and :class:`~.fedavg.SumStrategy` (sum, then publish) that the sum's wrappers build on.
- :mod:`.pfm`, :mod:`.fedval`: cross-silo PFM and Federated Validation.
- :mod:`.factory`: the chain a typed round configuration names; the server and the simulator both build theirs there.
- :mod:`.tiers`: aggregation in tiers: the chain's summing stage over fixed shards, the partial sums merged in shard
  order, the stages outside the sum once on the merged sum (:meth:`~.base.Strategy.aggregate_sum`).
"""
from facecore.federation.strategies.base import (
    AggregateResult,
    ClientUpdate,
    Strategy,
    TrainInstructions,
    Wrapper,
    chain_of,
    layer_of,
    layers,
)
from facecore.federation.strategies.coordinate import CoordinateMedian, TrimmedMean
from facecore.federation.strategies.dp_fedavg import DPFedAvg, dp_fedavg
from facecore.federation.strategies.factory import spreadout_of, strategy_for
from facecore.federation.strategies.fedavg import FedAvg, RoundSum, RunningWeightedSum, SumStrategy
from facecore.federation.strategies.fedface import FedFace
from facecore.federation.strategies.fedval import FederatedValidation, FVConfig, FVStep
from facecore.federation.strategies.norm_bounded import NormClipping
from facecore.federation.strategies.pfm import PFM, PFMResult, WeightedFedAvg
from facecore.federation.strategies.secure_fedavg import SecureSum, UnmaskMaterial
from facecore.federation.strategies.server_momentum import ServerMomentum, last_step

__all__ = [
    "PFM", "AggregateResult", "ClientUpdate", "CoordinateMedian", "DPFedAvg", "FVConfig", "FVStep", "FedAvg", "FedFace",
    "FederatedValidation", "NormClipping", "PFMResult", "RoundSum", "RunningWeightedSum", "SecureSum", "ServerMomentum", "Strategy",
    "SumStrategy", "TrainInstructions", "TrimmedMean", "UnmaskMaterial", "WeightedFedAvg", "Wrapper", "chain_of", "dp_fedavg",
    "last_step", "layer_of", "layers", "spreadout_of", "strategy_for",
]
