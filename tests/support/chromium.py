"""Headless Debian Chromium driven over the DevTools protocol (aiohttp's websocket
client, no driver library): the tests load /ui and the capacity report in it and
read back what it shows. scripts/ensure-chromium.sh installs it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from tests.support.waiting import eventually

# Chromium and a page work on their own schedules: generous waits, unhurried polls.
WAIT_S = 30.0
POLL_S = 0.2


class Chromium:
    """Headless Debian Chromium with the DevTools protocol on a loopback port."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Chromium:
        self.profile.mkdir()
        # Chromium puts its single-instance socket in a directory of TMPDIR,
        # which it removes only on a clean exit: in a directory of our own,
        # removed at stop, one stopped by a signal leaves nothing in /tmp. Not
        # under the test's directory: a socket's path takes 107 bytes at most.
        self._scratch = Path(tempfile.mkdtemp(prefix="chromium-"))
        self._log = open(self.profile.parent / "chromium.log", "wb")
        self._process = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={self.profile}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             "--window-size=1280,900", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TMPDIR": str(self._scratch)},
        )
        active = self.profile / "DevToolsActivePort"

        def listening() -> int | None:
            assert self._process is not None
            if self._process.poll() is not None:
                raise AssertionError("chromium exited:\n"
                                     + (self.profile.parent / "chromium.log").read_text())
            lines = active.read_text().split() if active.exists() else []
            return int(lines[0]) if lines else None

        try:
            self.port = eventually(listening, "chromium's DevTools port", WAIT_S, POLL_S)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            # Its own session: the group holds chromium's zygote and renderers too.
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._log.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    @contextlib.asynccontextmanager
    async def page(self) -> AsyncIterator[Page]:
        """The browser's tab over its DevTools websocket, page and script events on."""
        async with aiohttp.ClientSession() as http_session:
            async with http_session.get(f"http://127.0.0.1:{self.port}/json/list") as answer:
                tabs = await answer.json()
            tab = next(t for t in tabs if t["type"] == "page")
            async with http_session.ws_connect(tab["webSocketDebuggerUrl"],
                                               max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Runtime.enable")
                yield page


class Page:
    """One tab, driven by DevTools protocol commands over aiohttp's websocket client."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = 0
        self._events: list[dict[str, Any]] = []  # arrived while waiting for an answer

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._ids += 1
        await self._ws.send_json({"id": self._ids, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self._ws.receive_json(), 30)
            if message.get("id") == self._ids:
                assert "error" not in message, (method, message["error"])
                result: dict[str, Any] = message["result"]
                return result
            if "method" in message:
                self._events.append(message)

    async def event(self, method: str) -> dict[str, Any]:
        """The next `method` event (one that came in meanwhile counts)."""
        while True:
            for i, message in enumerate(self._events):
                if message["method"] == method:
                    del self._events[i]
                    return message
            message = await asyncio.wait_for(self._ws.receive_json(), WAIT_S)
            if "method" in message:
                self._events.append(message)

    async def load(self, url: str) -> None:
        """Navigate and return once the load event fired: the page's inline
        script has run and nothing was awaited after it."""
        self._events = [e for e in self._events if e["method"] == "Runtime.exceptionThrown"]
        await self.call("Page.navigate", url=url)
        await self.event("Page.loadEventFired")

    def exceptions(self) -> list[str]:
        """Uncaught exceptions of the page's scripts so far (with Runtime enabled)."""
        return [str(event["params"]["exceptionDetails"]) for event in self._events
                if event["method"] == "Runtime.exceptionThrown"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        """The whole page as PNG, below the window's height too."""
        height = (await self.call("Page.getLayoutMetrics"))["cssContentSize"]["height"]
        # The window's width: beyond the viewport there is no scroll bar to leave out.
        width = await self.evaluate("window.innerWidth")
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                               clip={"x": 0, "y": 0, "width": width, "height": height,
                                     "scale": 1})
        return base64.b64decode(shot["data"])
