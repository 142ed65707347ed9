"""The strategy interface, the wrapper that composes strategies, and the records that cross them.

Weights are ``dict[str, np.ndarray]`` keyed like a torch ``state_dict`` so the same
strategy object serves the server (which streams updates from storage) and the
simulator (which holds them in memory).

Invariants: a :class:`Wrapper` holds exactly one ``inner`` strategy and passes through whatever it
does not change, so a chain reads outermost first (:func:`layers`), and each stage's ``name`` is the
name `RoundConfig.chain` gives it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

if TYPE_CHECKING:
    from facecore.federation.strategies.fedavg import RoundSum

Weights = dict[str, np.ndarray]
UpdateKind = Literal["delta", "full"]


@dataclass(frozen=True)
class ClientUpdate:
    """One client's training result for one round.

    ``weights`` is the trained backbone minus the round's base model when ``kind``
    is "delta" (the server's wire format), or the trained backbone itself when "full".
    """

    weights: Mapping[str, np.ndarray]
    n_samples: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    client_id: str | None = None
    embedding: np.ndarray | None = None
    kind: UpdateKind = "delta"

    def __post_init__(self) -> None:
        if isinstance(self.n_samples, bool) or not isinstance(self.n_samples, int) or self.n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer, got {self.n_samples!r}")


@dataclass(frozen=True)
class TrainInstructions:
    """What one selected client is asked to do this round (configure_train's output)."""

    server_round: int
    config: Mapping[str, Any]


@dataclass(frozen=True)
class AggregateResult:
    weights: Weights
    n_clients: int
    n_samples: int
    metrics: dict[str, float]


class Strategy(ABC):
    """Configure a round's training, then aggregate its results."""

    name: str = "strategy"

    def configure_train(
        self, server_round: int, clients: Sequence[str], config: Mapping[str, Any]
    ) -> dict[str, TrainInstructions]:
        """Per-client instructions; the default sends every client the same config."""
        return {client: TrainInstructions(server_round, dict(config)) for client in clients}

    @abstractmethod
    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        """New global weights from ``base`` and the round's results.

        ``results`` may be a generator that loads one update at a time; streaming
        strategies must consume it once and not keep references to past updates.
        """

    def aggregate_embeddings(self, W: np.ndarray, config: Any = None) -> np.ndarray:
        """New class-embedding matrix ``(C, D)`` from the round's ``W``; identity by default."""
        return np.array(W, copy=True)

    def aggregate_sum(self, server_round: int, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        """What :meth:`aggregate_train` publishes, from the round's weighted sum computed elsewhere (aggregation in
        tiers: :mod:`.tiers`). Only a chain that sums its updates can; a median or trimmed mean cannot."""
        raise TypeError(f"{self.name} does not aggregate a sum of its updates")


class Wrapper(Strategy):
    """A stage around one other strategy: it changes what enters ``inner`` or what comes out of it and
    passes the rest (per-client instructions, the embedding step) through unchanged."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner

    def configure_train(
        self, server_round: int, clients: Sequence[str], config: Mapping[str, Any]
    ) -> dict[str, TrainInstructions]:
        return self.inner.configure_train(server_round, clients, config)

    def aggregate_embeddings(self, W: np.ndarray, config: Any = None) -> np.ndarray:
        return self.inner.aggregate_embeddings(W, config)

    def aggregate_sum(self, server_round: int, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        """A wrapper that changes what :meth:`aggregate_train` publishes overrides this with the same change."""
        return self.inner.aggregate_sum(server_round, base, total)


S = TypeVar("S", bound=Strategy)


def layers(strategy: Strategy) -> list[Strategy]:
    """A chain's stages, outermost first: each wrapper, then the base strategy it ends in."""
    stages = [strategy]
    while isinstance(stages[-1], Wrapper):
        stages.append(stages[-1].inner)
    return stages


def layer_of(strategy: Strategy, kind: type[S]) -> S | None:
    """The outermost stage of a chain that is a ``kind``, or None: how a caller reaches one stage's
    state (server momentum's last step, DP's noise multiplier) without knowing the chain's shape."""
    return next((stage for stage in layers(strategy) if isinstance(stage, kind)), None)


def chain_of(strategy: Strategy) -> tuple[str, ...]:
    """The stage names of a built chain, outermost first; compare with `RoundConfig.chain`."""
    return tuple(stage.name for stage in layers(strategy))
