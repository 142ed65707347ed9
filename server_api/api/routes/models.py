"""Immutable, version-pinned model downloads with ETags."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import StreamingResponse

from facecore.federation.messages import ErrorPublic
from facecore.federation.protocol import CONTENT_SHA256_HEADER
from facecore.models.registry import backbone_geometry
from server_api.api.deps import AdminDep, CtxDep, CurrentDevice, SessionDep
from server_api.crud import versions as version_crud
from server_api.errors import NotFound
from server_api.schemas import FaceGeometryPublic, FeatureCenterCreate, ModelVersionAdminPublic, ModelVersionPublic, VerificationCreate
from server_api.services import version_admin, versions
from server_api.storage.blobs import CHUNK
from server_api.tables import ModelVersion

router = APIRouter(prefix="/v1/models", tags=["models"])
admin_router = APIRouter(prefix="/v1/admin/models", tags=["admin"])
_errors: dict[int | str, dict[str, Any]] = {401: {"model": ErrorPublic}, 404: {"model": ErrorPublic}}
_admin_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (401, 404, 422)}
VersionPath = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="the version's hash")]
# Version URLs never change content, so clients and proxies may cache them forever.
IMMUTABLE = "private, max-age=31536000, immutable"


def _public(version: ModelVersion) -> ModelVersionPublic:
    geometry = backbone_geometry(version.backbone)
    verification = version.verification
    return ModelVersionPublic(
        version=version.version_hash, backbone=version.backbone, embedding_dim=version.embedding_dim,
        face_geometry=FaceGeometryPublic(**geometry.to_json()),
        round_id=version.round_id, created_at=version.created_at,
        backbone_url=f"/v1/models/{version.version_hash}/backbone",
        onnx_url=f"/v1/models/{version.version_hash}/onnx" if version.onnx_blob else None,
        verify_threshold=None if verification is None else verification.threshold,
        verify_far=None if verification is None else verification.far,
        feature_center=version.feature_center,
    )


@router.get("/current", response_model=ModelVersionPublic, responses=_errors)
def current_model(device: CurrentDevice, session: SessionDep) -> ModelVersionPublic:
    version = version_crud.current_version(session)
    if version is None:
        raise NotFound("no model version yet")
    return _public(version)


def _serve(ctx: CtxDep, blob: str, etag: str, if_none_match: str | None, media_type: str, filename: str) -> Response:
    quoted = f'"{etag}"'
    # Blobs are named by their sha256: devices check each download (and their cached copy) against it.
    headers = {"ETag": quoted, "Cache-Control": IMMUTABLE, CONTENT_SHA256_HEADER: blob}
    if if_none_match and (if_none_match.strip() == "*" or quoted in [t.strip().removeprefix("W/") for t in if_none_match.split(",")]):
        return Response(status_code=304, headers=headers)
    handle = ctx.store.open(blob)

    def chunks() -> Iterator[bytes]:
        with handle:
            while data := handle.read(CHUNK):
                yield data

    headers |= {"Content-Length": str(ctx.store.size(blob)), "Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(chunks(), media_type=media_type, headers=headers)


@router.get("/{version}/backbone", responses={200: {"content": {"application/octet-stream": {}}}, 304: {"description": "unchanged"}, **_errors})
def download_backbone(
    version: str, device: CurrentDevice, ctx: CtxDep, session: SessionDep,
    dtype: Annotated[Literal["fp32", "fp16", "int8"], Query()] = "fp32",
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The FedFace backbone file (torch, load with weights_only=True). ETag: the version hash
    (fp32), ``<hash>.fp16`` or ``<hash>.int8``. An int8 file holds each weight of two or more dimensions as
    int8 codes with an fp32 scale per output channel (``int8_scales``), the rest in fp16."""
    found = versions.for_download(session, version)
    blobs = {"fp32": found.version_hash, "fp16": found.fp16_blob, "int8": found.int8_blob}
    blob = blobs[dtype]
    if blob is None:
        raise NotFound(f"model version {version} has no int8 file (it was published before int8 downloads, and no round downloading int8 has opened on it)")
    etag = found.version_hash if dtype == "fp32" else f"{found.version_hash}.{dtype}"
    return _serve(ctx, blob, etag, if_none_match, "application/octet-stream", f"backbone-{version[:12]}-{dtype}.pt")


@router.get("/{version}/onnx", responses={200: {"content": {"application/octet-stream": {}}}, 304: {"description": "unchanged"}, **_errors})
def download_onnx(
    version: str, device: CurrentDevice, ctx: CtxDep, session: SessionDep, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    """ONNX fp32 export of the version, for inference (input ``faces``, output ``embedding``)."""
    found = versions.for_download(session, version)
    if found.onnx_blob is None:
        raise NotFound(f"model version {version} has no ONNX export (server runs with export_onnx off)")
    return _serve(ctx, found.onnx_blob, f"{found.version_hash}.onnx", if_none_match, "application/octet-stream", f"model-{version[:12]}.onnx")


def _admin_public(version: ModelVersion) -> ModelVersionAdminPublic:
    verification = version.verification
    return ModelVersionAdminPublic(
        version=version.version_hash, backbone=version.backbone, round_id=version.round_id, created_at=version.created_at,
        verify_threshold=None if verification is None else verification.threshold,
        verify_far=None if verification is None else verification.far,
        calibration=None if verification is None else verification.calibration,
        calibrated_for=(None if verification is None else verification.calibrated_for) or version.version_hash,
        feature_center=version.feature_center,
    )


@admin_router.get("", response_model=list[ModelVersionAdminPublic], responses=_admin_errors)
def list_versions(_: AdminDep, session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 20) -> list[ModelVersionAdminPublic]:
    """Model versions, newest (the current one) first, with the threshold each publishes."""
    return [_admin_public(v) for v in version_crud.list_versions(session, limit)]


@admin_router.get("/{version}/backbone", responses={200: {"content": {"application/octet-stream": {}}}, **_admin_errors})
def admin_download_backbone(version: VersionPath, _: AdminDep, ctx: CtxDep, session: SessionDep) -> Response:
    """The version's fp32 backbone file, for the operator to calibrate its threshold on public faces."""
    found = versions.for_download(session, version)
    return _serve(ctx, found.version_hash, found.version_hash, None, "application/octet-stream", f"backbone-{version[:12]}-fp32.pt")


@admin_router.put("/{version}/feature-center", response_model=ModelVersionAdminPublic, responses=_admin_errors)
def set_feature_center(version: VersionPath, body: FeatureCenterCreate, _: AdminDep, session: SessionDep) -> ModelVersionAdminPublic:
    """Publish the unit mean feature of public faces under this version: fleet-camera rounds opened on it centre the devices' loss on it,
    and the versions they make inherit it."""
    return _admin_public(version_admin.set_feature_center(session, version, body.vector, body.source))


@admin_router.put("/{version}/verification", response_model=ModelVersionAdminPublic, responses=_admin_errors)
def set_verification(version: VersionPath, body: VerificationCreate, _: AdminDep, session: SessionDep) -> ModelVersionAdminPublic:
    """Publish a threshold calibrated for this version: devices read it with the current model (every online verify and round), and
    the next round's version inherits it. A threshold below the model's own FAR 10% point (when its figures have one) is 422
    unless the body says `"force": true`."""
    return _admin_public(version_admin.set_verification(session, version, body.record(), force=body.force))
