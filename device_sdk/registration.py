"""A device's registration with its round server, and the reset that ends it.

Invariants:
- Registration is the only call that creates local state, and only once the server accepted the device: the key
  pair is made in memory and the state folder written after the answer (`DeviceState.save_registration`), so a
  refusal, an unreachable server or Ctrl-C leaves no state. A registered folder registers to its id, unchanged.
- An identity sealed by an earlier version's interrupted registration is offered again (a lost answer may have
  registered it, and a known key registers without spending a token).
- Reset unenrolls on the server when the state can still sign, says in one sentence what happened there, and
  deletes the local state whatever the server said.
- Imports cryptography, httpx and the state's modules only: no numpy, no torch.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from device_sdk.errors import (
    AuthError,
    BadServerResponse,
    NotRegistered,
    RegistrationRefused,
    ServerRefused,
    ServerUnavailable,
    StateError,
)
from device_sdk.link import ServerLink
from device_sdk.server_limits import check_device_id


@dataclass(frozen=True)
class ResetResult:
    device_id: str | None
    server: str  # what happened on the server, one sentence
    removed: tuple[str, ...] = field(default_factory=tuple)


def register(link: ServerLink, enrollment_token: str | None = None) -> str:
    """This device's id: registered now with a new key pair, or the one the folder already holds
    (`FaceDevice.register`)."""
    state = link.state
    existing = state.registration()
    if existing is not None:
        return existing
    key = state.signing_key()
    fresh = key is None
    if key is None:
        state.check_creatable()
        key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    body = {"public_key": public} | ({"enrollment_token": enrollment_token} if enrollment_token else {})
    try:
        response = link.transport.request("POST", "/v1/devices", key, None, body=body, expect=(200, 201))
    except AuthError as refused:
        raise RegistrationRefused(refused.status, refused.detail or str(refused), bool(enrollment_token),
                                  str(state.dir)) from None
    except ServerRefused as refused:
        if refused.status != 422 or not enrollment_token:
            raise
        raise RegistrationRefused(422, refused.detail, True, str(state.dir)) from None
    except ServerUnavailable as down:
        raise ServerUnavailable(f"{down}; nothing was saved in {state.dir}" if fresh else str(down)) from None
    device_id = check_device_id(response.json().get("device_id"))
    state.save_registration(device_id, key if fresh else None)
    return device_id


def reset(link: ServerLink) -> ResetResult:
    """Unenroll on the server when this state can still sign, then delete the local state (`FaceDevice.reset`)."""
    state = link.state
    if not state.present():
        raise NotRegistered(f"no device state at {state.dir}: nothing to reset (check --state)")
    try:
        device_id = state.info().get("device_id")
    except StateError:
        device_id = None
    if device_id is None:
        server = "not registered on a server: nothing to delete there"
    else:
        try:
            link.request("DELETE", f"/v1/devices/{link.identity()[0]}", expect=(204,))
            server = f"unenrolled device {device_id} on the server (its template there is deleted)"
        except (StateError, BadServerResponse) as error:
            server = (f"could not sign a request to unenroll on the server ({error}); "
                      f"it keeps device {device_id}'s template")
        except (ServerUnavailable, AuthError, ServerRefused) as error:
            server = f"could not unenroll on the server ({error}); it keeps device {device_id}'s template"
    removed = tuple(path.name for path in state.delete())
    link.forget()
    return ResetResult(device_id, server, removed)


__all__ = ["ResetResult", "register", "reset"]
