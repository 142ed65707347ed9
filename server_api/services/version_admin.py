"""The operator publishes a verification threshold, and a feature centre, for a model version.

The server holds no faces, so it cannot calibrate: the operator does, on public faces, with
`fedface admin model calibrate`, and sends the result here. The row's `verification` is the one home
of a published version's threshold: what devices read (`/v1/models/current`), what the operator's
version list shows and what the next round's version inherits. The version's files keep only the one
it shipped with (facecore.models.verification), since their bytes name the version. The feature centre
(the unit mean feature of public faces, facecore.eval.feature_center) is published and inherited the same way.

A threshold below the model's own FAR 10% point (`Verification.far_10_point`, from the card a bundled model
ships with, `facecore/weights/<name>.json`, kept through recalibrations and inherited by rounds) is refused
unless the operator forces it: devices would accept one impostor in ten or more. Without that figure only the
range [-1, 1] is checked.
"""
from __future__ import annotations

import dataclasses
import math

from sqlalchemy.orm import Session

from facecore.models.verification import Verification
from server_api.core.db import transaction
from server_api.core.logging import get_logger
from server_api.crud import audit
from server_api.crud import versions as version_crud
from server_api.errors import InvalidInput, NotFound
from server_api.tables import ModelVersion

log = get_logger("version_admin")


def set_verification(session: Session, version_hash: str, verification: Verification, force: bool = False) -> ModelVersion:
    """Replace the version's published threshold with one calibrated for it (no `calibrated_for`:
    it is this version's own). Its FAR 10% point, if it has one, stays; a threshold below it needs `force`."""
    threshold = verification.threshold
    if not (math.isfinite(threshold) and -1.0 <= threshold <= 1.0):
        raise InvalidInput(f"the threshold must be a cosine: a finite number in [-1, 1], got {threshold!r}")
    with transaction(session):
        version = version_crud.get_by_hash(session, version_hash)
        if version is None:
            raise NotFound(f"model version {version_hash} does not exist")
        stored = version.verification
        previous, floor = (None, None) if stored is None else (stored.threshold, stored.far_10_point)
        below = floor is not None and threshold < floor
        if below and not force:
            raise InvalidInput(
                f"threshold {threshold:g} is below this model's FAR 10% point, {floor:.4f}: devices would accept more than "
                'one impostor in ten; send "force": true to publish it anyway'
            )
        version.verification = dataclasses.replace(verification, far_10_point=floor, calibrated_for=None)
        audit.record(session, "admin", "model.calibrated", version=version_hash, threshold=threshold,
                     far=verification.far, previous_threshold=previous, forced_below_far_10=below)
    fields = {"version": version_hash, "threshold": threshold}
    if below:
        log.warning("verification threshold forced below the FAR 10% point", extra={"fields": fields | {"far_10_point": floor}})
    else:
        log.info("verification threshold set", extra={"fields": fields})
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
