"""Domain errors of the round server.

Services and CRUD raise these; only :mod:`server_api.api.handlers` turns them into
HTTP status codes, so the same code paths work from the CLI, the background
scheduler and tests without an HTTP layer. They derive from FaceCoreError so the
`fedface` CLI prints them as one line.
"""
from __future__ import annotations

from pathlib import Path

from facecore.errors import FaceCoreError


class ServerError(FaceCoreError):
    """Base class of everything the server raises on purpose."""


class ConfigError(ServerError):
    """The server cannot start with these settings (missing or weak secrets, bad URL...)."""


class AuthenticationFailed(ServerError):
    """Missing/invalid signature, skewed clock, replayed nonce, unknown device or bad token."""


class Forbidden(ServerError):
    """Authenticated, but the resource belongs to someone else."""


class NotFound(ServerError):
    pass


class Conflict(ServerError):
    """The request is valid but does not fit the current state (e.g. already enrolled)."""


class StaleRound(Conflict):
    """An upload or check-in for a round that is no longer accepting it."""

    def __init__(self, requested: int | None, current: int | None, status: str | None = None) -> None:
        self.requested = requested
        self.current = current
        now = "no round is open" if current is None else f"current round is {current}" + (f" ({status})" if status else "")
        super().__init__(f"round {requested} is not accepting this request; {now}")


class InvalidInput(ServerError):
    """Semantically invalid payload (wrong shape, NaN, norm bound...)."""


class PayloadTooLarge(ServerError):
    pass


class Unavailable(ServerError):
    """The server cannot take this request right now, and the same request will succeed on retry."""


class RateLimited(ServerError):
    """Too many requests from one device or one address; the same request succeeds after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class RequestTimeout(ServerError):
    """The request body did not arrive within the server's body read timeout."""


class AdminClientError(ServerError):
    """`fedface admin` could not talk to the server or the server refused the request."""


class LaunchFailed(ServerError):
    """A local server process (server_api.launcher) exited or never became ready. The message is one
    line naming the log; ``log_tail`` holds the log's end for a test or benchmark report."""

    def __init__(self, message: str, log: Path, tail_chars: int = 3000) -> None:
        self.log = log
        self.log_tail = log.read_text(errors="replace")[-tail_chars:] if log.is_file() else ""
        super().__init__(f"{message}; its log: {log}")
