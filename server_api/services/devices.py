"""Device registration, enrollment, template access and unenrollment."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from sqlalchemy.orm import Session

from server_api.core.logging import get_logger
from server_api.core.security import parse_public_key
from server_api.crud import devices as device_crud
from server_api.crud import versions as version_crud
from server_api.errors import Forbidden, NotFound
from server_api.models import Device
from server_api.schemas import DevicePublic, EmbeddingPublic
from server_api.services.auth import verify_registration
from server_api.services.context import ServerContext
from server_api.services.validation import check_enrollment_embedding

log = get_logger("devices")


def register(
    ctx: ServerContext, session: Session, public_key_b64: str, headers: Mapping[str, str], method: str, path: str, body_sha256: str
) -> tuple[DevicePublic, bool]:
    public_key = parse_public_key(public_key_b64)
    verify_registration(session, public_key, headers, method, path, body_sha256, ctx.settings.signature_window_s)
    device, created = device_crud.register_device(session, public_key)
    if created:
        log.info("device registered", extra={"fields": {"device_id": device.id}})
    return public(session, device), created


def public(session: Session, device: Device) -> DevicePublic:
    return DevicePublic(device_id=device.id, status=device.status, enrolled=device_crud.get_enrollment(session, device.id) is not None)


def _own(device: Device, device_id: str) -> None:
    # Templates are biometric: a device may only ever touch its own.
    if device.id != device_id:
        raise Forbidden("a device may only access its own record")


def enroll(ctx: ServerContext, session: Session, device: Device, device_id: str, values: list[float]) -> DevicePublic:
    _own(device, device_id)
    version = version_crud.current_version(session)
    assert version is not None
    vector = check_enrollment_embedding(values, version.embedding_dim)
    device_crud.enroll(session, device, ctx.cipher.encrypt(vector.astype("<f4").tobytes(), device.id, "enrollment"))
    log.info("device enrolled", extra={"fields": {"device_id": device.id}})
    return public(session, device)


def embedding(ctx: ServerContext, session: Session, device: Device, device_id: str) -> EmbeddingPublic:
    _own(device, device_id)
    enrollment = device_crud.get_enrollment(session, device.id)
    if enrollment is None:
        raise NotFound(f"device {device.id} is not enrolled")
    vector = np.frombuffer(ctx.cipher.decrypt(enrollment.ciphertext, device.id, "enrollment"), dtype="<f4")
    return EmbeddingPublic(device_id=device.id, embedding=[float(x) for x in vector], round_id=enrollment.round_id)


def unenroll(session: Session, device: Device, device_id: str) -> None:
    _own(device, device_id)
    device_crud.unenroll(session, device)
    log.info("device unenrolled", extra={"fields": {"device_id": device.id}})
