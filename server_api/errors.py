"""Domain errors of the round server.

Services and CRUD raise these; only :mod:`server_api.api.handlers` turns them into
HTTP status codes, so the same code paths work from the CLI, the background
scheduler and tests without an HTTP layer. They derive from FaceCoreError so the
`fedface` CLI prints them as one line.

Invariant: every class carries its own ``code`` (facecore.federation.protocol.ErrorCode),
which the error body sends beside the message, so clients never parse the message.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from facecore.errors import FaceCoreError
from facecore.federation.protocol import ErrorCode


class ServerError(FaceCoreError):
    """Base class of everything the server raises on purpose."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL


class ConfigError(ServerError):
    """The server cannot start with these settings (missing or weak secrets, bad URL...)."""

    code = ErrorCode.CONFIG


class AuthenticationFailed(ServerError):
    """Missing/invalid signature, skewed clock, replayed nonce, unknown device or bad token."""

    code = ErrorCode.AUTHENTICATION_FAILED


class Forbidden(ServerError):
    """Authenticated, but the resource belongs to someone else."""

    code = ErrorCode.FORBIDDEN


class NotFound(ServerError):
    code = ErrorCode.NOT_FOUND


class Conflict(ServerError):
    """The request is valid but does not fit the current state (e.g. already enrolled)."""

    code = ErrorCode.CONFLICT


class DeviceNotEnrolled(Conflict):
    """The calling device has no enrolled template here, so it cannot take part in a round."""

    code = ErrorCode.NOT_ENROLLED


class StaleRound(Conflict):
    """An upload or check-in for a round that is no longer accepting it."""

    code = ErrorCode.STALE_ROUND

    def __init__(self, requested: int | None, current: int | None, status: str | None = None) -> None:
        self.requested = requested
        self.current = current
        now = "no round is open" if current is None else f"current round is {current}" + (f" ({status})" if status else "")
        super().__init__(f"round {requested} is not accepting this request; {now}")


class InvalidInput(ServerError):
    """Semantically invalid payload (wrong shape, NaN, norm bound...)."""

    code = ErrorCode.INVALID_INPUT


class PayloadTooLarge(ServerError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class Unavailable(ServerError):
    """The server cannot take this request right now, and the same request will succeed on retry."""

    code = ErrorCode.UNAVAILABLE


class RateLimited(ServerError):
    """Too many requests from one device or one address; the same request succeeds after ``retry_after_s``."""

    code = ErrorCode.RATE_LIMITED

    def __init__(self, message: str, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class RequestTimeout(ServerError):
    """The request body did not arrive within the server's body read timeout."""

    code = ErrorCode.REQUEST_TIMEOUT


class AdminClientError(ServerError):
    """`fedface admin` could not talk to the server or the server refused the request."""

    code = ErrorCode.ADMIN_CLIENT


class LaunchFailed(ServerError):
    """A local server process (server_api.launcher) exited or never became ready. The message is one
    line naming the log; ``log_tail`` holds the log's end for a test or benchmark report."""

    code = ErrorCode.LAUNCH_FAILED

    def __init__(self, message: str, log: Path, tail_chars: int = 3000) -> None:
        self.log = log
        self.log_tail = log.read_text(errors="replace")[-tail_chars:] if log.is_file() else ""
        super().__init__(f"{message}; its log: {log}")
