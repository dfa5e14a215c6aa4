"""A small client of Chromium's DevTools protocol over --remote-debugging-pipe, for the browser tests: no websocket
library and no browser download (Debian's chromium, installed by `make chromium`).

Chromium reads commands from file descriptor 3 and writes replies and events to descriptor 4, each a JSON object
ended by a NUL byte. `Browser` starts headless Chromium with a new empty profile and those two pipes; `Page` is one
tab: navigate, evaluate JavaScript, send key and mouse events, take a screenshot, and the console errors, uncaught
exceptions and network requests it saw.

    python tests/cdp.py PAGE.html SHOT.png [WIDTH HEIGHT [SELECTOR]]   # a screenshot (docs/inspect.png), after
                                                                       # focusing the first SELECTOR match
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]
KEYS = {
    "Tab": 9,
    "Enter": 13,
    " ": 32,
    "End": 35,
    "Home": 36,
    "ArrowLeft": 37,
    "ArrowUp": 38,
    "ArrowRight": 39,
    "ArrowDown": 40,
}


def find_chromium() -> str | None:
    """Chromium's executable: $CHROMIUM, else chromium or chromium-browser on PATH; None when there is none."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """Headless Chromium driven through the pipe; use as a context manager (closes the browser, removes the profile)."""

    def __init__(self, executable: str, *, width: int = 1500, height: int = 1000, timeout: float = 60.0):
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self.log = open(Path(self.profile).with_suffix(".log"), "w+b")
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # a trampoline puts the pipes on descriptors 3 and 4, where Chromium looks for them, then becomes Chromium
        # (a POSIX shell's redirections take single-digit descriptors only)
        hop = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        cmd = [
            sys.executable,
            "-c",
            hop,
            str(to_chrome_r),
            str(from_chrome_w),
            executable,
            *FLAGS,
            f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            cmd, pass_fds=(to_chrome_r, from_chrome_w), stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.writer = os.fdopen(to_chrome_w, "wb")
        self.reader = from_chrome_r
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (CDPError, OSError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self.writer,):
            try:
                f.close()
            except OSError:
                pass
        os.close(self.reader)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
        Path(self.log.name).unlink(missing_ok=True)

    def stderr_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_bytes()[-3000:].decode(errors="replace")

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            left = deadline - time.time()
            ready, _, _ = select.select([self.reader], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("Chromium did not answer in time; its log ends:\n" + self.stderr_tail())
            chunk = os.read(self.reader, 1 << 20)
            if not chunk:
                raise CDPError("Chromium closed the DevTools pipe; its log ends:\n" + self.stderr_tail())
            self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, session: str | None = None, timeout: float | None = None, **params) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept in self.events."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.writer.write(json.dumps(message).encode() + b"\0")
        self.writer.flush()
        deadline = time.time() + (timeout or self.timeout)
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect the events that arrive within `seconds`."""
        deadline = time.time() + seconds
        while True:
            try:
                self.events.append(self._message(deadline))
            except TimeoutError:
                return

    def open(self, url: str) -> Page:
        """A new tab with the page loaded (its load event fired)."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.call("Page.navigate", url=url)
        page.wait_event("Page.loadEventFired")
        return page


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def call(self, method: str, **params) -> dict:
        return self.browser.call(method, self.session, **params)

    def events(self, method: str | None = None) -> list[dict]:
        return [
            e
            for e in self.browser.events
            if e.get("sessionId") == self.session and (method is None or e.get("method") == method)
        ]

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.time() + timeout
        while True:
            seen = self.events(method)
            if seen:
                return seen[-1]
            self.browser.events.append(self.browser._message(deadline))

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the page (a thrown exception raises CDPError)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"{expression!r} stayed false for {timeout} s")

    def key(self, key: str) -> None:
        """Press and release a key, as a keyboard does (focus moves, selects change, key handlers run)."""
        code = KEYS[key]
        base = {
            "key": key,
            "code": "Space" if key == " " else key,
            "windowsVirtualKeyCode": code,
            "nativeVirtualKeyCode": code,
        }
        text = {"text": "\r" if key == "Enter" else key} if key in ("Enter", " ") else {}
        self.call("Input.dispatchKeyEvent", type="keyDown" if text else "rawKeyDown", **base, **text)
        self.call("Input.dispatchKeyEvent", type="keyUp", **base)

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def screenshot(self, path: Path | str) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self) -> list[str]:
        """Console errors and assertions, uncaught exceptions and error log entries (a blocked request among them)."""
        out = []
        for e in self.events("Runtime.consoleAPICalled"):
            if e["params"]["type"] in ("error", "assert"):
                out.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in e["params"]["args"])
                )
        for e in self.events("Runtime.exceptionThrown"):
            out.append("exception: " + json.dumps(e["params"]["exceptionDetails"])[:500])
        for e in self.events("Log.entryAdded"):
            if e["params"]["entry"]["level"] == "error":
                out.append("log: " + e["params"]["entry"]["text"])
        return out

    def requests(self) -> list[str]:
        """The URL of every request the page made."""
        return [e["params"]["request"]["url"] for e in self.events("Network.requestWillBeSent")]


if __name__ == "__main__":
    if len(sys.argv) not in (3, 5, 6):
        raise SystemExit("usage: python tests/cdp.py PAGE.html SHOT.png [WIDTH HEIGHT [SELECTOR]]")
    exe = find_chromium()
    if exe is None:
        raise SystemExit("no chromium on PATH: `make chromium` installs Debian's")
    size = dict(width=int(sys.argv[3]), height=int(sys.argv[4])) if len(sys.argv) >= 5 else {}
    with Browser(exe, **size) as browser:
        page = browser.open(Path(sys.argv[1]).resolve().as_uri())
        page.wait_for("!document.getElementById('samples-data') || document.body.dataset.ready === '1'")  # inspector
        if len(sys.argv) == 6:
            page.evaluate(f"document.querySelector({json.dumps(sys.argv[5])}).focus({{preventScroll: true}})")
        print(page.screenshot(sys.argv[2]), page.errors() or "no console errors")
