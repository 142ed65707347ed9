"""The operator publishes a verification threshold, and a feature centre, for a model version.

The server holds no faces, so it cannot calibrate: the operator does, on public faces, with
`fedface admin model calibrate`, and sends the result here. The row's `verification` is what devices
read (`/v1/models/current`) and what the next round's version inherits; the version's file keeps
the one it was published with, since its bytes name the version. The feature centre (the unit
mean feature of public faces, facecore.eval.feature_center) is published and inherited the same way.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from server_api.core.db import transaction
from server_api.core.logging import get_logger
from server_api.crud import audit
from server_api.crud import versions as version_crud
from server_api.errors import InvalidInput, NotFound
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


def set_feature_center(session: Session, version_hash: str, vector: list[float], source: str) -> ModelVersion:
    """Publish the centre the operator computed for this version on public faces; rounds opened on
    it (and on the versions they make, which inherit it) centre the devices' loss on it."""
    with transaction(session):
        version = version_crud.get_by_hash(session, version_hash)
        if version is None:
            raise NotFound(f"model version {version_hash} does not exist")
        if len(vector) != version.embedding_dim:
            raise InvalidInput(f"the feature centre has {len(vector)} values; model version {version_hash[:12]} embeds in {version.embedding_dim}")
        replaced = version.feature_center is not None
        version.feature_center = [float(x) for x in vector]
        audit.record(session, "admin", "model.feature_center", version=version_hash, source=source, replaced=replaced)
    log.info("feature centre set", extra={"fields": {"version": version_hash, "source": source}})
    return version
