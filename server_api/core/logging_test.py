"""Both log formats carry the same fields: JSON objects for production, readable lines for --dev; Python
warnings are log records too."""

import json
import logging
import warnings

from server_api.core.logging import WARNINGS_LOGGER, JsonFormatter, TextFormatter, _log_warning, expected_warnings


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


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_python_warnings_are_records_and_expected_ones_are_debug() -> None:
    # Prepare: the warnings logger's records collected by a handler of the test's own; warnings shown through the
    # logging module's hook (catch_warnings puts Python's own back afterwards)
    collect = _Collect()
    logger = logging.getLogger(WARNINGS_LOGGER)
    logger.addHandler(collect)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = _log_warning
            # Execute: one warning anywhere, one where it is expected
            warnings.warn("something odd", UserWarning, stacklevel=1)
            with expected_warnings("a test's export"):
                warnings.warn("Constant folding - not applied", UserWarning, stacklevel=1)
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)
    # Assert: both are JSON lines with their category and source; only the expected one is DEBUG
    odd, expected = (json.loads(JsonFormatter().format(record)) for record in collect.records)
    assert (odd["level"], odd["msg"], odd["category"]) == ("WARNING", "something odd", "UserWarning")
    assert odd["source"].startswith(__file__) and "expected" not in odd
    assert (expected["level"], expected["expected"]) == ("DEBUG", "a test's export")
