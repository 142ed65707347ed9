"""`fedface server` and `fedface admin` through the real CLI entry point: errors are one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedface import cli


@pytest.fixture(autouse=True)
def _commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # Until fedface/cli.py lists them, register the two commands for these tests only.
    monkeypatch.setitem(cli.COMMANDS, "server", ("fedface.commands.server", "round server"))
    monkeypatch.setitem(cli.COMMANDS, "admin", ("fedface.commands.admin", "operate a round server"))


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedface {command}: error: "), err
    return err[0]


def test_server_refuses_to_start_without_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Execute
    code = cli.main(["server", "--data-dir", str(tmp_path), "--model", "random"])
    # Assert
    assert code == 2 and "FEDFACE_ADMIN_TOKEN is not set" in _one_error_line(capsys, "server")
    assert not (tmp_path / "admin_token").exists()


def test_server_rejects_weak_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    monkeypatch.setenv("FEDFACE_ADMIN_TOKEN", "changeme")
    monkeypatch.setenv("FEDFACE_TEMPLATE_KEY", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
    # Execute
    code = cli.main(["server", "--data-dir", str(tmp_path)])
    # Assert
    assert code == 2 and "weak" in _one_error_line(capsys, "server")


def test_server_reports_missing_default_model_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a model path that does not exist (the bundled default may not exist either).
    missing = tmp_path / "nope.pt"
    # Execute
    code = cli.main(["server", "--dev", "--data-dir", str(tmp_path / "d"), "--model", str(missing)])
    # Assert
    assert code == 2 and "does not exist" in _one_error_line(capsys, "server")


def test_server_ssl_flags_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["server", "--dev", "--data-dir", str(tmp_path), "--ssl-certfile", "cert.pem"])
    assert code == 2 and "--ssl-keyfile" in _one_error_line(capsys, "server")


def test_admin_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Execute: no token anywhere, then a token but nothing listening.
    no_token = cli.main(["admin", "round", "status", "--data-dir", str(tmp_path)])
    no_token_line = _one_error_line(capsys, "admin")
    monkeypatch.setenv("FEDFACE_ADMIN_TOKEN", "t" * 40)
    unreachable = cli.main(["admin", "round", "open", "--server", "http://127.0.0.1:9", "--data-dir", str(tmp_path)])
    # Assert
    assert no_token == 2 and "FEDFACE_ADMIN_TOKEN" in no_token_line
    assert unreachable == 2 and "cannot reach http://127.0.0.1:9" in _one_error_line(capsys, "admin")
