"""The API documentation and the operator page in a real headless Chromium, against a real server
process, with every host but 127.0.0.1 unresolvable: what a phone developer and an operator see.

With FEDFACE_SCREENSHOTS=DIR the screenshots are also written there (server_api/docs/ holds the
ones the README shows)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

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


def _publish_threshold(http: httpx.Client, token: dict[str, str], version: str, threshold: float) -> None:
    body = {"threshold": threshold, "far": 0.001, "calibration": "a test's made-up faces"}
    response = http.put(f"/v1/admin/models/{version}/verification", json=body, headers=token)
    assert response.status_code == 200, response.text


def _run_round(
    http: httpx.Client, token: dict[str, str], devices: list[Device], rng: np.random.Generator, scale: float
) -> dict[str, Any]:
    """A round of two uploads, deltas of standard deviation `scale`, run to its end; its admin view."""
    body = {"target_participants": 2, "min_participants": 2, "deadline_s": 120, "selection_window_s": 0}
    opened = http.post("/v1/admin/rounds", json=body, headers=token).json()
    base = None
    for device in devices:
        assert device.checkin().json()["status"] == "selected"
        base = base or load_backbone_bytes(device.backbone(opened["base_version"]).content)
        delta = make_delta(base, rng, scale=scale)
        upload = device.upload(opened["id"], update_file(delta, unit_vector(rng), opened["base_version"], 5))
        assert upload.status_code == 201, upload.text
    return _wait_until_ended(http, token, opened["id"])


def _three_rounds(server: ServerProcess) -> list[dict[str, Any]]:
    """Thresholds published on the first version (0.31) and on round 1's (0.35, recalibrated; round 2's
    inherits it); rounds 1 and 2 complete with two real uploads each, round 2 moving the backbone three
    times as far; round 3 is closed with none and fails. The rounds' admin views, oldest first."""
    token = {"Authorization": f"Bearer {server.admin_token()}"}
    rng = np.random.default_rng(3)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        devices = [Device(http) for _ in range(3)]
        for device in devices:
            assert device.register().status_code == 201 and device.enroll(unit_vector(rng)).status_code == 201
        _publish_threshold(http, token, http.get("/v1/admin/models", headers=token).json()[0]["version"], 0.31)
        round1 = _run_round(http, token, devices[:2], rng, scale=1e-3)
        _publish_threshold(http, token, round1["result_version"], 0.35)
        round2 = _run_round(http, token, devices[1:], rng, scale=3e-3)
        body = {"target_participants": 2, "min_participants": 2, "deadline_s": 120, "selection_window_s": 0}
        round3 = http.post("/v1/admin/rounds", json=body, headers=token).json()
        assert http.post(f"/v1/admin/rounds/{round3['id']}/close", headers=token).status_code == 200
        return [round1, round2, _wait_until_ended(http, token, round3["id"])]


