"""The API documentation and the operator page in a real headless Chromium, against a real server
process, with every host but 127.0.0.1 unresolvable: what a phone developer and an operator see.

With FEDFACE_SCREENSHOTS=DIR the screenshots are also written there (server_api/docs/ holds the
ones the README shows)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from headless_chromium import CHROMIUM, Browser, Page
from server_process import ServerProcess
from server_testkit import Device, load_backbone_bytes, make_delta, unit_vector, update_file


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Browser]:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            raise RuntimeError("chromium is not installed; .ci/run installs it")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with Browser(tmp_path / "chromium-profile") as chromium:
        yield chromium


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path / "data").start()
    try:
        yield process
    finally:
        process.stop()


def _keep_screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    shot = page.screenshot(tmp_path / name)
    if os.environ.get("FEDFACE_SCREENSHOTS"):
        shutil.copy(shot, Path(os.environ["FEDFACE_SCREENSHOTS"]) / name)
    return shot


def _only_from(page: Page, origin: str) -> list[str]:
    """The URLs the page requested from anywhere but the server (data: and blob: URLs are in-page)."""
    return [u for u in page.requested_urls() if not u.startswith((origin + "/", "data:", f"blob:{origin}/"))]


def test_docs_render_every_operation_offline_and_show_how_to_authenticate(
    server: ServerProcess,
    browser: Browser,
    tmp_path: Path,
) -> None:
    # Prepare
    spec = httpx.get(server.url + "/openapi.json").json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    page = browser.new_page()
    # Execute: Swagger UI, its Authorize dialog, then ReDoc
    page.goto(server.url + "/docs")
    rendered = page.wait_for(
        f"document.querySelectorAll('.opblock').length >= {operations} && document.querySelectorAll('.opblock').length"
    )
    shot = _keep_screenshot(page, tmp_path, "docs.png")
    page.evaluate("document.querySelector('.btn.authorize').click()")
    dialog = page.wait_for("document.querySelector('.modal-ux') && document.querySelector('.modal-ux').innerText")
    page.goto(server.url + "/redoc")
    redoc_operations = page.wait_for("document.querySelectorAll('[data-section-id^=\"operation/\"]').length")
    redoc_text = page.text()
    # Assert: every operation rendered, from assets the server itself served
    assert rendered == operations and redoc_operations == operations
    assert _only_from(page, server.url) == [] and page.failed_requests() == []
    assert "/v1/rounds/current/checkin" in page.evaluate("document.body.innerHTML")
    for header in ("X-Device-Id", "X-Timestamp", "X-Nonce", "X-Signature"):
        assert header in dialog and header in redoc_text
    assert "AdminToken" in dialog and "FEDFACE-V1" in dialog
    assert shot.stat().st_size < 400_000


def _completed_and_failed_round(server: ServerProcess) -> None:
    """Round 1 completes with two real uploads; round 2 is closed with none and fails."""
    token = {"Authorization": f"Bearer {server.admin_token()}"}
    rng = np.random.default_rng(3)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        devices = [Device(http) for _ in range(3)]
        for device in devices:
            assert device.register().status_code == 201 and device.enroll(unit_vector(rng)).status_code == 201
        body = {"target_participants": 2, "min_participants": 2, "deadline_s": 120, "selection_window_s": 0}
        round1 = http.post("/v1/admin/rounds", json=body, headers=token).json()
        base = None
        for device in devices[:2]:
            assert device.checkin().json()["status"] == "selected"
            base = base or load_backbone_bytes(device.backbone(round1["base_version"]).content)
            upload = device.upload(
                round1["id"], update_file(make_delta(base, rng), unit_vector(rng), round1["base_version"], 5)
            )
            assert upload.status_code == 201, upload.text
        _wait_until_ended(http, token, round1["id"])
        round2 = http.post("/v1/admin/rounds", json=body, headers=token).json()
        assert http.post(f"/v1/admin/rounds/{round2['id']}/close", headers=token).status_code == 200
        _wait_until_ended(http, token, round2["id"])


def _wait_until_ended(http: httpx.Client, token: dict[str, str], round_id: int) -> None:
    deadline = time.monotonic() + 90
    while http.get(f"/v1/admin/rounds/{round_id}", headers=token).json()["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, f"round {round_id} did not end"
        time.sleep(0.3)


def test_operator_page_shows_rounds_versions_and_a_plot_after_logging_in(
    server: ServerProcess,
    browser: Browser,
    tmp_path: Path,
) -> None:
    # Prepare
    _completed_and_failed_round(server)
    page = browser.new_page()
    # Execute: the page sends a browser without the cookie to the login form; a wrong token, then the right one
    page.goto(server.url + "/ui")
    landed_on = page.evaluate("location.pathname")
    page.submit_form("form.login", {"token": "not-the-token"})
    refused = page.text()
    page.submit_form("form.login", {"token": server.admin_token()})
    text = page.text()
    bars = page.evaluate("document.querySelectorAll('svg.chart g rect').length")
    points = page.evaluate("document.querySelectorAll('svg.chart circle.duration').length")
    rows = page.evaluate("[...document.querySelectorAll('#rounds tbody tr')].map(r => r.innerText)")
    versions = page.evaluate("[...document.querySelectorAll('#versions tbody tr')].map(r => r.innerText)")
    cookie_visible_to_scripts = page.evaluate("document.cookie")
    _keep_screenshot(page, tmp_path, "ui.png")
    # Assert
    assert landed_on == "/ui/login" and "That is not the admin token" in refused
    assert page.evaluate("location.pathname") == "/ui" and "FedFace round server" in text
    assert "3 devices, 3 enrolled" in text and "1 failed" in text
    assert len(rows) == 2 and "failed" in rows[0] and "deadline passed with 0 update(s)" in rows[0]
    assert "completed\tfedface, fedavg\t2\t2\t2\t2 / 2\t" in rows[1] and "loss" in rows[1]
    assert len(versions) == 2 and "round 1" in versions[0] and "initial model" in versions[1]
    assert bars == 4 and points == 2  # selected + uploaded per round; one duration point each
    assert "fedface_ui" not in cookie_visible_to_scripts  # HttpOnly
    assert _only_from(page, server.url) == []


def test_operator_page_takes_a_bearer_token_and_refuses_a_wrong_one(server: ServerProcess) -> None:
    # Execute
    with httpx.Client(base_url=server.url, timeout=30) as http:
        anonymous = http.get("/ui")
        wrong = http.get("/ui", headers={"Authorization": "Bearer " + "x" * 40})
        right = http.get("/ui", headers={"Authorization": f"Bearer {server.admin_token()}"})
    # Assert
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/ui/login"
    assert wrong.status_code == 401 and wrong.json() == {"detail": "missing or wrong admin token", "code": "authentication_failed"}
    assert right.status_code == 200 and "<svg" not in right.text and "No round yet" in right.text
    assert (
        "default-src 'none'" in right.headers["content-security-policy"]
        and right.headers["cache-control"] == "no-store"
    )


def test_another_sites_form_cannot_log_the_operator_out_but_the_pages_own_button_can(
    server: ServerProcess,
    browser: Browser,
) -> None:
    # Prepare: a signed-in operator; a page from another origin (a data: URL, as an attacker's site) whose form
    # posts to this server's logout
    page = browser.new_page()
    page.goto(server.url + "/ui/login")
    page.submit_form("form.login", {"token": server.admin_token()})
    signed_in = page.evaluate("location.pathname")
    page.goto(f"data:text/html,<form method=post action={server.url}/ui/logout></form>")
    # Execute: the other site's form, back to /ui, then the page's own Log out button
    page.submit_form("form", {})
    refused = page.text()
    page.goto(server.url + "/ui")
    still_signed_in = page.evaluate("location.pathname")
    page.submit_form("form[action='/ui/logout']", {})
    logged_out = page.evaluate("location.pathname")
    page.goto(server.url + "/ui")
    # Assert
    assert signed_in == "/ui" and "cross-site request refused" in refused and still_signed_in == "/ui"
    assert logged_out == "/ui/login" and page.evaluate("location.pathname") == "/ui/login"
