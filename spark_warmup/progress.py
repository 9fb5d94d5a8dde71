"""Progress of a warm-up while Spark runs it, from the sidecars' own counters.

Each sidecar's warm calls run inside one Spark task, whose rows reach the
driver only when the task ends: for a long warm-up nothing would show until
the end. The driver instead reads every sidecar's /api/v1/stats now and then
(`warm_blocks`: blocks found cached, fetched or failed for warm calls) and
prints how much of the plan is done. Counters are read as differences from
the start (or, for a sidecar silent then, from its first answer), so a
sidecar's earlier warm-ups do not count; a sidecar that does not answer is
left out of that line, never fatal.

The stats are read as the warm calls are sent (`stats_reader`): with the admin
token, which the page needs on a sidecar whose admin port is off loopback (as
in a pod), following no redirect, and verifying TLS against the plan's CA file.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TextIO

from spark_warmup.sidecar_http import ANSWER_BYTES, http_answers, opener
from spark_warmup.units import format_bytes

ReadStats = Callable[[str], Mapping[str, Any]]
_OUTCOMES = ("already_cached", "fetched", "failed")


def read_stats(url: str) -> Mapping[str, Any]:
    """A loopback sidecar's stats, without a token."""
    return stats_reader(None)(url)


def stats_reader(token: str | None, ca_file: str | None = None) -> ReadStats:
    """Reads a sidecar's /api/v1/stats as `warming` sends its calls: the token in
    `Authorization`, no redirect followed (the token goes only to the plan's URL),
    TLS verified against `ca_file` (None: the system's CAs). Errors are OSError
    (a bad CA file too) or ValueError (not JSON, or too long)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    openers: list[urllib.request.OpenerDirector] = []  # made at the first read

    def read(url: str) -> Mapping[str, Any]:
        if not openers:
            openers.append(opener(ca_file))
        request = urllib.request.Request(f"{url.rstrip('/')}/api/v1/stats", headers=headers)
        with http_answers(), openers[0].open(request, timeout=5) as response:
            body = response.read(ANSWER_BYTES + 1)
        if len(body) > ANSWER_BYTES:
            raise ValueError(f"the stats of {url} are longer than {ANSWER_BYTES} bytes")
        stats: Mapping[str, Any] = json.loads(body)
        return stats
    return read


def warm_blocks(stats: Mapping[str, Any]) -> int:
    """Blocks the sidecar has dealt with for warm calls since it started."""
    counts = stats.get("warm_blocks", {})
    return sum(int(counts.get(outcome, 0)) for outcome in _OUTCOMES)


class WarmProgress:
    """`line()` says how much of the plan is done; as a context manager it
    prints one every `interval_s` on `out` from a thread of its own."""

    def __init__(self, sidecars: Mapping[str, str], planned_blocks: int, block_size: int,
                 out: TextIO, interval_s: float, read: ReadStats = read_stats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sidecars = dict(sidecars)
        self._planned = planned_blocks
        self._block_size = block_size
        self._out = out
        self._interval = interval_s
        self._read = read
        self._clock = clock
        self._started = clock()
        # Read only when lines will be printed: an unreachable sidecar costs a timeout.
        self._baseline: dict[str, int | None] = (
            {node: self._blocks(url) for node, url in self._sidecars.items()}
            if interval_s > 0 else {})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _blocks(self, url: str) -> int | None:
        try:
            return warm_blocks(self._read(url))
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def line(self) -> str:
        done, answering = 0, 0
        for node, url in self._sidecars.items():
            now, before = self._blocks(url), self._baseline.get(node)
            if now is None:
                continue
            answering += 1
            if before is None:
                # Silent at the start: its counters also hold the warm-ups before
                # this run, so this run's count starts at its first answer.
                self._baseline[node] = now
                continue
            done += max(0, now - before)
        done = min(done, self._planned)
        seconds = max(self._clock() - self._started, 1e-9)
        share = 100 * done // max(1, self._planned)
        silent = len(self._sidecars) - answering
        return (f"warm-up: {format_bytes(done * self._block_size)} of "
                f"{format_bytes(self._planned * self._block_size)} ({share}%), "
                f"{format_bytes(done * self._block_size / seconds)}/s"
                + (f"; {silent} of {len(self._sidecars)} sidecars not answering"
                   if silent else ""))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            print(self.line(), file=self._out, flush=True)

    def __enter__(self) -> WarmProgress:
        if self._interval > 0:
            self._thread = threading.Thread(target=self._run, name="warm-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
