"""`sidecar_thread_cpu_seconds_total{thread}`: the process's CPU time by the
kind of thread that spent it.

`process_cpu_seconds_total` says how much of the broker's node the sidecar
takes; this says which part of it: the `event-loop` (HTTP, the cache index,
every send to a reader), the `origin` threads (block GETs: receiving,
hashing and writing each block), the `io` threads (the cache disk), the
`access-log` writer, and `other` (threads of libraries, under the process's
name). The kinds come from the names the sidecar gives its threads
(sidecar.telemetry.thread_names) less their numbers.

Read at each scrape from /proc/self/task/TID/comm and schedstat (proc(5);
the first schedstat field is the nanoseconds the thread ran, exact, where a
thread's utime and stime are scaled from sampled ticks). A thread that ends
keeps what it had used at the last scrape, so every series only grows. No
/proc (not Linux): no series.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

EVENT_LOOP = "event-loop"
OTHER = "other"
_NUMBERED = re.compile(r"[-_]?\d+$")


def thread_kind(comm: str, process_comm: str, is_main: bool) -> str:
    """The kind of a thread named `comm` in a process named `process_comm`:
    the first thread is the event loop; one the sidecar did not name still
    carries the process's name and is `other`; the rest are their names less
    their numbers (`origin-7` and `origin-12` are both `origin`)."""
    if is_main:
        return EVENT_LOOP
    if comm == process_comm:
        return OTHER
    return _NUMBERED.sub("", comm) or comm


def read_threads(tasks: Path, pid: int) -> dict[int, tuple[str, float]]:
    """Each thread under `tasks` (a process's /proc/PID/task) by thread id:
    its kind and the seconds it has run. Threads that end while this reads
    are left out; no such directory, no threads."""
    try:
        entries = list(tasks.iterdir())
        process_comm = (tasks / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return {}
    found: dict[int, tuple[str, float]] = {}
    for entry in entries:
        try:
            tid = int(entry.name)
            comm = (entry / "comm").read_text().rstrip("\n")
            ran_ns = int((entry / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        found[tid] = (thread_kind(comm, process_comm, tid == pid), ran_ns / 1e9)
    return found


class ThreadCpuCollector(Collector):
    def __init__(self, registry: CollectorRegistry | None = None,
                 tasks: Path = Path("/proc/self/task"), pid: int | None = None) -> None:
        self._tasks = tasks
        self._pid = os.getpid() if pid is None else pid
        self._live: dict[int, tuple[str, float]] = {}  # thread id: kind, seconds
        self._ended: dict[str, float] = {}  # kind: seconds of threads gone
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for kind, seconds in sorted(self.seconds_by_kind().items()):
            family.add_metric([kind], seconds)
        yield family

    def seconds_by_kind(self) -> dict[str, float]:
        """CPU seconds so far by kind of thread (each call reads /proc afresh)."""
        now = read_threads(self._tasks, self._pid)
        for tid, (kind, seconds) in self._live.items():
            if tid not in now or now[tid][0] != kind:  # gone (or its id reused)
                self._ended[kind] = self._ended.get(kind, 0.0) + seconds
        self._live = now
        totals = dict(self._ended)
        for kind, seconds in now.values():
            totals[kind] = totals.get(kind, 0.0) + seconds
        return totals

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "sidecar_thread_cpu_seconds",
            "CPU time of the sidecar's threads, by kind: event-loop, origin, io, access-log, "
            "other", labels=["thread"])
