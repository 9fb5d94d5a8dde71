"""`sidecar serve` as a child process of a tool, on loopback.

The broker demo runs the sidecar this way rather than in its own interpreter:
its producer and consumers decode and check every record in Python, and in one
process they would take the interpreter lock from the sidecar's event loop, so
the MB/s it prints would measure their contention. As a process of its own the
sidecar runs as it does on a broker node. Its log goes to a file; `stop`
(SIGTERM, which `serve` answers with a clean stop) always ends it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class ServeError(RuntimeError):
    """The sidecar exited or did not say it was ready in time."""


class ServeProcess:
    """`with ServeProcess(flags, env, log_path) as sidecar:` serving; `data_url`,
    `admin_url` and `pid` once entered."""

    def __init__(self, flags: Mapping[str, str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = [sys.executable, "-m", "sidecar", "serve",
                     *(part for name, value in flags.items() for part in (name, value))]
        # Only the settings given here: a SIDECAR_* variable of the caller's shell
        # (SIDECAR_CONFIG, say) would make this sidecar another one than described.
        self.env = {**{name: value for name, value in os.environ.items()
                       if not name.startswith("SIDECAR_")}, **env}
        self.log_path = log_path
        self.data_url = ""
        self.admin_url = ""
        self._process: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def __enter__(self) -> ServeProcess:
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                text=True, env=self.env)
        try:
            ready = json.loads(self._ready_line())
            self.data_url, self.admin_url = ready["data"], ready["admin"]
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _ready_line(self) -> str:
        process = self._process
        assert process is not None and process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([process.stdout], [], [], min(left, 0.5))
            if readable:
                # `serve` writes its ready line whole, with a flush, and nothing else.
                line = process.stdout.readline()
                if line:
                    return line
            if process.poll() is not None:
                raise ServeError(f"the sidecar exited with {process.returncode}: "
                                 f"{self._last_words()}")
        raise ServeError(f"the sidecar was not ready after {START_TIMEOUT_S:g}s: "
                         f"{self._last_words()}")

    def _last_words(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(no log)"

    def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
