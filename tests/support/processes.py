"""The sidecar as a real child process, for functional tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType

from prometheus_client.parser import text_string_to_metric_families

from sidecar.tools.local_s3 import CREDENTIALS
from tests.support.waiting import eventually

START_TIMEOUT_S = 30.0
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held back while a child is started, then
    handled as they would have been. Python runs a signal's handler as soon as
    `fork_exec` returns, before Popen keeps the child's pid: an interrupt
    raised there (a benchmark turns SIGTERM into KeyboardInterrupt,
    bench/stopping.py) leaves a child running that nothing can stop. Only the
    main thread has signal handlers to swap; elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in _INTERRUPTS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for number in dict.fromkeys(held):
            handler = previous[signal.Signals(number)]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), number)


class SidecarProcess:
    """`python -m sidecar serve` on port 0; `data_url` and `admin_url` once started."""

    def __init__(
        self, origin: str, cache_dir: Path, *extra: str, env: dict[str, str] | None = None,
        program: tuple[str, ...] = (sys.executable, "-m", "sidecar"),
        listen: str = "127.0.0.1:0",
    ) -> None:
        self.args = [
            *program, "serve",
            "--listen", listen, "--admin-listen", "127.0.0.1:0",
            "--origin-endpoint", origin, "--cache-dir", str(cache_dir), *extra,
        ]
        self.data_url = ""
        self.admin_url = ""
        self.metrics_url = ""
        self.admin_token_file = ""
        self.stderr_lines: list[str] = []
        self.env = env or {}
        self._process: subprocess.Popen[str] | None = None
        self._pumps: list[threading.Thread] = []
        self._ready_lines: queue.Queue[str] = queue.Queue()
        self._terminated = False

    def __enter__(self) -> SidecarProcess:
        try:
            # Launched inside: an interrupt while its output pumps start would
            # leave it running too.
            self.launch()
            return self.await_ready()
        except BaseException:  # an interrupt while it starts: no `with` stops it then
            self.stop()
            raise

    def launch(self) -> SidecarProcess:
        """The process started; ``await_ready`` waits for its ready line. Apart,
        so that several sidecars start side by side (``start_together``)."""
        # Tests read with plain HTTP as often as with an SDK: anonymous reads
        # are opted into here (writes still need a signature, which the SDK
        # clients make with the same credentials as the sidecar's origin ones).
        # The tests of the secure default set it back to false.
        env = {**os.environ, **CREDENTIALS, "SIDECAR_LOG_LEVEL": "WARNING",
               "SIDECAR_AUTH_ALLOW_ANONYMOUS": "true", **self.env}
        with interrupts_held():
            self._process = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
        assert self._process.stdout is not None and self._process.stderr is not None
        self._pumps = [
            threading.Thread(target=_pump, args=(self._process.stdout, self._ready_lines.put),
                             daemon=True),
            threading.Thread(
                target=_pump, args=(self._process.stderr, self.stderr_lines.append), daemon=True
            ),
        ]
        for pump in self._pumps:
            pump.start()
        return self

    def await_ready(self) -> SidecarProcess:
        try:
            ready = json.loads(self._ready_lines.get(timeout=START_TIMEOUT_S))
        except queue.Empty:
            self.stop()
            raise RuntimeError(f"sidecar did not start: {''.join(self.stderr_lines)}") from None
        self.data_url, self.admin_url = ready["data"], ready["admin"]
        self.metrics_url = ready.get("metrics") or ""
        self.admin_token_file = ready.get("admin_token_file") or ""
        return self

    @property
    def admin_token(self) -> str:
        """The token guarding the mutating admin calls: the one the sidecar
        generated (or found) in its token file, else the one it was given."""
        if self.admin_token_file:
            return Path(self.admin_token_file).read_text(encoding="ascii").strip()
        given = self.env.get("SIDECAR_ADMIN_TOKEN")
        if given is None and "--admin-token" in self.args:
            given = self.args[self.args.index("--admin-token") + 1]
        assert given is not None, "the sidecar was given no token and named no token file"
        return given

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would end it."""
        assert self._process is not None
        self._process.kill()
        self.stop()

    def terminate(self) -> None:
        """SIGTERM, not waited for: ``stop`` waits (``stop_together``)."""
        if self._process is not None and self._process.poll() is None and not self._terminated:
            self._process.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self) -> int | None:
        if self._process is None:
            return None
        if self._process.poll() is None:
            self.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for pump in self._pumps:
            if pump.ident is not None:  # started (an interrupt may come between)
                pump.join(timeout=10)
        for stream in (self._process.stdout, self._process.stderr):
            if stream is not None:
                stream.close()
        return self._process.returncode

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        with urllib.request.urlopen(self.admin_url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                        sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until no range is being served and no fetch, read-ahead or disk work is
        under way (the stats' engine section): what the sidecar will ever fetch
        for the requests so far has been fetched."""
        eventually(lambda: self.stats()["engine"]["idle"],  # type: ignore[index]
                   "the sidecar to be idle", timeout)

    def stats(self) -> dict[str, object]:
        with urllib.request.urlopen(self.admin_url + "/api/v1/stats", timeout=10) as response:
            result: dict[str, object] = json.load(response)
            return result


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """A process a test started in a session of its own, and whatever of its
    group outlived it, killed (nothing happens to what already ended)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_together(processes: Iterable[SidecarProcess]) -> list[SidecarProcess]:
    """Sidecars whose starts overlap: all launched, then each awaited. On a
    failure those already launched are stopped."""
    launched: list[SidecarProcess] = []
    try:
        for process in processes:
            launched.append(process.launch())
        for process in launched:
            process.await_ready()
    except BaseException:
        stop_together(launched)
        raise
    return launched


def stop_together(processes: Iterable[SidecarProcess]) -> None:
    """SIGTERM to all, then each awaited: their drains overlap."""
    processes = list(processes)
    for process in processes:
        process.terminate()
    for process in processes:
        process.stop()


def _pump(stream: object, sink: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink(line)  # type: ignore[operator]
