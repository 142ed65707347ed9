"""Exceptions a device app handles. All derive from FaceCoreError, so the CLI prints one line.

Each message names what went wrong and what fixes it; a state error also names the file. A server
refusal is typed by the body's machine-readable `code` (facecore.federation.protocol.ErrorCode) where
one names a case the SDK knows, else by the HTTP status alone: never by the wording of `detail`.
"""
from __future__ import annotations

from collections.abc import Mapping

from facecore.errors import FaceCoreError, NoFaceFound
from facecore.federation.protocol import ErrorCode


class DeviceError(FaceCoreError):
    pass


class StateError(DeviceError):
    """The local state folder cannot be used as it is (corrupt file, missing or wrong key)."""


class NotEnrolled(DeviceError):
    def __init__(self, detail: str = "this device has no enrolled owner: run enroll first") -> None:
        super().__init__(detail)


class NotRegistered(DeviceError):
    def __init__(self, detail: str = "this device is not registered: run register first") -> None:
        super().__init__(detail)


class NotAnImage(DeviceError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path} is not an image (it cannot be decoded as one)")


class NotEnoughPhotos(NoFaceFound):
    """Enrollment found fewer usable photos than it needs; `rejected` maps each unusable file to why."""

    def __init__(self, usable: int, needed: int, rejected: Mapping[str, str]) -> None:
        self.usable, self.needed, self.rejected = usable, needed, dict(rejected)
        self.files = list(self.rejected)
        shown = ", ".join(f"{name} ({why})" for name, why in list(self.rejected.items())[:10])
        more = " ..." if len(self.rejected) > 10 else ""
        unusable = f"; unusable: {shown}{more}" if shown else "; no photos given"
        FaceCoreError.__init__(self, f"{usable} usable of {needed} needed{unusable}")


class ServerUnavailable(DeviceError):
    """The server could not be reached or kept failing after every retry."""


class BadServerResponse(DeviceError):
    """The server sent something this device refuses to use (a malformed name, a wrong hash)."""


class ServerRefused(DeviceError):
    """The server answered a 4xx other than an authentication failure."""

    def __init__(self, status: int, detail: str, code: str | None = None) -> None:
        self.status, self.detail, self.code = status, detail, code
        super().__init__(f"server refused the request ({status}{', ' + code if code else ''}): {detail}")


class RoundClosed(DeviceError):
    """The round this device trained for is over (or none is open)."""


# Both a ServerRefused (callers that handle refusals by status keep working) and the SDK's own meaning.
class RefusedNotEnrolled(ServerRefused, NotEnrolled):
    """The server holds no enrollment for this device (code `not_enrolled`)."""


class RefusedRoundClosed(ServerRefused, RoundClosed):
    """No round is open, or the round no longer takes this request (code `stale_round`)."""


REFUSALS: dict[str, type[ServerRefused]] = {
    ErrorCode.NOT_ENROLLED: RefusedNotEnrolled,
    ErrorCode.STALE_ROUND: RefusedRoundClosed,
}


def refusal(status: int, detail: str, code: str | None) -> ServerRefused:
    """The exception for a 4xx refusal: typed by `code` when it names a known case; a code this SDK does
    not know (a newer server) or none (an older one) leaves the plain ServerRefused, typed by status."""
    return REFUSALS.get(code or "", ServerRefused)(status, detail, code)


class AuthError(DeviceError):
    """The server rejected this device's signature or identity (HTTP 401 or 403)."""

    def __init__(self, message: str, status: int | None = None, detail: str | None = None) -> None:
        self.status, self.detail = status, detail
        super().__init__(message)


class RegistrationRefused(AuthError):
    """The server refused to register this device (401 or 403; 422 when a token was given, for its form): without
    an enrollment token, most likely as a production server does; with one, the token (malformed, unknown, used
    or expired). Nothing was written to the state folder.
    `how` names where the token goes, for the caller's audience: the SDK's argument by default, the CLI's
    flag and variable from `fedface device register`."""

    SDK_HOW = "register(enrollment_token=...)"

    def __init__(self, status: int | None, detail: str, token_given: bool, state_dir: str, how: str = SDK_HOW) -> None:
        self.token_given, self.state_dir, self.how = token_given, state_dir, how
        refused = f"the server refused to register this device ({status}: {detail})"
        if token_given:
            fix = "check the enrollment token (each is used once, whole, before it expires) or ask the server's " \
                  "operator for a new one (`fedface admin token issue`)"
        else:
            fix = f"a production server registers a device only with a one-time enrollment token: ask its operator for " \
                  f"one (`fedface admin token issue`) and pass it with {how}"
        super().__init__(f"{refused}; {fix}; nothing was saved in {state_dir}", status, detail)

    def saying(self, how: str) -> RegistrationRefused:
        """The same refusal, naming `how` a token is passed (the CLI's flag and variable)."""
        return RegistrationRefused(self.status, self.detail or "", self.token_given, self.state_dir, how)


class TrainingInProgress(DeviceError):
    """Another train holds this state folder's lock: a second one would train the same round again."""


class NoThreshold(DeviceError):
    """A verify was asked without a threshold, and neither the model nor the personal verifier has one."""


__all__ = [
    "AuthError", "BadServerResponse", "DeviceError", "NoFaceFound", "NotAnImage", "NotEnoughPhotos", "NotEnrolled",
    "NoThreshold", "NotRegistered", "RefusedNotEnrolled", "RefusedRoundClosed", "RegistrationRefused", "RoundClosed", "ServerRefused",
    "ServerUnavailable", "StateError", "TrainingInProgress", "refusal",
]
