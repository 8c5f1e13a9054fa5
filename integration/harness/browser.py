"""Open a page in headless Chromium (Debian's `chromium`) and read it over the DevTools protocol.

`open_page(path)` starts a fresh Chromium (its own ``--user-data-dir``, and the flags this
machine's closed network needs: no background networking, component updates, sync or
first-run work, which otherwise stall it), loads the file, and returns a `Page`:

* ``errors``: everything the page logged as an error (console.error, uncaught exceptions,
  Log entries such as a failed load), as text;
* ``requests``: the URL of every request the page made (a self-contained page makes only
  its own ``file://`` request, and ``data:`` ones);
* ``evaluate(js)``: a JavaScript expression's value (JSON-able), from the rendered page;
* ``screenshot(path)``: the whole page as PNG.

The protocol is spoken over its websocket with ``websocket-client`` (the test extras):
``Runtime``/``Log``/``Network``/``Page`` enabled before the page loads, so nothing it logs
is missed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--mute-audio")
WIDTH = 1400


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._id = 0
        self.errors: list[str] = []
        self.requests: list[str] = []
        self._loaded = False

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        mine = self._id
        self._ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = self._next(deadline, method)
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def _next(self, deadline: float, what: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"chromium: no answer to {what}")
        self._ws.settimeout(left)
        msg = json.loads(self._ws.recv())
        self._event(msg)
        return msg

    def _event(self, msg: dict[str, Any]) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description")))
                                                                      for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            self.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            self.requests.append(p["request"]["url"])
        elif method == "Page.loadEventFired":
            self._loaded = True

    def load(self, url: str, timeout: float = 60.0) -> None:
        self._loaded = False
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not self._loaded:
            self._next(deadline, "the page's load event")
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # drawn

    def evaluate(self, expression: str) -> Any:
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in got:
            raise RuntimeError(f"evaluate {expression[:80]!r}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        height = min(int(size["height"]) + 1, 16_000)
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height, deviceScaleFactor=1, mobile=False)
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextmanager
def open_page(path: Path, timeout: float = 60.0) -> Iterator[Page]:
    import websocket  # websocket-client, in the test extras

    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    # Chromium's helpers (renderer, utility, crashpad) can still write into the profile for a
    # moment after the browser itself exits: the whole process group goes (_end), and a file
    # written after that leaves the temporary profile behind rather than failing the test
    # (once in a CI run: "Directory not empty: 'Default'" at the profile's removal).
    with tempfile.TemporaryDirectory(prefix="asyncrsp-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                 f"--window-size={WIDTH},900", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port = _devtools_port(Path(profile), proc, timeout)
            ws = websocket.create_connection(_page_socket(port, timeout), timeout=timeout, suppress_origin=True)
            try:
                page = Page(ws)
                for domain in ("Runtime", "Log", "Network", "Page"):
                    page.call(f"{domain}.enable")
                page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=900, deviceScaleFactor=1,
                          mobile=False)
                page.load(path.resolve().as_uri(), timeout)
                yield page
            finally:
                ws.close()
        finally:
            _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The browser and every process of its group gone (SIGTERM, then SIGKILL after 10 s)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    return  # the group is empty
            time.sleep(0.05)
    proc.wait()


def _devtools_port(profile: Path, proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Chromium writes the port it listens on into DevToolsActivePort in its profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while True:
        if marker.exists():
            first = marker.read_text().splitlines()[:1]
            if first and first[0].isdigit():
                return int(first[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited ({proc.returncode}) before it listened")
        if time.monotonic() > deadline:
            raise TimeoutError("chromium did not open its DevTools port")
        time.sleep(0.05)


def _page_socket(port: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:  # noqa: S310
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        if pages:
            return str(pages[0]["webSocketDebuggerUrl"])
        if time.monotonic() > deadline:
            raise TimeoutError("chromium has no page")
        time.sleep(0.05)
