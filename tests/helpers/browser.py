"""Headless Chromium driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``:
no port, no websocket client, only the standard library), for the report page's browser test.

    with Browser() as b:
        b.open(Path("report.html"))            # waits for the load event
        b.errors                               # uncaught exceptions, console errors/warnings, failed loads
        b.eval("document.title")               # a JavaScript expression's value
        png = b.screenshot()                   # PNG bytes of the whole page
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


class Browser:
    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
        self.timeout, self.size = timeout, (width, height)
        self.events: list[dict] = []
        self._id, self._buf = 0, b""

    # --- the process and the pipe ---------------------------------------------------------------
    def __enter__(self) -> "Browser":
        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("no chromium on PATH")
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        child_in, self._to = os.pipe()  # we write commands, the browser reads them (its fd 3)
        self._from, child_out = os.pipe()  # the browser writes replies and events (its fd 4), we read

        def fds_3_and_4():  # the protocol's pipe: the browser reads fd 3, writes fd 4
            a, b = os.dup(child_in), os.dup(child_out)  # above 4, so that neither dup2 clobbers the other
            os.dup2(a, 3)
            os.dup2(b, 4)

        w, h = self.size
        self.proc = subprocess.Popen(
            [exe, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe", "--no-first-run",
             "--mute-audio", "--autoplay-policy=no-user-gesture-required", f"--window-size={w},{h}",
             f"--user-data-dir={self._profile.name}", "about:blank"],
            close_fds=False, preexec_fn=fds_3_and_4, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(child_in)
        os.close(child_out)
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable", session=True)
            self.send("Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": 1,
                                                             "mobile": False}, session=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - closing a browser that is already gone
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to)
        os.close(self._from)
        self._profile.cleanup()

    def _read(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError("no message from chromium")
            chunk = os.read(self._from, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: bool = False, timeout: float | None = None) -> dict:
        """Send one command and wait for its result; events that arrive meanwhile are kept."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(max(0.0, end - time.monotonic()))
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float | None = None) -> dict:
        end = time.monotonic() + (timeout or self.timeout)
        while True:
            for e in self.events:
                if e.get("method") == method and not e.get("_seen"):
                    e["_seen"] = True
                    return e
            self.events.append(self._read(max(0.0, end - time.monotonic())))

    # --- what a test asks ---------------------------------------------------------------------------
    def open(self, page: Path) -> None:
        self.send("Page.navigate", {"url": Path(page).resolve().as_uri()}, session=True)
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str, await_promise: bool = False):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": await_promise}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def settle(self, seconds: float) -> None:
        """Let the page run for ``seconds``, collecting its events."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.events.append(self._read(max(0.0, end - time.monotonic())))
            except TimeoutError:
                break

    @property
    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/warn/assert calls, and log entries at error or warning
        level (a resource that failed to load, a blocked request), as text."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry']['text']} {p['entry'].get('url', '')}")
        return out

    def screenshot(self) -> bytes:
        r = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=True)
        return base64.b64decode(r["data"])
