"""Exceptions a device app handles. All derive from FaceCoreError, so the CLI prints one line."""
from __future__ import annotations

from facecore.errors import FaceCoreError, NoFaceFound


class DeviceError(FaceCoreError):
    pass


class NotEnrolled(DeviceError):
    def __init__(self, detail: str = "this device has no enrolled owner: run enroll first") -> None:
        super().__init__(detail)


class NotRegistered(DeviceError):
    def __init__(self) -> None:
        super().__init__("this device is not registered: run register first")


class ServerUnavailable(DeviceError):
    """The server could not be reached or kept failing after every retry."""


class RoundClosed(DeviceError):
    """The round this device trained for is over (or none is open)."""


class AuthError(DeviceError):
    """The server rejected this device's signature or identity."""


__all__ = ["AuthError", "DeviceError", "NoFaceFound", "NotEnrolled", "NotRegistered", "RoundClosed", "ServerUnavailable"]
