"""What the operator page shows, read from the database in one session: rounds (newest first),
model versions with their published threshold and figures, and device counts. Read only: rows
come from crud and are turned into plain rows here, never through the API's response models.

Everything the charts plot is here too, from what the server already stores: a round's duration (its
timestamps) and its deadline as opened (its config), its uploads against its target (the participation rows),
what it changed (``change_norm`` in its summary, written at aggregation; absent for a failed round and
for rounds aggregated before it was recorded) and each version's published threshold."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from facecore.federation.status import ACTIVE_ROUND_STATUSES
from facecore.models.verification import FAR_10_KEY
from server_api.crud import devices as device_crud
from server_api.crud import rounds as round_crud
from server_api.crud import versions as version_crud
from server_api.tables import ModelVersion, Round


@dataclass(frozen=True)
class RoundRow:
    id: int
    status: str
    strategy: str
    aggregation: str
    secure: bool
    n_checked_in: int
    n_selected: int
    n_uploaded: int
    target: int
    minimum: int
    created_at: datetime
    closed_at: datetime | None
    duration_s: float  # opening to end; to now while the round is active
    deadline_s: float  # opening to its deadline, as the round was opened
    failure_reason: str | None
    base_version: str
    result_version: str | None
    metrics: dict[str, float]  # the devices' mean training figures (loss...), once completed
    change_norm: float | None  # L2 norm of the published backbone minus its base, once completed

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_ROUND_STATUSES


@dataclass(frozen=True)
class VersionRow:
    version: str
    backbone: str
    embedding_dim: int
    round_id: int | None
    created_at: datetime
    threshold: float | None
    far: float | None
    calibration: str | None
    threshold_inherited: bool  # a round's version still publishing its parent's threshold
    figures: dict[str, Any]  # any other published figure (LFW accuracy...) and the round's training metrics


@dataclass(frozen=True)
class OperatorView:
    now: datetime
    rounds: list[RoundRow]
    versions: list[VersionRow]
    devices: dict[str, int]


def _round_row(session: Session, round_: Round, now: datetime) -> RoundRow:
    tally = round_crud.tally(session, round_.id)
    base = version_crud.get(session, round_.base_version_id)
    result = version_crud.get(session, round_.result_version_id) if round_.result_version_id else None
    config = round_.config or {}
    end = round_.closed_at or now
    summary = round_.summary or {}
    change_norm = summary.get("change_norm")
    return RoundRow(
        id=round_.id,
        status=round_.status,
        strategy=round_.strategy,
        aggregation=(config.get("aggregation") or {}).get("method", "fedavg"),
        secure=bool((config.get("secure_aggregation") or {}).get("enabled")),
        n_checked_in=tally.checked_in,
        n_selected=tally.selected,
        n_uploaded=tally.uploaded,
        target=round_.target_participants,
        minimum=round_.min_participants,
        created_at=round_.created_at,
        closed_at=round_.closed_at,
        duration_s=max(0.0, (end - round_.created_at).total_seconds()),
        # As opened: an operator's early close moves deadline_at to the moment of closing.
        deadline_s=float(config.get("deadline_s") or (round_.deadline_at - round_.created_at).total_seconds()),
        failure_reason=round_.failure_reason,
        base_version=base.version_hash if base else "",
        result_version=result.version_hash if result else None,
        metrics={k: float(v) for k, v in (summary.get("metrics") or {}).items()},
        change_norm=float(change_norm) if isinstance(change_norm, int | float) else None,
    )


def _version_row(version: ModelVersion, rounds_by_id: dict[int, RoundRow]) -> VersionRow:
    verification = version.verification
    threshold, far, calibration, calibrated_for = (
        (None, None, None, None) if verification is None
        else (verification.threshold, verification.far, verification.calibration, verification.calibrated_for)
    )
    if calibrated_for is not None:  # a round's version: the threshold is its ancestor's until recalibrated
        calibration = f"inherited from {calibrated_for[:12]}: {calibration or '?'}"
    figures: dict[str, Any] = {} if verification is None or verification.far_10_point is None else {FAR_10_KEY: verification.far_10_point}
    produced_by = rounds_by_id.get(version.round_id) if version.round_id is not None else None
    if produced_by is not None:
        figures |= {f"round {produced_by.id} {name}": value for name, value in produced_by.metrics.items()}
    return VersionRow(
        version=version.version_hash,
        backbone=version.backbone,
        embedding_dim=version.embedding_dim,
        round_id=version.round_id,
        created_at=version.created_at,
        threshold=threshold,
        far=far,
        calibration=calibration,
        threshold_inherited=calibrated_for is not None,
        figures=figures,
    )


def build(session: Session, now: datetime, round_limit: int = 50, version_limit: int = 20) -> OperatorView:
    rounds = [_round_row(session, r, now) for r in round_crud.list_rounds(session, round_limit)]
    by_id = {row.id: row for row in rounds}
    versions = [_version_row(v, by_id) for v in version_crud.list_versions(session, version_limit)]
    return OperatorView(now=now, rounds=rounds, versions=versions, devices=device_crud.device_counts(session))
