"""The operator publishes a verification threshold for a model version.

The server holds no faces, so it cannot calibrate: the operator does, on public faces, with
`fedface admin model calibrate`, and sends the result here. The row's `verification` is what devices
read (`/v1/models/current`) and what the next round's version inherits; the version's file keeps
the one it was published with, since its bytes name the version.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from server_api.core.db import transaction
from server_api.core.logging import get_logger
from server_api.crud import audit
from server_api.crud import versions as version_crud
from server_api.errors import NotFound
from server_api.models import ModelVersion

log = get_logger("version_admin")


def set_verification(session: Session, version_hash: str, verification: dict[str, Any]) -> ModelVersion:
    """Replace the version's published threshold with one calibrated for it (no `calibrated_for`:
    it is this version's own)."""
    with transaction(session):
        version = version_crud.get_by_hash(session, version_hash)
        if version is None:
            raise NotFound(f"model version {version_hash} does not exist")
        previous = (version.verification or {}).get("threshold")
        version.verification = dict(verification)
        audit.record(session, "admin", "model.calibrated", version=version_hash, threshold=verification["threshold"],
                     far=verification["far"], previous_threshold=previous)
    log.info("verification threshold set", extra={"fields": {"version": version_hash, "threshold": verification["threshold"]}})
    return version
