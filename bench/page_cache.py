"""The machine's page cache during a replay, from /proc/meminfo (proc(5)):
``Cached`` (file pages, shared memory included) and ``Shmem`` (of it, shared
memory: the memory tier's memfd counts there), sampled every 0.1 s in a thread
so that the peak is seen, not only the end.

The sidecar writes and reads its slab past the page cache (direct I/O), so a
replay should grow the page cache by no more than its memory tier plus a small
constant (its logs). The origin's files are read into the page cache before
the first replay (``load_files``), so the origin's own reads do not show.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

INTERVAL_S = 0.1
READ_BYTES = 8 * 1024 * 1024


def meminfo() -> dict[str, int]:
    """``Cached`` and ``Shmem`` in bytes."""
    found: dict[str, int] = {}
    with open("/proc/meminfo") as table:
        for line in table:
            name, _, rest = line.partition(":")
            if name in ("Cached", "Shmem"):
                found[name] = int(rest.split()[0]) * 1024
    return found


def load_files(paths: Iterable[Path]) -> int:
    """Read each file once, so its pages are in the page cache before a replay
    is watched; the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            while chunk := file.read(READ_BYTES):
                total += len(chunk)
    return total


class PageCacheWatch:
    """``with PageCacheWatch() as watch: ...``; then ``watch.figures()``."""

    def __init__(self) -> None:
        self._before: dict[str, int] = {}  # read at __enter__
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="page-cache-watch",
                                        daemon=True)

    def __enter__(self) -> PageCacheWatch:
        self._before = meminfo()
        self._peak = dict(self._before)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._note(meminfo())

    def _sample(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._note(meminfo())

    def _note(self, now: dict[str, int]) -> None:
        for name, value in now.items():
            self._peak[name] = max(self._peak.get(name, 0), value)

    def figures(self) -> dict[str, int]:
        """The peak growth of each over the watch, in bytes (so far, while it runs)."""
        self._note(meminfo())
        return {"cached_peak_growth_bytes": self._peak["Cached"] - self._before["Cached"],
                "shmem_peak_growth_bytes": self._peak["Shmem"] - self._before["Shmem"]}
