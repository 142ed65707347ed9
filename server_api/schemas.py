"""Request and response bodies. Requests (``*Create``/``*Meta``) forbid unknown
fields and bound every number; responses (``*Public``) are what clients may rely on."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from facecore.federation.config import RoundConfig, StrictModel
from facecore.federation.protocol import ErrorCode
from facecore.federation.status import ParticipationStatus, RoundStatus

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


class EnrollmentTokensCreate(StrictModel):
    count: int = Field(default=1, ge=1, le=1000)
    ttl_s: int | None = Field(default=None, ge=60, le=365 * 86400, description="default FEDFACE_ENROLLMENT_TOKEN_TTL_S")


class EnrollmentTokensPublic(BaseModel):
    tokens: list[str] = Field(description="each registers one device, once; shown only here")
    expires_at: datetime


class DevicesPrunedPublic(BaseModel):
    pruned: int = Field(description="registered devices deleted because they never enrolled")
    registered_before: datetime


class EnrollmentCreate(StrictModel):
    embedding: list[FiniteFloat] = Field(min_length=1, max_length=4096, description="L2-normalised class embedding")


class EmbeddingPublic(BaseModel):
    device_id: str
    embedding: list[float]
    round_id: int = Field(description="round whose aggregation produced it; 0 = as enrolled")


class RoundCreate(RoundConfig):
    """The body of `POST /v1/admin/rounds`: a round's configuration (facecore.federation.config)."""


class RoundPublic(BaseModel):
    id: int
    # Literals of members keep the published schema an inline list of strings, as before the enums.
    status: Literal[
        RoundStatus.OPEN, RoundStatus.UNMASKING, RoundStatus.AGGREGATING, RoundStatus.COMPLETED, RoundStatus.FAILED,
    ]
    strategy: str
    target_participants: int
    min_participants: int
    created_at: datetime
    selection_at: datetime
    deadline_at: datetime
    closed_at: datetime | None
    failure_reason: str | None
    base_version: str
    result_version: str | None
    n_checked_in: int
    n_selected: int
    n_uploaded: int
    config: dict[str, Any]
    summary: dict[str, Any] | None


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
    members: list[SecAggMemberPublic] | None = None
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


class FaceGeometryPublic(BaseModel):
    """How a device must crop faces for this model: a 5-point similarity warp of the detected
    landmarks (left eye, right eye, nose tip, left and right mouth corners) onto `template`."""

    key: str = Field(description="names the crop; equal keys mean identical crops")
    size: int = Field(description="the square crop's side in pixels")
    template: list[tuple[float, float]] = Field(description="(x, y) of the five landmarks in the crop")


class ModelVersionPublic(BaseModel):
    version: str
    backbone: str
    embedding_dim: int
    face_geometry: FaceGeometryPublic
    round_id: int | None
    created_at: datetime
    backbone_url: str
    onnx_url: str | None
    verify_threshold: float | None = Field(default=None, description="cosine threshold devices use in verify()")
    verify_far: float | None = Field(default=None, description="the false-accept rate the threshold was calibrated for")


class ErrorPublic(BaseModel):
    detail: str = Field(description="for people; may be reworded between versions")
    code: ErrorCode = Field(description="what a client branches on")


class DeviceAdminPublic(BaseModel):
    """A device as the operator sees it: never its key or template."""

    device_id: str
    status: str = Field(description="active, unenrolled or removed")
    enrolled: bool = Field(description="whether the server holds its template now")
    created_at: datetime
    last_selected_round: int | None


class DeviceRemovedPublic(BaseModel):
    device_id: str
    status: str
    template_deleted: bool = Field(description="false when the device held no template")
