"""The operator's request and response bodies (rounds, devices, enrollment tokens, model versions).
Requests (``*Create``) forbid unknown fields and bound every number; responses (``*Public``) are what
clients may rely on. What a device sends and reads is in ``facecore.federation.messages``."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from facecore.federation.config import RoundConfig, StrictModel, is_unit_vector
from facecore.federation.status import RoundStatus
from facecore.models.verification import Verification

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class EnrollmentTokensCreate(StrictModel):
    count: int = Field(default=1, ge=1, le=1000)
    ttl_s: int | None = Field(default=None, ge=60, le=365 * 86400, description="default FEDFACE_ENROLLMENT_TOKEN_TTL_S")


class EnrollmentTokensPublic(BaseModel):
    tokens: list[str] = Field(description="each registers one device, once; shown only here")
    expires_at: datetime


class DevicesPrunedPublic(BaseModel):
    pruned: int = Field(description="registered devices deleted because they never enrolled")
    registered_before: datetime


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
    feature_center: list[float] | None = Field(
        default=None, description="the unit mean feature of public faces that fleet-camera rounds centre the devices' loss on",
    )


class VerificationCreate(StrictModel):
    """The body of `PUT /v1/admin/models/{version}/verification`: a threshold the operator calibrated
    for this version on public faces (`fedface admin model calibrate`). The server holds no faces."""

    # Strict: a JSON number, never a string such as "0.3" (nor true); below the model's FAR 10% point it needs `force`.
    threshold: FiniteFloat = Field(strict=True, ge=-1.0, le=1.0, description="cosine at or above which verify() accepts")
    far: FiniteFloat = Field(strict=True, gt=0.0, lt=1.0, description="the false-accept rate it was calibrated for")
    calibration: str = Field(min_length=1, max_length=500, description="on which faces, e.g. 'all 796,147 impostor pairs of ...'")
    force: bool = Field(
        default=False, strict=True, exclude=True,
        description="publish a threshold below the model's own FAR 10% point (one that accepts more than 1 impostor in 10)",
    )

    def record(self) -> Verification:
        """The threshold as the record it is published as (the version's own FAR 10% point is added by the service)."""
        return Verification(self.threshold, self.far, self.calibration)


class FeatureCenterCreate(StrictModel):
    """The body of `PUT /v1/admin/models/{version}/feature-center`: the unit mean feature of public
    faces under this version (`fedface admin model center`), which fleet-camera rounds centre on."""

    vector: list[FiniteFloat] = Field(min_length=1, max_length=4096, description="a unit vector of the model's embedding size")
    source: str = Field(min_length=1, max_length=500, description="which faces it is the mean of, e.g. '1000 public celeba photos'")

    @model_validator(mode="after")
    def _unit(self) -> FeatureCenterCreate:
        if not is_unit_vector(self.vector):
            raise ValueError("vector must be a unit vector")
        return self


class ModelVersionAdminPublic(BaseModel):
    """A model version as the operator sees it: where it came from and the threshold it publishes."""

    version: str
    backbone: str
    round_id: int | None = Field(description="the round that produced it; null for the bootstrap model")
    created_at: datetime
    verify_threshold: float | None
    verify_far: float | None
    calibration: str | None = Field(description="on which faces the threshold was calibrated")
    calibrated_for: str = Field(description="the version it was calibrated on: an ancestor's when a round inherited it")
    feature_center: list[float] | None = Field(default=None, description="the unit mean feature of public faces rounds centre on")


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
