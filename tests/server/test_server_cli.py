"""`fedface server` and `fedface admin` through the real CLI entry point: errors are one line, runtime
errors exit 1 and usage errors 2, and each operator friction point is reproduced against a real server."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from fedface import cli
from server_process import REPO, ServerProcess, free_port
from server_testkit import Device, unit_vector


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedface {command}: error: "), err
    return err[0]


def test_server_refuses_to_start_without_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Execute
    code = cli.main(["server", "--data-dir", str(tmp_path), "--model", "random", "--port", str(free_port())])
    # Assert
    assert code == 1 and "FEDFACE_ADMIN_TOKEN is not set" in _one_error_line(capsys, "server")
    assert not (tmp_path / "admin_token").exists()


def test_server_rejects_weak_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    monkeypatch.setenv("FEDFACE_ADMIN_TOKEN", "changeme")
    monkeypatch.setenv("FEDFACE_TEMPLATE_KEY", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
    # Execute
    code = cli.main(["server", "--data-dir", str(tmp_path), "--port", str(free_port())])
    # Assert
    assert code == 1 and "weak" in _one_error_line(capsys, "server")


def test_server_reports_missing_default_model_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a model path that does not exist (the bundled default may not exist either).
    missing = tmp_path / "nope.pt"
    # Execute
    code = cli.main(
        ["server", "--dev", "--data-dir", str(tmp_path / "d"), "--model", str(missing), "--port", str(free_port())]
    )
    # Assert
    assert code == 1 and "does not exist" in _one_error_line(capsys, "server")


def test_server_ssl_flags_go_together_as_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Execute
    code = cli.main(["server", "--dev", "--data-dir", str(tmp_path), "--ssl-certfile", "cert.pem"])
    # Assert
    assert code == 2 and "--ssl-keyfile" in _one_error_line(capsys, "server")


def test_a_busy_port_is_one_line_before_the_banner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: something already listens on the port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Execute
        code = cli.main(
            ["server", "--dev", "--data-dir", str(tmp_path / "d"), "--model", "random", "--port", str(port)]
        )
    # Assert: nothing started (no banner, no data folder, no migration), one line naming the address
    line = _one_error_line(capsys, "server")
    assert code == 1 and f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line
    assert not (tmp_path / "d").exists()


def _server_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`fedface server ARGS` in a process of its own, as an operator runs it, none of the caller's settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FEDFACE_")} | {"PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "fedface", "server", *args], capture_output=True, text=True, env=base | (env or {}),
        timeout=120,
    )


PASSWORD = "hunter2-not-for-logs"
# case: (--db, --data-dir inside the test's folder, what the one line must say); {tmp} is the test's folder, {port} a
# closed port
BAD_DATABASES: dict[str, tuple[str | None, str, list[str]]] = {
    "postgres-refused": (f"postgres://nobody:{PASSWORD}@127.0.0.1:{{port}}/x", "d",
                         ["cannot open database postgres://nobody:***@127.0.0.1:{port}/x: ", "Connection refused"]),
    "unknown-host": (f"postgresql://nobody:{PASSWORD}@no-such-host.invalid/x", "d",
                     ["cannot open database postgresql://nobody:***@no-such-host.invalid/x: ", "no-such-host.invalid"]),
    "bad-scheme": (f"mysql://nobody:{PASSWORD}@db/x", "d", ["database URL mysql://nobody:***@db/x: unsupported scheme 'mysql'"]),
    "port-not-a-number": (f"postgresql://nobody:{PASSWORD}@db:five/x", "d", ["postgresql://nobody:***@db:five/x is malformed: its port"]),
    "sqlite-folder-missing": ("sqlite:///{tmp}/missing/x.db", "d",
                              ["cannot open database sqlite:///{tmp}/missing/x.db: folder {tmp}/missing does not exist"]),
    "sqlite-folder-is-a-file": ("sqlite:///{tmp}/file/x.db", "d", ["cannot open database sqlite:///{tmp}/file/x.db: {tmp}/file is not a folder"]),
    "sqlite-folder-unwritable": ("sqlite:///{tmp}/locked/x.db", "d", ["sqlite:///{tmp}/locked/x.db: ", "not writable"]),
    "data-folder-is-a-file": (None, "file/d", ["cannot use data folder {tmp}/file/d: Not a directory"]),
}


@pytest.mark.parametrize("case", BAD_DATABASES)
def test_a_database_that_cannot_be_opened_is_one_line_naming_it_before_the_banner(case: str, tmp_path: Path) -> None:
    # Prepare: a file where a folder should be, a folder nobody may write to
    if case == "sqlite-folder-unwritable" and os.geteuid() == 0:
        pytest.skip("root may write to any folder")
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "locked").mkdir(mode=0o500)
    port = free_port()
    db_template, data_dir, expected_template = BAD_DATABASES[case]
    db = None if db_template is None else db_template.format(tmp=tmp_path, port=port)
    expected = [part.format(tmp=tmp_path, port=port) for part in expected_template]
    # Execute
    result = _server_cli("--dev", "--data-dir", str(tmp_path / data_dir), "--model", "random", "--port", str(free_port()),
                         *(["--db", db] if db is not None else []))
    # Assert: one line, the URL without its password, the cause; nothing started and, for the operator's own
    # database, nothing written
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert len(lines) == 1 and lines[0].startswith("fedface server: error: "), result.stderr[-3000:]
    assert all(part in lines[0] for part in expected), lines[0]
    assert PASSWORD not in result.stderr and "Traceback" not in result.stderr
    assert db is None or not (tmp_path / data_dir).exists()


def test_a_missing_or_bad_tls_file_is_one_line_naming_it_before_the_banner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a certificate that does not exist; a "certificate" that is not PEM
    (tmp_path / "junk.pem").write_text("not a certificate")
    base = ["server", "--dev", "--data-dir", str(tmp_path / "d"), "--model", "random", "--port", str(free_port())]
    # Execute
    missing = cli.main([*base, "--ssl-certfile", str(tmp_path / "none.pem"), "--ssl-keyfile", str(tmp_path / "none.key")])
    missing_line = _one_error_line(capsys, "server")
    junk = cli.main([*base, "--ssl-certfile", str(tmp_path / "junk.pem"), "--ssl-keyfile", str(tmp_path / "junk.pem")])
    junk_line = _one_error_line(capsys, "server")
    # Assert: nothing started, the files named
    assert missing == 1 and f"cannot use TLS certificate {tmp_path}/none.pem with key {tmp_path}/none.key: No such file" in missing_line
    assert junk == 1 and f"{tmp_path}/junk.pem" in junk_line and "not a PEM certificate and its key" in junk_line
    assert not (tmp_path / "d").exists()


def test_admin_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare
    monkeypatch.delenv("FEDFACE_ADMIN_TOKEN", raising=False)
    # Execute: no token anywhere, then a token but nothing listening.
    no_token = cli.main(["admin", "round", "status", "--data-dir", str(tmp_path)])
    no_token_line = _one_error_line(capsys, "admin")
    monkeypatch.setenv("FEDFACE_ADMIN_TOKEN", "t" * 40)
    unreachable = cli.main(["admin", "round", "open", "--server", "http://127.0.0.1:9", "--data-dir", str(tmp_path)])
    # Assert
    assert no_token == 1 and "FEDFACE_ADMIN_TOKEN" in no_token_line
    assert unreachable == 1 and "cannot reach http://127.0.0.1:9" in _one_error_line(capsys, "admin")


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    # INFO, so the log shows what --dev prints to an operator's terminal
    process = ServerProcess(tmp_path / "data", FEDFACE_LOG_LEVEL="INFO").start()
    try:
        yield process
    finally:
        process.stop()


def _admin(server: ServerProcess, *args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FEDFACE_ADMIN_TOKEN"} | {"PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "fedface", "admin", *args, "--server", server.url, "--data-dir", str(server.data_dir)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )


def test_round_commands_against_a_real_server(server: ServerProcess) -> None:
    # Execute: list with no rounds; open; status into a pipe nobody reads; close; list again
    empty = _admin(server, "round", "list")
    opened = _admin(
        server, "round", "open", "--settings", "paper", "--target", "3", "--min", "2", "--deadline", "120", "--selection-window", "0",
        "--trainable-blocks", "2", "--lr", "0.1", "--spreadout-nu", "0", "--spreadout-lr", "10", "--spreadout-center",
        "--local-steps", "1", "--weighting", "devices", "--keep-templates", "--server-momentum", "0.9", "--spreadout-steps", "0",
    )
    shown = _admin(server, "round", "status", "--json")
    read_end, write_end = os.pipe()
    os.close(read_end)  # `fedface admin round status | head -0`: the reader is gone before the first line
    piped = _admin(server, "round", "status", stdout=write_end)
    os.close(write_end)
    closed = _admin(server, "round", "close")
    listed = _admin(server, "round", "list")
    # Assert
    assert empty.returncode == 0 and "no rounds yet" in empty.stdout
    assert opened.returncode == 0 and opened.stdout.startswith("round 1: open (fedface, fedavg)")
    config = json.loads(shown.stdout)["config"]
    assert (config["local"]["trainable_blocks"], config["local"]["lr"], config["local"]["steps"]) == (2, 0.1, 1)
    assert (config["aggregation"]["weighting"], config["aggregation"]["server_momentum"], config["local"]["train_embedding"]) == ("devices", 0.9, False)
    assert {k: config["spreadout"][k] for k in ("nu", "lr", "center", "steps")} == {"nu": 0.0, "lr": 10.0, "center": True, "steps": 0}
    assert piped.returncode == cli.EXIT_BROKEN_PIPE and piped.stderr == ""
    assert closed.returncode == 0, closed.stderr
    assert (
        closed.stdout.startswith("round 1: failed") and "deadline passed with 0 update(s), 2 required" in closed.stdout
    )
    header, row = listed.stdout.splitlines()
    assert header.split()[:3] == ["ROUND", "STATE", "UPLOADED/SELECTED/CHECKED-IN"] and row.split()[:4] == [
        "1",
        "failed",
        "0/0/0",
        "3/2",
    ]


@pytest.mark.slow
def test_round_open_takes_the_fleet_camera_settings_on_the_centre_model_center_published(
    server: ServerProcess, small_lfw_data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: a random bootstrap model, which publishes no centre; 40 public photos make one quickly
    import facecore.eval.feature_center as feature_center

    monkeypatch.setattr(feature_center, "CENTER_PHOTOS", 40)
    connection = ["--server", server.url, "--data-dir", str(server.data_dir)]
    # Execute: open before any centre; publish one from the LFW public photos; open with the defaults and one override
    refused = _admin(server, "round", "open")
    centred = cli.main(["admin", "model", "center", "--source", "lfw", "--data", str(small_lfw_data), "--json", *connection])
    published = json.loads(capsys.readouterr().out)
    opened = _admin(server, "round", "open", "--lr", "0.005", "--local-epochs", "2", "--json")
    # Assert: one line that names the fix; the centre is the core's for exactly the server's bytes; the round runs on it
    from facecore.align.geometry import geometry_of
    from facecore.data.split import SplitConfig, build_split
    from facecore.models.checkpoint import load_backbone

    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "fedface admin model center" in refused.stderr
    assert centred == 0 and published["version"] == server.admin("GET", "/v1/admin/models")[0]["version"]
    token = (server.data_dir / "admin_token").read_text().strip()
    blob = httpx.get(f"{server.url}/v1/admin/models/{published['version']}/backbone", headers={"Authorization": f"Bearer {token}"}).content
    (server.data_dir.parent / "v.pt").write_bytes(blob)
    model = load_backbone(server.data_dir.parent / "v.pt")
    expected = feature_center.public_feature_center(build_split(small_lfw_data, SplitConfig(seed=0)), small_lfw_data, model, geometry_of(model), source="lfw")
    np.testing.assert_allclose(published["feature_center"], expected, atol=1e-6)
    config = json.loads(opened.stdout)["config"]
    assert opened.returncode == 0, opened.stderr
    assert config["local"] | {"feature_center": None} == config["local"] | {
        "lr": 0.005, "trainable_blocks": 8, "train_embedding": False, "epochs": 2, "feature_center": None}
    np.testing.assert_allclose(config["local"]["feature_center"], expected, atol=1e-6)
    assert (config["spreadout"]["steps"], config["aggregation"]["weighting"], config["aggregation"]["server_momentum"]) == (0, "devices", 0.9)


@pytest.mark.slow
def test_model_calibrate_publishes_the_threshold_of_the_downloaded_version(server: ServerProcess, small_lfw_data: Path) -> None:
    # Prepare: the first 80 people of each LFW fold; 151 impostor pairs, enough for a FAR of 1%
    # Execute: list; calibrate the current version on LFW fold 1 (FAR 1%, to keep it short); list again;
    # then ask for the test folds and for a version that does not exist
    before = _admin(server, "model", "list")
    calibrated = _admin(server, "model", "calibrate", "--folds", "1", "--far", "0.01", "--data", str(small_lfw_data), "--json")
    after = _admin(server, "model", "list")
    test_folds = _admin(server, "model", "calibrate", "--folds", "5-6", "--data", str(small_lfw_data))
    unknown = _admin(server, "model", "calibrate", "ffff", "--data", str(small_lfw_data))
    # Assert: what was published is the core's threshold for exactly the server's bytes, public people left out
    from facecore.eval.calibration import calibrate_threshold, public_people
    from facecore.models.checkpoint import load_backbone

    assert calibrated.returncode == 0, calibrated.stderr
    published = json.loads(calibrated.stdout)
    token = (server.data_dir / "admin_token").read_text().strip()
    blob = httpx.get(f"{server.url}/v1/admin/models/{published['version']}/backbone", headers={"Authorization": f"Bearer {token}"}).content
    (server.data_dir.parent / "v.pt").write_bytes(blob)
    expected = calibrate_threshold(
        load_backbone(server.data_dir.parent / "v.pt"), small_lfw_data / "lfw", (1,), 0.01, exclude=public_people(small_lfw_data))
    assert (published["verify_threshold"], published["verify_far"], published["calibration"]) == (
        expected.threshold, 0.01, expected.calibration)
    assert "the model never trained on" in published["calibration"]
    # VERSION ROUND CREATED (date, time) THRESHOLD FAR CALIBRATED-FOR CENTRE; the random bootstrap model publishes neither
    assert before.stdout.splitlines()[1].split()[1:] == ["bootstrap", *after.stdout.splitlines()[1].split()[2:4], "-", "-", "this", "version", "-"]
    assert after.stdout.splitlines()[1].split()[4:] == [f"{expected.threshold:.4f}", "0.01", "this", "version", "-"]
    assert test_folds.returncode == 1 and "are the test set" in test_folds.stderr and len(test_folds.stderr.splitlines()) == 1
    assert unknown.returncode == 1 and "no version among the server's newest 1 start with 'ffff'" in unknown.stderr


def test_device_list_and_remove_delete_the_template_and_revoke_the_key(server: ServerProcess) -> None:
    # Prepare: two enrolled devices
    with httpx.Client(base_url=server.url, timeout=30) as http:
        devices = [Device(http) for _ in range(2)]
        for device in devices:
            assert device.register().status_code == 201
            assert device.enroll(unit_vector(np.random.default_rng(1))).status_code == 201
        gone, kept = devices
        # Execute
        before = _admin(server, "device", "list")
        removed = _admin(server, "device", "remove", gone.id)
        again = _admin(server, "device", "remove", gone.id)
        after = _admin(server, "device", "list", "--json")
        gone_asks, kept_asks = gone.embedding(), kept.embedding()
        unknown = _admin(server, "device", "remove", "ab" * 16)
    # Assert: the template is gone and the device can no longer authenticate; the other is untouched
    assert before.returncode == 0 and sum(" yes " in line for line in before.stdout.splitlines()) == 2
    assert (
        removed.returncode == 0
        and removed.stdout == f"device {gone.id} removed (its template deleted; its key no longer authenticates)\n"
    )
    assert again.returncode == 0 and "it held no template" in again.stdout
    rows = {d["device_id"]: d for d in json.loads(after.stdout)}
    assert (
        rows[gone.id]["status"] == "removed"
        and rows[gone.id]["enrolled"] is False
        and rows[kept.id]["enrolled"] is True
    )
    assert gone_asks.status_code == 401 and kept_asks.status_code == 200
    assert (
        unknown.returncode == 1
        and unknown.stderr == f"fedface admin: error: server answered 404: device {'ab' * 16} does not exist\n"
    )


def test_dev_server_logs_readable_lines(server: ServerProcess) -> None:
    # Execute: a request the access log records
    httpx.get(server.url + "/healthz")
    time.sleep(0.5)
    log = server.log.read_text().splitlines()
    # Assert: "HH:MM:SS LEVEL logger: message", not JSON objects
    served = [line for line in log if "GET /healthz" in line]
    assert served and all(not line.lstrip().startswith("{") for line in log)
    assert served[0][2] == ":" and " INFO " in served[0]


class ProductionServer(ServerProcess):
    """`fedface server` without --dev: secrets from the environment and JSON logs, as an operator deploys it."""

    def __init__(self, data_dir: Path, **env: str) -> None:
        secrets_env = {"FEDFACE_ADMIN_TOKEN": secrets.token_hex(32), "FEDFACE_TEMPLATE_KEY": base64.b64encode(os.urandom(32)).decode()}
        super().__init__(data_dir, **(secrets_env | env))

    def command(self) -> list[str]:
        return [arg for arg in super().command() if arg != "--dev"]

    def admin_token(self) -> str:
        return self.env["FEDFACE_ADMIN_TOKEN"]


def test_every_line_a_production_server_writes_is_json_the_export_warnings_included(tmp_path: Path) -> None:
    # Prepare: a fresh data folder, so the first model is exported to ONNX at start; the dlib ResNet's export
    # is the one torch warns about; DEBUG, so the warnings it demotes are written too
    server = ProductionServer(
        tmp_path / "data", FEDFACE_EXPORT_ONNX="true", FEDFACE_RANDOM_BACKBONE="dlib-resnet", FEDFACE_LOG_LEVEL="DEBUG",
    )
    # Execute: start; a page, a miss, a refused admin call and an admin one; a graceful stop
    server.start()
    try:
        answers = [
            httpx.get(server.url + "/healthz").status_code, httpx.get(server.url + "/no-such-page").status_code,
            httpx.get(server.url + "/v1/admin/rounds", headers={"Authorization": "Bearer " + "x" * 40}).status_code,
        ]
        versions = server.admin("GET", "/v1/admin/models")
    finally:
        server.stop()
    lines = [line for line in server.log.read_text().splitlines() if line.strip()]
    # Assert: every line a JSON object, the banner too; torch's export warnings there as expected, at DEBUG
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
    assert answers == [200, 404, 401] and versions[0]["backbone"] == "dlib-resnet"
    assert all(isinstance(r, dict) and {"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    assert any(r.get("url") == server.url and "operator page at /ui" in r["msg"] for r in records)
    export_warnings = [r for r in records if r["logger"] == "fedface.server.warnings"]
    assert any(r["category"] == "TracerWarning" for r in export_warnings), [r["msg"] for r in records]
    assert all(r["level"] == "DEBUG" and "onnx" in r["expected"] for r in export_warnings)
    assert any('"GET /no-such-page HTTP/1.1" 404' in r["msg"] for r in records)


def test_a_token_server_registers_only_with_an_issued_token_and_prunes_the_never_enrolled(tmp_path: Path) -> None:
    # Prepare: a dev server that still requires enrollment tokens, as production does
    server = ServerProcess(tmp_path / "data", FEDFACE_REQUIRE_ENROLLMENT_TOKEN="true").start()
    try:
        def device(*args: str) -> subprocess.CompletedProcess[str]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFACE_")} | {"PYTHONPATH": str(REPO)}
            return subprocess.run(
                [sys.executable, "-m", "fedface", "device", "register", "--server", server.url,
                 "--state", str(tmp_path / "phone"), *args],
                capture_output=True, text=True, env=env, timeout=120,
            )

        # Execute
        refused = device()
        issued = _admin(server, "token", "issue", "--count", "2")
        token = issued.stdout.splitlines()[0]
        registered = device("--enrollment-token", token)
        pruned = _admin(server, "device", "prune", "--older-than", "0")
        listed = _admin(server, "device", "list", "--json")
    finally:
        server.stop()
    # Assert: no token, one line and exit 1; with one, registered; the device never enrolled, so it is pruned
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1 and "token" in refused.stderr
    assert issued.returncode == 0 and len(issued.stdout.splitlines()) == 3 and len(token) >= 16
    assert registered.returncode == 0 and registered.stdout.startswith("registered as "), registered.stderr
    assert pruned.returncode == 0 and pruned.stdout.startswith("1 never-enrolled device(s)"), pruned.stderr
    assert json.loads(listed.stdout) == []
