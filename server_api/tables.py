"""Database tables (SQLAlchemy 2.0 typed declarative). Schema changes need an Alembic
revision in ``server_api/migrations/versions``; a test compares the two.

Model weights and uploaded deltas are in the blob store (rows hold their sha256); with
``FEDFACE_BLOB_STORE=database`` that store is the ``blobs`` table, written before any row names
a blob. Class embeddings are AES-GCM ciphertexts.
"""
from __future__ import annotations

from datetime import UTC, datetime
from functools import cached_property
from typing import Any, cast

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, LargeBinary, MetaData, String, Table, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from facecore.federation.config import RoundConfig
from facecore.federation.status import RoundStatus
from facecore.models.verification import Verification


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both backends (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class VerificationJSON(TypeDecorator[Verification]):
    """A version's published Verification, stored as the JSON object it always was, so rows written
    before the record existed read unchanged."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Verification | None, dialect: Dialect) -> dict[str, Any] | None:
        return None if value is None else value.to_json()

    def process_result_value(self, value: Any, dialect: Dialect) -> Verification | None:
        return Verification.from_json(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


# Deterministic constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


def table_of(model: type[Base]) -> Table:
    """A model's Table, for Core statements that bypass the ORM's unit of work. DeclarativeBase types
    ``__table__`` as any FromClause; every model here declares ``__tablename__``, which makes a Table."""
    return cast(Table, model.__table__)


class Device(Base):
    __tablename__ = "devices"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    public_key: Mapped[bytes] = mapped_column(LargeBinary(32), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="active")  # active | unenrolled | removed (key revoked)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Round in which the device was last selected: drives rotation in participant choice.
    last_selected_round: Mapped[int | None] = mapped_column(default=None)


class Enrollment(Base):
    """A device's current class embedding (the biometric template), encrypted."""

    __tablename__ = "enrollments"
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    # 0 = as enrolled; otherwise the id of the round whose aggregation produced it.
    round_id: Mapped[int] = mapped_column(default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    id: Mapped[int] = mapped_column(primary_key=True)
    version_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the fp32 backbone blob
    backbone: Mapped[str] = mapped_column(String(64))
    embedding_dim: Mapped[int]
    # {param name: [dtype, shape]}: what uploads are validated against. Deferred: it is hundreds of
    # entries of JSON, and check-ins and downloads read the version row without needing it.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, deferred=True)
    fp16_blob: Mapped[str] = mapped_column(String(64))
    # NULL for a version published before int8 downloads existed, until a round that downloads int8 opens on it.
    int8_blob: Mapped[str | None] = mapped_column(String(64), default=None)
    onnx_blob: Mapped[str | None] = mapped_column(String(64), default=None)
    # The published verify threshold: the truth for this version (its files keep only the one it shipped with).
    verification: Mapped[Verification | None] = mapped_column(VerificationJSON(), default=None)
    # The unit mean feature of public faces (facecore.eval.feature_center) that rounds centre their loss on;
    # a round's version inherits its base's, so the rounds of one lineage share one centre.
    feature_center: Mapped[list[float] | None] = mapped_column(JSON, default=None)
    # The round that produced it (NULL for the bootstrap model); no FK, since rounds point here.
    round_id: Mapped[int | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Round(Base):
    __tablename__ = "rounds"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default=RoundStatus.OPEN)  # a RoundStatus
    # 1 while open or aggregating, NULL after: a unique column that allows one active round.
    active_slot: Mapped[int | None] = mapped_column(unique=True, default=1)
    config: Mapped[dict[str, Any]]
    strategy: Mapped[str] = mapped_column(String(32))
    target_participants: Mapped[int]
    min_participants: Mapped[int]
    base_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    result_version_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    selection_at: Mapped[datetime]
    selection_done: Mapped[bool] = mapped_column(default=False)
    deadline_at: Mapped[datetime]
    closed_at: Mapped[datetime | None] = mapped_column(default=None)
    failure_reason: Mapped[str | None] = mapped_column(String(500), default=None)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    # Secure aggregation only: when the unmasking step gives up waiting for more answers.
    unmask_deadline_at: Mapped[datetime | None] = mapped_column(default=None)
    # DP-FedAvg only, set at selection: the Poisson rate, the enrolled count it was computed from,
    # and the secret key of the per-device draws (never leaves the server).
    sample_rate: Mapped[float | None] = mapped_column(Float, default=None)
    population: Mapped[int | None] = mapped_column(default=None)
    sampling_key: Mapped[bytes | None] = mapped_column(LargeBinary(32), default=None)
    summary: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # Updates accepted so far, counted under the round's lock: whether the round is due, without counting
    # its participations at every upload (which made a round of N uploads cost N^2 row visits).
    n_uploaded: Mapped[int] = mapped_column(default=0, server_default="0")

    @cached_property
    def settings(self) -> RoundConfig:
        """`config` typed, parsed once per loaded row (a round's config never changes after it opens);
        validated when the round opened, so this only fails on a hand-edited row."""
        return RoundConfig.model_validate(self.config)


class Participation(Base):
    __tablename__ = "participations"
    __table_args__ = (UniqueConstraint("round_id", "device_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))  # a ParticipationStatus (never "waiting")
    checked_in_at: Mapped[datetime] = mapped_column(default=utcnow)


class Update(Base):
    __tablename__ = "updates"
    __table_args__ = (UniqueConstraint("round_id", "device_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    blob_sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int]
    n_samples: Mapped[int]
    metrics: Mapped[dict[str, Any]]
    # The uploaded class embedding (a template): encrypted, and dropped on unenroll.
    embedding_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SecAggMember(Base):
    """A selected device's part in a secure-aggregation round: its public keys (step 0), whether
    it shared its secrets (step 1), and its unmasking answer (step 3). No secret lives here."""

    __tablename__ = "secagg_members"
    __table_args__ = (UniqueConstraint("round_id", "device_id"), UniqueConstraint("round_id", "index"))
    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    index: Mapped[int]  # 1..n: the device's Shamir x coordinate
    c_public: Mapped[bytes] = mapped_column(LargeBinary(32))
    s_public: Mapped[bytes] = mapped_column(LargeBinary(32))
    shared_at: Mapped[datetime | None] = mapped_column(default=None)
    # {"s": {index: share}, "b": {index: share}}, shares as decimal strings (they exceed 64 bits)
    unmask_answer: Mapped[dict[str, Any] | None] = mapped_column(default=None)


class SecAggShare(Base):
    """One device's encrypted Shamir shares for another, routed by the server, which cannot read
    them (AES-GCM under a key only the two devices can derive). Deleted when the round ends."""

    __tablename__ = "secagg_shares"
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), primary_key=True)
    recipient: Mapped[int] = mapped_column(primary_key=True)
    sender: Mapped[int] = mapped_column(primary_key=True)
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)


class AuditEvent(Base):
    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(64))  # "admin", "device:<id>", "scheduler"
    action: Mapped[str] = mapped_column(String(64))
    round_id: Mapped[int | None] = mapped_column(default=None)
    device_id: Mapped[str | None] = mapped_column(String(32), default=None)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Nonce(Base):
    __tablename__ = "nonces"
    __table_args__ = (UniqueConstraint("subject", "nonce"), Index("ix_nonces_created_at", "created_at"))
    id: Mapped[int] = mapped_column(primary_key=True)
    subject: Mapped[str] = mapped_column(String(64))  # device id, or "key:<sha256 of public key>" when registering
    nonce: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EnrollmentToken(Base):
    """A one-time registration token issued by the operator; only its sha256 is stored."""

    __tablename__ = "enrollment_tokens"
    token_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None] = mapped_column(default=None)


class IdempotencyRecord(Base):
    __tablename__ = "idempotency"
    __table_args__ = (UniqueConstraint("device_id", "key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(128))
    request_sha256: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int]
    response: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Blob(Base):
    """A content-addressed blob, for ``FEDFACE_BLOB_STORE=database`` (server_api/storage/database_blobs.py)."""

    __tablename__ = "blobs"
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RateBucket(Base):
    """A token bucket shared by every server process on PostgreSQL (server_api/core/shared_limits.py);
    times are the database clock's epoch seconds, so processes on different hosts agree."""

    __tablename__ = "rate_buckets"
    scope: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    at: Mapped[float] = mapped_column(Float)
    taken: Mapped[bool]


class UploadSlot(Base):
    """One of the upload bodies the whole deployment receives at once, on PostgreSQL; a holder that
    died frees its slot when ``until`` (database-clock epoch seconds) passes."""

    __tablename__ = "upload_slots"
    slot: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    holder: Mapped[str | None] = mapped_column(String(36), default=None)
    until: Mapped[float | None] = mapped_column(Float, default=None)


class AggregationShard(Base):
    """One shard of a round whose replicas share its sum (``FEDFACE_AGGREGATION_SHARED_SHARDS``,
    server_api/services/aggregation_shards.py): updates ``shard * shard_updates`` onwards, in update order. A
    process claims it until ``lease_until``; ``partial_sha256`` names its partial sum in the blob store once summed.
    The rows and their blobs go when the round ends."""

    __tablename__ = "aggregation_shards"
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), primary_key=True)
    shard: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    shard_updates: Mapped[int]
    holder: Mapped[str | None] = mapped_column(String(36), default=None)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    partial_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
