"""Debian's Chromium, headless, driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
no driver binary and no websocket library, only the browser a user would run.

Every host but 127.0.0.1 resolves to nothing (--host-resolver-rules), so a page that needs the
internet cannot render; each page also records every URL it requested, for the tests to check.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OFFLINE_RULES = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def _high_fd(fd: int) -> int:
    # Above 4, so bash's `3<&N 4>&M` cannot clobber one pipe end with the other (dash takes only 0-9).
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Page:
    def __init__(self, browser: Browser, session_id: str) -> None:
        self.browser, self.session_id = browser, session_id

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.send(method, params, self.session_id)

    def _blocked(self) -> set[str]:
        return {
            e["params"]["requestId"]
            for e in self.browser.events_of("Network.loadingFailed", self.session_id)
            if e["params"].get("blockedReason")
        }

    def requested_urls(self) -> list[str]:
        """What the page sent out: requests the browser blocked itself (its Content-Security-Policy) never left it."""
        blocked = self._blocked()
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events_of("Network.requestWillBeSent", self.session_id)
            if e["params"]["requestId"] not in blocked
        ]

    def blocked_urls(self) -> list[str]:
        blocked = self._blocked()
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events_of("Network.requestWillBeSent", self.session_id)
            if e["params"]["requestId"] in blocked
        ]

    def failed_requests(self) -> list[dict[str, Any]]:
        """Requests that went out and failed (not those the browser's policy blocked)."""
        return [
            e["params"]
            for e in self.browser.events_of("Network.loadingFailed", self.session_id)
            if not e["params"].get("blockedReason")
        ]

    def goto(self, url: str, timeout: float = 60) -> None:
        loaded = len(self.browser.events_of("Page.loadEventFired", self.session_id))
        self.send("Page.navigate", url=url)
        self.browser.wait_event("Page.loadEventFired", self.session_id, after=loaded, timeout=timeout)

    def evaluate(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression!r} failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"{expression!r} still false after {timeout} s; page text: {self.text()[:1500]!r}")

    def submit_form(self, selector: str, values: dict[str, str], timeout: float = 60) -> None:
        """Fill the form's named fields, submit it as a user would, and wait for the next page."""
        loaded = len(self.browser.events_of("Page.loadEventFired", self.session_id))
        fill = "".join(f"form.elements[{json.dumps(k)}].value = {json.dumps(v)};" for k, v in values.items())
        self.evaluate(
            f"(() => {{ const form = document.querySelector({json.dumps(selector)}); {fill} form.requestSubmit(); }})()"
        )
        self.browser.wait_event("Page.loadEventFired", self.session_id, after=loaded, timeout=timeout)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path, width: int = 1280, max_height: int = 2400, colours: int = 64) -> Path:
        """A PNG of the whole page (up to ``max_height``), reduced to a palette so it stays small."""
        height = min(max_height, int(self.evaluate("document.documentElement.scrollHeight")))
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        from PIL import Image

        image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colours)
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, optimize=True)
        return path


class Browser:
    """One headless Chromium process; use as a context manager."""

    def __init__(self, profile_dir: Path, width: int = 1280, height: int = 900) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed (Debian: apt-get install chromium)")
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        commands_read, replies_write = _high_fd(commands_read), _high_fd(replies_write)
        args = [
            CHROMIUM,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile_dir}",
            f"--window-size={width},{height}",
            f"--host-resolver-rules={OFFLINE_RULES}",
            "--hide-scrollbars",
            "about:blank",
        ]
        self.log = profile_dir.parent / "chromium.log"
        with self.log.open("ab") as log:
            # The DevTools pipe is file descriptors 3 (commands in) and 4 (replies out) of the browser.
            self.process = subprocess.Popen(
                ["bash", "-c", f'exec "$@" 3<&{commands_read} 4>&{replies_write}', "bash", *args],
                pass_fds=(commands_read, replies_write),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        os.close(commands_read)
        os.close(replies_write)
        self._out, self._in = commands_write, replies_read
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _read_message(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError(f"no message from chromium in {timeout} s; log: {self.log.read_text()[-1500:]}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its DevTools pipe; log: {self.log.read_text()[-1500:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(
        self, method: str, params: dict[str, Any] | None = None, session_id: str | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session_id:
            message["sessionId"] = session_id
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def events_of(self, method: str, session_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("method") == method and e.get("sessionId") == session_id]

    def wait_event(self, method: str, session_id: str, after: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events_of(method, session_id)) <= after:
            self.events.append(self._read_message(max(0.01, deadline - time.monotonic())))

    def new_page(self) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session_id = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session_id)
        for domain in ("Page", "Network", "Runtime"):
            page.send(f"{domain}.enable")
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        os.close(self._out)
        os.close(self._in)
