"""The typed configuration of a round: what an operator opens a round with, what the server stores
and aggregates by, and what the simulator runs, so there is one definition of each setting.

Invariants: pydantic only (no HTTP, database or torch). Every model forbids unknown fields and bounds
every number; `RoundConfig` checks the settings against each other. The JSON form of a `RoundConfig`
is what the database holds: renaming a field is a data migration.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from facecore.federation.quantize import BITS


def is_unit_vector(values: Sequence[float]) -> bool:
    """A feature centre's check, on the server that sends it and on the device that trains with it."""
    return len(values) > 0 and abs(math.fsum(x * x for x in values) - 1) < 1e-3


Weighting = Literal["samples", "devices"]  # FedAvg's: by each update's training photos, or each device once


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalSettings(StrictModel):
    """What each selected device trains with; sent in its check-in as `local`."""


    epochs: int = Field(default=1, ge=1, le=100, description="epochs each device trains over its own photos")
    steps: int | None = Field(default=None, ge=1, le=100_000, description="cap on each device's optimiser steps a round (unset: whole epochs)")
    lr: float = Field(default=0.01, gt=0, le=10, description="the devices' local learning rate")
    margin: float = Field(default=0.9, ge=-1, le=1, description="FedFace positive-loss margin on the cosine")
    batch_size: int = Field(default=32, ge=1, le=1024, description="photos in each of a device's optimiser steps")
    trainable_blocks: int | None = Field(
        default=None, ge=0, le=64,
        description="frozen prefix: devices train, and send, only the backbone's last K blocks and its head (the prefix sends nothing); unset: all",
    )
    train_embedding: bool = Field(
        default=True,
        description="true (on): devices train their class embedding too; false (off): each keeps its enrolled template and trains only "
        "the backbone towards it",
    )
    upload_bits: int | None = Field(
        default=None, ge=4, le=8,
        description="8 or 4: devices send each trained weight in that many bits with a scale a row, and carry the rounding "
        "to their next update (error feedback); unset: fp16",
    )
    download_bits: int | None = Field(
        default=None, ge=8, le=8,
        description="8: devices download the round's model as int8 weights with a scale per output channel (half of fp16's bytes) "
        "and train from them; unset: fp16",
    )
    feature_center: list[float] | None = Field(
        default=None, max_length=4096,
        description="a unit vector (a fixed mean face feature): the positive loss runs on features and template both moved by minus it",
    )

    @model_validator(mode="after")
    def _unit_center(self) -> LocalSettings:
        if self.feature_center is not None and not is_unit_vector(self.feature_center):
            raise ValueError("feature_center must be a unit vector")
        if self.upload_bits not in (None, *BITS):
            raise ValueError(f"upload_bits must be {' or '.join(map(str, BITS))}")
        return self


class SpreadoutSettings(StrictModel):
    nu: float = Field(default=0.3, ge=-1, le=1, description="spreadout pushes the class embeddings below this cosine")
    steps: int = Field(default=10, ge=0, le=10_000, description="the server's spreadout steps a round (0: none)")
    lr: float = Field(default=0.01, gt=0, le=100, description="the server's learning rate on the class embeddings")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="the server's SGD momentum on the class embeddings")
    center: bool = Field(default=False, description="take the direction all class embeddings share out of them before spreadout")


class AggregationSettings(StrictModel):
    """How backbone updates are combined. ``fedavg`` streams; ``median`` and ``trimmed_mean``
    resist a minority of malicious devices but hold the round's updates in memory;
    ``norm_bounded`` clips each delta to ``max_update_norm`` and still streams; ``dp_fedavg`` clips
    to ``max_update_norm``, averages with equal weights and adds Gaussian noise (user-level DP).
    ``weighting`` is fedavg's: by each update's training photos (McMahan et al.), or each device once,
    so that an owner with a hundred photos does not steer the shared model alone.

    Each method is a chain of stages (:meth:`stages`): a base (FedAvg by samples or by devices, the
    median, the trimmed mean) inside wrappers that always nest in ``CHAIN_ORDER``, outermost first."""

    # Outermost first. Spreadout touches only the class embeddings. Momentum steps from what the
    # noise published (post-processing: no privacy cost). DP noise needs the sum of clipped updates.
    # Clipping must see each update before the sum, and secure aggregation delivers only the sum.
    CHAIN_ORDER: ClassVar[tuple[str, ...]] = ("spreadout", "server_momentum", "dp_noise", "norm_clipping", "secure_sum")

    method: Literal["fedavg", "median", "trimmed_mean", "norm_bounded", "dp_fedavg"] = "fedavg"
    weighting: Weighting = Field(
        default="samples", description="fedavg: each update counts by its training photos (samples) or once (devices)",
    )
    trim_beta: float = Field(default=0.2, ge=0, lt=0.5, description="trimmed_mean: fraction dropped at each end")
    max_update_norm: float = Field(default=1.0, gt=0, le=1e6, description="norm_bounded and dp_fedavg: L2 bound on each delta")
    dp_noise_multiplier: float = Field(default=1.0, ge=0, le=1000, description="dp_fedavg: noise std / clip norm (z)")
    dp_delta: float = Field(default=1e-5, gt=0, lt=1, description="dp_fedavg: the delta epsilon is reported at")
    server_momentum: float = Field(
        default=0.0, ge=0, lt=1,
        description="heavy-ball momentum on the round's step: the step that made the base model, times this, is added to it",
    )

    @model_validator(mode="after")
    def _weighting_applies(self) -> AggregationSettings:
        if self.weighting == "devices" and self.method != "fedavg":
            raise ValueError(f"weighting 'devices' is fedavg's; {self.method} weighs updates its own way")
        return self

    def stages(self, *, spreadout: bool, secure: bool) -> tuple[str, ...]:
        """The chain these settings ask for, outermost first; clipped methods count each device once."""
        clipped = self.method in ("norm_bounded", "dp_fedavg")
        base: str
        if self.method in ("median", "trimmed_mean"):
            base = self.method
        else:
            base = "fedavg_by_devices" if clipped or self.weighting == "devices" else "fedavg_by_samples"
        wanted = {"spreadout": spreadout, "server_momentum": self.server_momentum > 0, "dp_noise": self.method == "dp_fedavg",
                  "norm_clipping": clipped, "secure_sum": secure}
        return (*(stage for stage in self.CHAIN_ORDER if wanted[stage]), base)

    def secure_conflict(self) -> str | None:
        """Why these settings cannot run under secure aggregation, in one line; None when they can."""
        if self.method in ("median", "trimmed_mean"):
            return f"secure aggregation reveals only the sum of the updates, so only fedavg can combine them, not {self.method} (it needs each update)"
        if self.method == "norm_bounded":
            return ("norm_bounded clips each update on the server and secure aggregation hides them "
                    "(devices clip to secure_aggregation.max_update_norm instead): use fedavg")
        if self.method == "dp_fedavg":
            return "dp_fedavg's noise is calibrated to updates the server clips one by one and secure aggregation hides them: use one or the other"
        if self.weighting != "samples":
            return "secure aggregation sums updates the devices weighted by their photos: use weighting 'samples'"
        return None


