"""When failed reads of the cache disk mean the disk is failing: pure, clock handed in.

One read the disk fails costs only that block: it is dropped and fetched again.
A disk that keeps failing reads costs every reader a wasted read and a
refetch, so past a limit within ``window_s`` the disk counts as failed and the
sidecar bypasses the cache (as it does when a write fails) until the disk
watcher sees it well again. Two kinds of failed read count apart:

- errors (EIO and the like, as a failing device gives): ``error_limit``;
- bytes that come back but do not match their checksums (a lost extent reads
  as zeros, a cut file reads short): ``mismatch_limit``, higher, because a
  crash tears the few blocks being written and rot spoils single chunks, and
  dropping those one by one is enough.
"""

from __future__ import annotations

from collections import deque


class _Window:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.times: deque[float] = deque(maxlen=limit)

    def full(self, now: float, window_s: float) -> bool:
        return len(self.times) == self.limit and now - self.times[0] <= window_s


class ReadFaults:
    def __init__(self, error_limit: int = 3, mismatch_limit: int = 16,
                 window_s: float = 60.0) -> None:
        self._errors = _Window(error_limit)
        self._mismatches = _Window(mismatch_limit)
        self._window = window_s
        self._last_error = ""

    def error(self, now: float, error: OSError) -> None:
        """A read the disk failed at ``now``."""
        self._errors.times.append(now)
        self._last_error = str(error.strerror or error)

    def mismatch(self, now: float) -> None:
        """A read whose bytes did not match their checksums at ``now``."""
        self._mismatches.times.append(now)

    def problem(self, now: float) -> str | None:
        """Why the disk counts as failing, or None while it does not."""
        if self._errors.full(now, self._window):
            return (f"{self._errors.limit} reads failed within {self._window:g}s "
                    f"({self._last_error})")
        if self._mismatches.full(now, self._window):
            return (f"{self._mismatches.limit} reads within {self._window:g}s did not "
                    "match their checksums")
        return None

    def clear(self) -> None:
        """The disk is well again: earlier failures no longer count."""
        self._errors.times.clear()
        self._mismatches.times.clear()
