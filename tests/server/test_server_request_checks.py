"""Lax inputs the audit of issue 36 found, in process: signed timestamps in any spelling int() reads, and the
operator page's login and logout posted from another site."""
from __future__ import annotations

import time

import numpy as np
from fastapi.testclient import TestClient

from server_helpers import enrolled_devices

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_a_signed_timestamp_is_ascii_digits_only(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare: an enrolled device; the current time spelled as Python's int() also reads it
    (device,) = enrolled_devices(client, 1, rng)
    now = str(int(time.time()))
    spellings = [f"+{now}", "_".join(now), f"0_{now}", f"{now[:4]}_{now[4:]}", f"+0{now}"]
    # Execute: each is signed as sent, so only the parsing can refuse it
    lax = [device.request("GET", f"/v1/devices/{device.id}", timestamp=stamp) for stamp in spellings]
    plain = device.request("GET", f"/v1/devices/{device.id}", timestamp=now)
    # Assert
    assert [r.status_code for r in lax] == [401] * len(spellings), [r.text for r in lax]
    assert all("ASCII digits" in r.json()["detail"] and r.json()["code"] == "authentication_failed" for r in lax)
    assert plain.status_code == 200


def test_login_and_logout_posted_from_another_site_are_refused(client: TestClient) -> None:
    # Prepare: what a browser sends with a form another site posts here (Sec-Fetch-Site, or only Origin from an older
    # browser, "null" from a sandboxed or data: page), and what the server's own pages and curl send
    token = client.app.state.ctx.admin_token
    elsewhere = [
        {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://other.testserver"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://[::1"},
    ]
    here = [{"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"}, {"Origin": "http://testserver"}, {}]
    # Execute
    logouts_elsewhere = [client.post("/ui/logout", headers=h, follow_redirects=False) for h in elsewhere]
    logins_elsewhere = [
        client.post("/ui/login", content=f"token={token}", headers=FORM | h, follow_redirects=False) for h in elsewhere
    ]
    logouts_here = [client.post("/ui/logout", headers=h, follow_redirects=False) for h in here]
    logins_here = [client.post("/ui/login", content=f"token={token}", headers=FORM | h, follow_redirects=False) for h in here]
    logout_by_link = client.get("/ui/logout", follow_redirects=False)
    # Assert: 403 without a cookie set or cleared; from here both work as before; a link cannot log out
    refused = logouts_elsewhere + logins_elsewhere
    assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert {r.json()["code"] for r in refused} == {"forbidden"} and not any("set-cookie" in r.headers for r in refused)
    assert all("cross-site request refused" in r.json()["detail"] for r in refused)
    assert [r.status_code for r in logouts_here] == [303] * 3 and all(r.headers["location"] == "/ui/login" for r in logouts_here)
    assert all('fedface_ui=""' in r.headers["set-cookie"] for r in logouts_here)
    assert [r.status_code for r in logins_here] == [303] * 3 and all("fedface_ui=" in r.headers["set-cookie"] for r in logins_here)
    assert logout_by_link.status_code == 405
