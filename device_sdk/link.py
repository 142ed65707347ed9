"""The device's signed link to its round server: who signs, where a request may go, how a body is read.

Invariants:
- Every request but registration's is signed with this state folder's identity (`ServerLink.request`), which is
  opened once per link and forgotten when the state is deleted (`ServerLink.forget`).
- A URL the server names is followed only as a path on that same server (`server_path`: "/v1/" then segments
  that cannot be "." or "..", no scheme, host or query); the one query a request carries is the device's own.
- A response body is read as the protocol defines it (`server_body`, facecore.federation.messages) or refused in
  one BadServerResponse line naming the field.
- Imports no torch and no pydantic at module level: pydantic comes with the message model a caller passes in.
"""
from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_sdk.errors import BadServerResponse
from device_sdk.state import DeviceState
from device_sdk.transport import Transport

if TYPE_CHECKING:  # the type only: importing pydantic costs a cold command ~0.1 s
    import httpx
    from pydantic import BaseModel

# A path on the round server: "/v1/" then segments that cannot be "." or "..", no scheme, no host, no query.
SERVER_PATH = re.compile(r"/v1(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+")


def server_path(url: object) -> str:
    """A URL the server sent, accepted only as a path on that same server."""
    if not isinstance(url, str) or not SERVER_PATH.fullmatch(url):
        raise BadServerResponse(f"the server sent a URL that is not a path on it: {str(url)[:80]!r}; "
                                "refusing to follow it")
    return url


Body = TypeVar("Body", bound="BaseModel")


def server_body(model: type[Body], body: object) -> Body:
    """A response body read as the protocol defines it (facecore.federation.messages), or a one-line error."""
    from pydantic import ValidationError  # loaded with `model`'s module anyway

    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise BadServerResponse(f"the server's {model.__name__} is malformed at {where}: {first['msg']}") from None


def read_deadline(value: object) -> datetime | None:
    """A deadline the device saved (ISO 8601), in UTC; None when it cannot be read."""
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class ServerLink:
    """One state folder's identity and one transport: signed requests as this device."""

    def __init__(self, state: DeviceState, transport: Transport) -> None:
        self.state, self.transport = state, transport
        self._signer: tuple[str, Ed25519PrivateKey] | None = None

    def identity(self) -> tuple[str, Ed25519PrivateKey]:
        """(device id, signing key); NotRegistered or StateError when the folder cannot sign."""
        if self._signer is None:
            device_id = self.state.require_registered()
            key = self.state.signing_key()
            assert key is not None  # require_registered checked that identity.enc opens
            self._signer = (device_id, key)
        return self._signer

    def forget(self) -> None:
        """Drop the identity held in memory (the state it came from was deleted)."""
        self._signer = None

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A signed request to a path on the server (`Transport.request`'s keywords)."""
        device_id, key = self.identity()
        return self.transport.request(method, server_path(path.split("?")[0]) + _query(path), key, device_id, **kwargs)


def _query(path: str) -> str:
    """The query string of a path this device built (only `?dtype=`), kept as it is."""
    return "?" + path.split("?", 1)[1] if "?" in path else ""


__all__ = ["SERVER_PATH", "ServerLink", "read_deadline", "server_body", "server_path"]
