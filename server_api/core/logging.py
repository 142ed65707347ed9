"""Logs, one record a line: JSON objects in production, readable text in ``--dev``.

Call sites pass structured data as ``extra={"fields": {...}}``; both formats carry the same
fields. Nothing here inspects payloads: keeping templates out of logs is the call sites' job,
and they only ever log ids, counts and sizes.
"""
from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

LOGGER_NAME = "fedface.server"


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
    }


def configure_logging(level: str = "INFO", human: bool = False) -> None:
    logging.config.dictConfig(logging_config(level, human))


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")
