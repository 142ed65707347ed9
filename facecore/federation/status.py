"""Round and participation statuses, as the database stores them and the API reports them.

Invariants: the values are the stored strings (StrEnum members compare equal to them, so columns stay
plain strings and no migration is involved); no HTTP, no database, no torch.

Round lifecycle: open -> (selection) -> [unmasking ->] aggregating -> completed | failed, where
unmasking happens only in secure-aggregation rounds.
"""
from __future__ import annotations

from enum import StrEnum


class RoundStatus(StrEnum):
    OPEN = "open"
    UNMASKING = "unmasking"
    AGGREGATING = "aggregating"
    COMPLETED = "completed"
    FAILED = "failed"


# A round holds the single active slot until it ends in one of the final statuses.
ACTIVE_ROUND_STATUSES: tuple[RoundStatus, ...] = (RoundStatus.OPEN, RoundStatus.UNMASKING, RoundStatus.AGGREGATING)
FINAL_ROUND_STATUSES: tuple[RoundStatus, ...] = (RoundStatus.COMPLETED, RoundStatus.FAILED)


class ParticipationStatus(StrEnum):
    CANDIDATE = "candidate"  # stored only: checked in before selection ran
    WAITING = "waiting"  # reported only: what check-in says of a candidate
    SELECTED = "selected"
    NOT_SELECTED = "not_selected"
    UPLOADED = "uploaded"


# The devices a round chose, whether or not their update has arrived yet.
CHOSEN_STATUSES: tuple[ParticipationStatus, ...] = (ParticipationStatus.SELECTED, ParticipationStatus.UPLOADED)