def _wait_until_ended(http: httpx.Client, token: dict[str, str], round_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while (status := http.get(f"/v1/admin/rounds/{round_id}", headers=token).json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, f"round {round_id} did not end"
        time.sleep(0.3)
    return status


def _backbone_change(server: ServerProcess, base: str, result: str) -> float:
    """The L2 norm of result minus base over every float tensor, from the backbones the server serves."""
    token = {"Authorization": f"Bearer {server.admin_token()}"}
    before, after = (
        load_backbone_bytes(httpx.get(f"{server.url}/v1/admin/models/{v}/backbone", headers=token, timeout=60).content)
        for v in (base, result)
    )
    return float(np.sqrt(sum(
        np.sum((after[k].astype(np.float64) - before[k].astype(np.float64)) ** 2) for k in before if before[k].dtype.kind == "f"
    )))


def _chart(page: Page, chart_id: str) -> dict[str, Any]:
    """What the browser drew in one chart: its size, and each mark's value, tooltip and shapes' boxes."""
    return page.evaluate(f"""(() => {{
        const svg = document.getElementById({chart_id!r});
        if (!svg) return null;
        const box = svg.getBoundingClientRect();
        const marks = [...svg.querySelectorAll('g.mark')].map(g => ({{
            value: Number(g.dataset.value), tip: g.querySelector('title').textContent,
            shapes: [...g.children].filter(c => c.tagName !== 'title').map(c => {{
                const b = c.getBBox(); return {{cls: c.getAttribute('class'), y: b.y, height: b.height, width: b.width}};
            }}),
        }}));
        return {{width: box.width, height: box.height, marks}};
    }})()""")


def test_operator_page_shows_rounds_versions_and_their_charts_after_logging_in(
    server: ServerProcess,
    browser: Browser,
    tmp_path: Path,
) -> None:
    # Prepare
    rounds = _three_rounds(server)
    expected_change = [_backbone_change(server, r["base_version"], r["result_version"]) for r in rounds[:2]]
    page = browser.new_page()
    # Execute: the page sends a browser without the cookie to the login form; a wrong token, then the right one
    page.goto(server.url + "/ui")
    landed_on = page.evaluate("location.pathname")
    page.submit_form("form.login", {"token": "not-the-token"})
    refused = page.text()
    page.submit_form("form.login", {"token": server.admin_token()})
    text = page.text()
    uploads, duration = _chart(page, "chart-uploads"), _chart(page, "chart-duration")
    change, threshold = _chart(page, "chart-change"), _chart(page, "chart-threshold")
    inherited = page.evaluate("document.querySelectorAll('#chart-threshold g.mark circle.inherited').length")
    rows = page.evaluate("[...document.querySelectorAll('#rounds tbody tr')].map(r => r.innerText)")
    versions = page.evaluate("[...document.querySelectorAll('#versions tbody tr')].map(r => r.innerText)")
    cookie_visible_to_scripts = page.evaluate("document.cookie")
    _keep_screenshot(page, tmp_path, "ui.png")
    # Assert: the tables
    assert landed_on == "/ui/login" and "That is not the admin token" in refused
    assert page.evaluate("location.pathname") == "/ui" and "FedFace round server" in text
    assert "3 devices, 3 enrolled" in text and "1 failed" in text
    assert len(rows) == 3 and "failed" in rows[0] and "deadline passed with 0 update(s)" in rows[0]
    assert all("completed\tfedface, fedavg\t2\t2\t2\t2 / 2\t" in row and "loss" in row for row in rows[1:])
    assert len(versions) == 3 and "round 2" in versions[0] and "round 1" in versions[1] and "initial model" in versions[2]
    # Assert: every chart drawn, one mark per round (per version), oldest on the left
    assert all(chart and chart["width"] > 300 and chart["height"] > 100 for chart in (uploads, duration, change, threshold))
    assert [m["value"] for m in uploads["marks"]] == [2, 2, 0]
    assert all("of target 2 (minimum 2)" in m["tip"] for m in uploads["marks"])
    assert [s["cls"] for s in uploads["marks"][0]["shapes"]] == ["selected", "uploaded", "target", "minimum"]
    assert [s["cls"] for s in uploads["marks"][2]["shapes"]][1] == "failed"
    ended = [(datetime.fromisoformat(r["closed_at"]) - datetime.fromisoformat(r["created_at"])).total_seconds() for r in rounds]
    np.testing.assert_allclose([m["value"] for m in duration["marks"]], ended, atol=0.01)
    assert all("deadline 120 s" in m["tip"] for m in duration["marks"])
    # Assert: what each completed round changed, as the served backbones say, the failed one absent; bars to scale
    shown_change = [m["value"] for m in change["marks"]]
    np.testing.assert_allclose(shown_change, expected_change, rtol=1e-6)
    assert shown_change == [r["summary"]["change_norm"] for r in rounds[:2]] and 2.5 < shown_change[1] / shown_change[0] < 3.5
    heights = [m["shapes"][0]["height"] for m in change["marks"]]
    assert heights[0] > 5 and heights[1] / heights[0] == pytest.approx(shown_change[1] / shown_change[0], rel=0.02)
    assert f"moved by {shown_change[1]:.4g}" in change["marks"][1]["tip"] and "loss" in change["marks"][1]["tip"]
    # Assert: each version's threshold: published, recalibrated, then inherited (a hollow point), higher drawn higher
    assert [m["value"] for m in threshold["marks"]] == [0.31, 0.35, 0.35] and inherited == 1
    assert "inherited from its parent" in threshold["marks"][2]["tip"] and "calibrated for it" in threshold["marks"][1]["tip"]
    assert threshold["marks"][1]["shapes"][0]["y"] < threshold["marks"][0]["shapes"][0]["y"] - 20
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
