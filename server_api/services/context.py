"""Everything a request or background job needs, built once per app from Settings."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from facecore.federation.status import ParticipationStatus
from facecore.models.checkpoint import feature_center_of, load_backbone, shipped_verification
from server_api.core.config import Secrets, Settings
from server_api.core.db import make_engine, make_session_factory, run_migrations, session_scope, startup_lock, transaction
from server_api.core.limits import RequestLimits
from server_api.core.logging import get_logger
from server_api.core.metrics import Metrics
from server_api.core.security import TemplateCipher
from server_api.services.validation_pool import ValidationPool
from server_api.storage.blobs import BlobStore, make_private_dir
from server_api.storage.database_blobs import open_blob_store

log = get_logger("startup")


class VersionSpec(NamedTuple):
    """What an upload against a version is checked with."""

    spec: dict[str, Any]
    embedding_dim: int
    version_hash: str


@dataclass
class ServerContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    store: BlobStore
    cipher: TemplateCipher
    admin_token: str
    metrics: Metrics
    validation: ValidationPool
    last_nonce_prune: float = 0.0
    _limits: RequestLimits | None = None
    # Model versions are immutable, so their upload spec is read (and JSON-decoded) once per process.
    _version_specs: dict[int, VersionSpec] = field(default_factory=dict)

    @property
    def limits(self) -> RequestLimits:
        """Rate buckets and upload slots, made by :meth:`startup` (on PostgreSQL they are tables)."""
        if self._limits is None:
            raise RuntimeError("the server context has not started")
        return self._limits

    def version_spec(self, session: Session, version_id: int) -> VersionSpec:
        from server_api.crud import versions

        cached = self._version_specs.get(version_id)
        if cached is None:
            version = versions.get(session, version_id)
            if version is None:
                raise LookupError(f"model version {version_id} does not exist")
            cached = self._version_specs[version_id] = VersionSpec(version.spec, version.embedding_dim, version.version_hash)
        return cached

    @classmethod
    def create(cls, settings: Settings, secrets: Secrets) -> ServerContext:
        settings.check_aggregation()
        make_private_dir(settings.data_dir)  # the database, blobs and dev secrets: the server's user only
        engine = make_engine(settings.resolved_database_url())
        sessions = make_session_factory(engine)
        torch.set_num_threads(settings.torch_threads)
        return cls(
            settings=settings, engine=engine, sessions=sessions,
            store=open_blob_store(settings.blob_store, Path(settings.data_dir) / "blobs", engine),
            cipher=TemplateCipher(secrets.template_key), admin_token=secrets.admin_token,
            metrics=Metrics(lambda: _db_counts(sessions)), validation=ValidationPool(settings.validation_processes),
        )

    def startup(self) -> None:
        """Migrate, clean scratch files, create the first model version if there is none.
        Idempotent and safe to run from several workers at once."""
        run_migrations(self.engine)
        self._limits = RequestLimits.from_settings(self.settings, self.engine)
        self.store.clean_temp()
        self.bootstrap_model()
        self.validation.start()

    def bootstrap_model(self) -> None:
        from server_api.crud import audit, versions
        from server_api.services.model_store import store_model

        with session_scope(self.sessions) as session:
            if versions.current_version(session) is not None:
                return
        model = load_backbone(self.settings.model, backbone=self.settings.random_backbone)
        meta = {"source": self.settings.model, "feature_center": feature_center_of(model)}
        blobs = store_model(self.store, model, self.settings.export_onnx, meta=meta, verification=shipped_verification(model))
        # The first version, unless another worker created one first (checked under the startup lock).
        with session_scope(self.sessions) as session, transaction(session):
            startup_lock(session)
            version = versions.current_version(session)
            if version is None:
                version = versions.add_version(session, blobs, None)
                audit.record(session, "server", "model.bootstrapped", version=blobs.version_hash, source=self.settings.model)
        log.info("model ready", extra={"fields": {"version": version.version_hash, "backbone": version.backbone}})

    def close(self) -> None:
        self.validation.close()
        self.engine.dispose()


def _db_counts(sessions: sessionmaker[Session]) -> tuple[dict[str, int], dict[str, int]]:
    from server_api.crud import rounds as round_crud

    with session_scope(sessions) as session:
        rounds = round_crud.status_counts(session)
        active = round_crud.active_round_id(session)
        parts: dict[str, int] = {}
        if active is not None:
            tally = round_crud.tally(session, active)
            parts = {
                "checked_in": tally.checked_in,
                ParticipationStatus.SELECTED: tally.selected,
                ParticipationStatus.UPLOADED: tally.uploaded,
            }
        return rounds, parts  # read only: session_scope rolls it back
