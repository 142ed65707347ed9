"""Model version rows: queries only; the caller owns the transaction.

A row is written only after its blobs exist (services.model_store).
"""
from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from facecore.models.verification import Verification
from server_api.tables import ModelVersion, table_of


class VersionFiles(Protocol):
    """What a version row records about its blobs (services.model_store.VersionBlobs)."""

    @property
    def version_hash(self) -> str: ...
    @property
    def fp16_blob(self) -> str: ...
    @property
    def int8_blob(self) -> str | None: ...
    @property
    def onnx_blob(self) -> str | None: ...
    @property
    def backbone(self) -> str: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def spec(self) -> dict[str, Any]: ...
    @property
    def verification(self) -> Verification | None: ...
    @property
    def feature_center(self) -> list[float] | None: ...


def current_version(session: Session) -> ModelVersion | None:
    # Versions are only added under the round lock or the startup lock, so the newest id is current.
    return session.execute(select(ModelVersion).order_by(ModelVersion.id.desc()).limit(1)).scalar_one_or_none()


def get_by_hash(session: Session, version_hash: str) -> ModelVersion | None:
    return session.execute(select(ModelVersion).where(ModelVersion.version_hash == version_hash)).scalar_one_or_none()


def get(session: Session, version_id: int) -> ModelVersion | None:
    return session.get(ModelVersion, version_id)


def list_versions(session: Session, limit: int) -> list[ModelVersion]:
    """The newest ``limit`` versions, newest first."""
    return list(session.execute(select(ModelVersion).order_by(ModelVersion.id.desc()).limit(limit)).scalars())


def _version_row(blobs: VersionFiles, round_id: int | None) -> ModelVersion:
    return ModelVersion(
        version_hash=blobs.version_hash, backbone=blobs.backbone, embedding_dim=blobs.embedding_dim,
        spec=blobs.spec, fp16_blob=blobs.fp16_blob, int8_blob=blobs.int8_blob, onnx_blob=blobs.onnx_blob, round_id=round_id,
        verification=blobs.verification, feature_center=blobs.feature_center,
    )


def add_version(session: Session, blobs: VersionFiles, round_id: int | None) -> ModelVersion:
    """Insert the row naming these blobs; flushed, so it has its id."""
    version = _version_row(blobs, round_id)
    session.add(version)
    session.flush()
    return version


def set_int8_blob(session: Session, version_id: int, digest: str) -> None:
    """Name the int8 file of a version published before int8 downloads (the blob is stored already)."""
    session.execute(update(table_of(ModelVersion)).where(ModelVersion.id == version_id, ModelVersion.int8_blob.is_(None)).values(int8_blob=digest))
