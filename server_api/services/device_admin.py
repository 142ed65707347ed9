"""The operator's view of devices: list them, remove one (its template and key go with it).
A removal is one transaction and returns a :class:`Removal`; the route builds the response. Listing is a
query alone, which the route asks crud for."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy.orm import Session

from server_api.core.db import transaction
from server_api.core.logging import get_logger
from server_api.crud import audit
from server_api.crud import devices as device_crud
from server_api.errors import NotFound

log = get_logger("device_admin")


@dataclass(frozen=True)
class Removal:
    device_id: str
    status: str
    template_deleted: bool  # false when the device held no template


def remove_device(session: Session, device_id: str) -> Removal:
    """Delete the device's template (and uploaded copies) and revoke its key. An update it already
    sent to the open round still counts in that round's backbone average; its template does not.

    The row stays (as ``removed``) so past rounds keep their participants, but its public key is
    replaced by random bytes nobody holds the private key of, so no request of that device
    authenticates again."""
    with transaction(session):
        device = device_crud.get_device(session, device_id)
        if device is None:
            raise NotFound(f"device {device_id} does not exist")
        template_deleted = device_crud.delete_templates(session, device.id)
        device.public_key = secrets.token_bytes(32)
        device.status = "removed"
        audit.record(session, "admin", "device.removed", device_id=device.id, template_deleted=template_deleted)
    log.info("device removed", extra={"fields": {"device_id": device_id, "template_deleted": template_deleted}})
    return Removal(device_id, device.status, template_deleted)
