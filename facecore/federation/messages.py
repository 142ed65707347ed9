"""The bodies a device and the server exchange: what the SDK sends and reads, and what the server
validates and answers with, so both sides use one definition of each.

Invariants: pydantic only (no HTTP, database or torch). Requests (``*Create``, ``UpdateMeta``) forbid
unknown fields and bound every number; responses (``*Public``) are what a device may rely on, and a
field is only ever added to them. The operator's bodies stay in ``server_api.schemas``.
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from facecore.federation.config import StrictModel
from facecore.federation.protocol import ErrorCode
from facecore.federation.status import ParticipationStatus

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class DeviceCreate(StrictModel):
    public_key: str = Field(min_length=40, max_length=64, description="raw 32-byte Ed25519 public key, base64")
    enrollment_token: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_-]{16,128}$", description="one-time token from the operator, where required",
    )


class DevicePublic(BaseModel):
    device_id: str
    status: str
    enrolled: bool


class EnrollmentCreate(StrictModel):
    embedding: list[FiniteFloat] = Field(min_length=1, max_length=4096, description="L2-normalised class embedding")


class EmbeddingPublic(BaseModel):
    device_id: str
    embedding: list[float]
    round_id: int = Field(description="round whose aggregation produced it; 0 = as enrolled")


class CheckinPublic(BaseModel):
    round_id: int
    # Not every member: a stored "candidate" is reported as "waiting".
    status: Literal[
        ParticipationStatus.SELECTED, ParticipationStatus.WAITING, ParticipationStatus.NOT_SELECTED,
        ParticipationStatus.UPLOADED,
    ]
    retry_after_s: float | None = None
    deadline_at: datetime
    base_version: str
    backbone_url: str
    onnx_url: str | None
    embedding_url: str
    upload_url: str
    local: dict[str, Any]
    secagg_url: str | None = Field(default=None, description="set when the round uses secure aggregation: follow its steps before uploading")


class UpdateMeta(StrictModel):
    """The ``fedface`` entry of an upload's ``__metadata__`` (a JSON string)."""

    base_version: Sha256Hex
    n_samples: int = Field(ge=1, le=10_000_000)
    metrics: dict[Annotated[str, Field(max_length=64)], FiniteFloat] = Field(default_factory=dict, max_length=32)


B64Key = Annotated[str, Field(min_length=43, max_length=44, pattern=r"^[A-Za-z0-9+/]{43}=?$", description="raw 32-byte X25519 public key, base64")]
MemberIndex = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,5}$")]
ShareValue = Annotated[str, Field(pattern=r"^[0-9]{1,160}$", description="a Shamir share, decimal")]


class SecAggAdvertCreate(StrictModel):
    c_public: B64Key
    s_public: B64Key


class SecAggSharesCreate(StrictModel):
    shares: dict[MemberIndex, Annotated[str, Field(max_length=400)]] = Field(
        max_length=100_000, description="recipient index -> base64 AES-GCM ciphertext of this device's shares for it"
    )


class SecAggUnmaskCreate(StrictModel):
    s: dict[MemberIndex, ShareValue] = Field(default_factory=dict, max_length=100_000, description="dropped device -> its s-key share")
    b: dict[MemberIndex, ShareValue] = Field(default_factory=dict, max_length=100_000, description="surviving device -> its self-mask share")


class SecAggMemberPublic(BaseModel):
    index: int
    c_public: str
    s_public: str


class SecAggStatePublic(BaseModel):
    """What one device needs for the current step; lists appear once the step they belong to is closed."""

    round_id: int
    phase: Literal["advertise", "share_keys", "masked_input", "unmask", "aggregating", "completed", "failed"]
    retry_after_s: float | None = None
    index: int | None = Field(default=None, description="this device's index, once it advertised")
    threshold: int | None = None
    scale: float
    bound: float | None = Field(default=None, description="|value| limit per coordinate of the scaled update, once members are known")
    max_update_norm: float | None = Field(default=None, description="L2 bound each device clips its delta to before weighting and masking")
    members: list[SecAggMemberPublic] | None = None
    selected: int | None = Field(default=None, description="devices the round selected, as the admin API and /ui count them; "
                                 "members are those of them that advertised keys, never more")
    key_sharers: list[int] | None = None
    shares: dict[str, str] | None = Field(default=None, description="sender index -> ciphertext addressed to this device")
    survived: list[int] | None = None
    dropped: list[int] | None = None
    answered: bool = False


class UpdatePublic(BaseModel):
    update_id: int
    round_id: int
    device_id: str
    n_samples: int
    size_bytes: int
    accepted_at: datetime


class ErrorPublic(BaseModel):
    detail: str = Field(description="for people; may be reworded between versions")
    code: ErrorCode = Field(description="what a client branches on")
