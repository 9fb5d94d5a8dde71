"""The sidecar process across the soak's kills and restarts, watched every
second (its cache disk is tests.support.loop_disk)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support.processes import SidecarProcess

MiB = 1024 * 1024
RESTART_ATTEMPTS = 3


@dataclass
class Sample:
    at_s: float
    rss: int
    fds: int


@dataclass
class Supervisor:
    """The sidecar process across restarts on the same cache dir. `kill_and_restart`
    is the soak's kill -9; any other exit that `check` finds is unexpected: it is
    recorded (exit code, the last stderr lines) and the sidecar restarted."""

    origin: str
    cache_dir: Path
    flags: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    restarts: int = 0
    unexpected_exits: list[dict[str, object]] = field(default_factory=list)
    _process: SidecarProcess | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: bool = False

    # The last sidecar's ports: while it is restarted, clients get refused there,
    # as a broker's reader would.
    data_url: str = ""
    admin_url: str = ""
    admin_token: str = ""

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.alive() else None

    def start(self) -> None:
        with self._lock:
            self._start()

    def kill_and_restart(self) -> None:
        with self._lock:
            if self._process is not None:
                os.kill(self._process.pid, signal.SIGKILL)
                self._retire()
            self._start()
            self.restarts += 1

    def check(self, at_s: float) -> None:
        with self._lock:
            if self._stopping or self._process is None or self._process.alive():
                return
            lines = self._process.stderr_lines[-20:]
            code = self._retire()
            self.unexpected_exits.append({"at_s": round(at_s, 1), "exit_code": code,
                                          "stderr_tail": lines})
            self._start()

    def stop(self, at_s: float) -> int | None:
        """Stop for good (SIGTERM); an exit other than 0 is an unexpected one."""
        with self._lock:
            self._stopping = True
            if self._process is None:
                return None
            lines = self._process.stderr_lines[-20:]
            code = self._retire()
            if code != 0:
                self.unexpected_exits.append({"at_s": round(at_s, 1), "exit_code": code,
                                              "stderr_tail": lines, "at": "final stop"})
            return code

    def _start(self) -> None:
        for _ in range(RESTART_ATTEMPTS):
            process = SidecarProcess(self.origin, self.cache_dir, *self.flags, env=self.env)
            try:
                self._process = process.__enter__()
                self.data_url, self.admin_url = process.data_url, process.admin_url
                self.admin_token = process.admin_token
                return
            except RuntimeError as exc:  # it never said it was ready
                self.unexpected_exits.append({"exit_code": process.stop(), "at": "start",
                                              "stderr_tail": str(exc).splitlines()[-20:]})
        raise RuntimeError(f"the sidecar did not start {RESTART_ATTEMPTS} times in a row: "
                           f"{self.unexpected_exits[-1]}")

    def _retire(self) -> int | None:
        assert self._process is not None
        process, self._process = self._process, None
        code = process.stop()
        with self.log_path.open("a") as log:
            log.write(f"--- sidecar pid {process.pid}, exit {code}\n")
            log.writelines(process.stderr_lines)
        return code


def watch(supervisor: Supervisor, started: float, stop: threading.Event,
          samples: list[Sample], limit_s: float) -> None:
    """Every second: an unexpected exit noticed (and the sidecar restarted), the
    sidecar's RSS and open fds sampled."""
    while not stop.wait(1.0) and time.monotonic() - started < limit_s:
        at = time.monotonic() - started
        supervisor.check(at)
        pid = supervisor.pid
        if pid is None:
            continue
        try:
            process = psutil.Process(pid)
            samples.append(Sample(at, process.memory_info().rss, process.num_fds()))
        except psutil.Error:  # killed between the two calls
            continue