class SecureAggregationSettings(StrictModel):
    """Bonawitz et al. secure aggregation of the backbone updates (facecore.federation.secagg): the server
    learns only the sum of the survivors' updates. After selection, devices advertise keys and
    share secrets within ``key_phase_s`` each, upload masked updates before the deadline, then
    answer the unmasking request within ``unmask_phase_s``. Fewer than ``threshold`` answers
    (``threshold_fraction`` of the devices that advertised, at least 2) fails the round."""

    enabled: bool = False
    threshold_fraction: float = Field(
        default=2 / 3, ge=0.5, lt=1, description="t = max(2, floor(fraction x advertisers) + 1); fewer advertisers than t fails the round",
    )
    key_phase_s: float = Field(default=30, ge=1, le=86400, description="seconds for each of the advertise and share-keys steps")
    unmask_phase_s: float = Field(default=60, ge=1, le=86400, description="seconds the unmasking step waits for answers")
    scale_bits: int = Field(default=14, ge=4, le=24, description="fixed point: updates are scaled by 2**scale_bits")
    max_update_norm: float = Field(
        default=10.0, gt=0, le=1e6, allow_inf_nan=False,
        description="L2 bound on each device's backbone delta: devices clip to it, and a round whose unmasked sum is longer than "
        "the sum over uploaders of n_samples x this bound fails and publishes nothing",
    )


class RoundConfig(StrictModel):
    """One round's whole configuration: validated once when the round opens, stored as JSON with the
    round, and read back typed (`RoundConfig.model_validate(round.config)`)."""


    target_participants: int = Field(default=10, ge=1, le=100_000, description="devices to select; aggregation starts when all have uploaded")
    min_participants: int = Field(default=2, ge=1, le=100_000, description="fewest uploaded updates that still make a round")
    deadline_s: float = Field(default=600, ge=1, le=7 * 86400, description="seconds from opening until uploads close")
    selection_window_s: float = Field(
        default=5, ge=0, le=86400, description="check-ins during this window compete fairly for the target slots"
    )
    strategy: Literal["fedface", "fedavg"] = "fedface"
    local: LocalSettings = Field(default_factory=LocalSettings)
    spreadout: SpreadoutSettings = Field(default_factory=SpreadoutSettings)
    aggregation: AggregationSettings = Field(default_factory=AggregationSettings)
    secure_aggregation: SecureAggregationSettings = Field(default_factory=SecureAggregationSettings)

    @model_validator(mode="after")
    def _consistent(self) -> RoundConfig:
        if self.min_participants > self.target_participants:
            raise ValueError("min_participants must not exceed target_participants")
        if self.selection_window_s >= self.deadline_s:
            raise ValueError("selection_window_s must be shorter than deadline_s")
        if self.secure_aggregation.enabled:
            if self.local.upload_bits is not None:
                raise ValueError("local.upload_bits is for plain uploads: secure aggregation sends its own fixed point (secure_aggregation.scale_bits)")
            if (conflict := self.aggregation.secure_conflict()) is not None:
                raise ValueError(conflict)
            if self.min_participants < 2:
                raise ValueError("secure aggregation needs min_participants >= 2: the sum of one update is that update")
            if self.selection_window_s + 2 * self.secure_aggregation.key_phase_s >= self.deadline_s:
                raise ValueError("deadline_s must leave time after selection and the two key steps (2 x key_phase_s)")
        return self

    @property
    def chain(self) -> tuple[str, ...]:
        """The aggregation stages this round runs, outermost first: `strategies.strategy_for` builds exactly these."""
        return self.aggregation.stages(spreadout=self.strategy == "fedface", secure=self.secure_aggregation.enabled)

    @property
    def uses_dp(self) -> bool:
        return self.aggregation.method == "dp_fedavg"


def training_seed(round_id: int, run_seed: int = 0) -> int:
    """The seed a device trains a round with (its shuffling and flips): the round's id on a live device,
    offset by the run's seed in a simulation so that seeds differ between simulated runs."""
    return round_id + run_seed * 1_000_003
