"""Both log formats carry the same fields: JSON objects for production, readable lines for --dev."""

import json
import logging

from server_api.core.logging import JsonFormatter, TextFormatter


def _record() -> logging.LogRecord:
    record = logging.LogRecord("fedface.server.rounds", logging.INFO, __file__, 1, "round completed", None, None)
    record.fields = {"round_id": 3, "n_updates": 10}
    return record


def test_json_lines_for_production() -> None:
    # Execute
    entry = json.loads(JsonFormatter().format(_record()))
    # Assert
    assert (
        entry["msg"] == "round completed"
        and entry["round_id"] == 3
        and entry["n_updates"] == 10
        and entry["level"] == "INFO"
    )


def test_text_lines_for_a_terminal() -> None:
    # Execute
    line = TextFormatter().format(_record())
    # Assert: "HH:MM:SS INFO    rounds: round completed round_id=3 n_updates=10"
    clock, rest = line.split(" ", 1)
    assert len(clock) == 8 and clock[2] == clock[5] == ":"
    assert rest == "INFO    rounds: round completed round_id=3 n_updates=10"
