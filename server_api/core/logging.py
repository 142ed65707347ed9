"""Logs, one record a line: JSON objects in production, readable text in ``--dev``.

Call sites pass structured data as ``extra={"fields": {...}}``; both formats carry the same
fields. Nothing here inspects payloads: keeping templates out of logs is the call sites' job,
and they only ever log ids, counts and sizes.

Invariant: once :func:`configure_logging` ran, every record and every Python warning of the process goes
through the one handler, so in production each line is a JSON object a log shipper can parse. Warnings
(``warnings.warn``) become records of the ``fedface.server.warnings`` logger at WARNING, or at DEBUG
when raised inside :func:`expected_warnings` (the ONNX tracer's, which the export knows about); and
the root logger carries the same handler, so another library's warning is a record too rather than
Python's bare last-resort line.
"""
from __future__ import annotations

import json
import logging
import logging.config
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

LOGGER_NAME = "fedface.server"
WARNINGS_LOGGER = f"{LOGGER_NAME}.warnings"
# Why the warnings raised in this context are expected; a context variable, so one thread's export
# does not quieten a warning another thread raises meanwhile.
_expected_because: ContextVar[str | None] = ContextVar("expected_warnings", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``10:42:01 INFO  rounds: round completed round_id=3 n_updates=10`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix(LOGGER_NAME + ".")
        clock = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        line = f"{clock} {record.levelname:<7} {name}: {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def logging_config(level: str = "INFO", human: bool = False) -> dict[str, Any]:
    """dictConfig for our loggers and uvicorn's (also passed to ``uvicorn.run(log_config=...)``);
    ``human`` picks the text format (``--dev``) over JSON."""
    handler = {"class": "logging.StreamHandler", "formatter": "text" if human else "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}, "text": {"()": TextFormatter}},
        "handlers": {"default": handler},
        "loggers": {
            LOGGER_NAME: {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["default"], "level": level.upper(), "propagate": False},
        },
        # Any other library's warnings and errors: through the same handler, never as a bare stderr line.
        "root": {"handlers": ["default"], "level": "WARNING"},
    }


def configure_logging(level: str = "INFO", human: bool = False) -> None:
    logging.config.dictConfig(logging_config(level, human))
    warnings.showwarning = _log_warning


@contextmanager
def expected_warnings(reason: str) -> Iterator[None]:
    """Python warnings raised in this block (in this thread or task) are known and harmless, ``reason``
    says why: logged at DEBUG with it, not at WARNING."""
    token = _expected_because.set(reason)
    try:
        yield
    finally:
        _expected_because.reset(token)


def _log_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` once logging is configured: a warning is a log record, one line like any other."""
    if file is not None:  # a caller that names its own stream gets the plain text it asked for
        file.write(warnings.formatwarning(message, category, filename, lineno, line))
        return
    reason = _expected_because.get()
    fields: dict[str, Any] = {"category": category.__name__, "source": f"{filename}:{lineno}"}
    if reason is not None:
        fields["expected"] = reason
    logging.getLogger(WARNINGS_LOGGER).log(
        logging.DEBUG if reason is not None else logging.WARNING, str(message), extra={"fields": fields},
    )


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")
