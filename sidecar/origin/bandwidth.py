"""The bandwidth lanes' budget as the origin's readers take it: by the event
loop for bypass reads, by the fetch threads for block fetches, the one
limiter behind a lock."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

from sidecar.isolation.lanes import LaneLimiter
from sidecar.telemetry.metrics import Metrics

# The longest a bypass read sleeps before it asks the lanes again, and a
# fetch thread's wait goes uncounted in sidecar_ratelimit_wait_seconds_total.
MAX_SLICE_S = 0.25


class Bandwidth:
    def __init__(self, limiter: LaneLimiter, metrics: Metrics) -> None:
        self._limiter = limiter
        self._metrics = metrics
        # The lanes' budget is taken by the loop and by the fetch threads alike.
        self._lock = threading.Lock()
        # Set at the stop: a fetch thread waiting for its budget returns at once.
        self._closed = threading.Event()
        # Set (and renewed) at a reload and at the stop: a fetch thread waiting
        # for its budget asks the lanes again. Its wait was worked out from the
        # old rate; at a low one that is minutes, which a reload raising or
        # lifting the limit must not leave it to sleep through.
        self._wake = threading.Event()

    def replace(self, limiter: LaneLimiter) -> None:
        """New lanes: every read from now on takes its budget from them, and
        they begin with the tokens (or the debt) the old ones had."""
        with self._lock:
            limiter.continue_from(self._limiter)
            self._limiter = limiter
            woken, self._wake = self._wake, threading.Event()
        woken.set()

    def pacer(self, lane: str) -> Callable[[int], None]:
        """The lane's bandwidth budget, taken chunk by chunk in the fetch thread.

        The lanes are looked up at every chunk, not once per fetch: a reload
        that adds, changes or lifts a limit reaches the fetches already under
        way at their next chunk (a block fetch of a coalesced run may read
        for minutes), and a fetch begun unlimited does not stay so."""
        waits = self._metrics.ratelimit_wait.labels(lane)

        def pace(amount: int) -> None:
            taken = False
            while True:
                with self._lock:
                    limiter = self._limiter
                    wake = self._wake
                    if not limiter.limited:
                        return
                    taken, wait = _ask(limiter, lane, amount, taken)
                if wait > 0:
                    # A wait for a foreground debt at a low limit may be long:
                    # the stop does not wait for it, and a reload cuts it short
                    # (the wait is then asked for again at the new lanes).
                    woken = self._sleep(wake, wait, waits)
                    if self._closed.is_set():
                        raise ConnectionAbortedError("the origin reader is closed")
                    if woken or not taken:
                        continue
                if taken:
                    return

        return pace

    @staticmethod
    def _sleep(wake: threading.Event, wait: float, waits: Counter) -> bool:
        """Sleep `wait` seconds in a fetch thread, or until `wake` is set (a
        reload, the stop): True if woken. Counted a slice at a time as slept."""
        deadline = time.monotonic() + wait
        while True:
            started = time.monotonic()
            left = deadline - started
            if left <= 0:
                return False
            woken = wake.wait(min(left, MAX_SLICE_S))
            waits.inc(time.monotonic() - started)
            if woken:
                return True

    def close(self) -> None:
        """The stop: fetch threads waiting for their budget give up now."""
        self._closed.set()
        with self._lock:
            wake = self._wake
        wake.set()

    async def throttle(self, lane: str, amount: int) -> float:
        """Wait until the lane may read `amount` more bytes from the origin; the wait.

        Slept in slices of at most MAX_SLICE_S, asking the lanes again after
        each: a reload that raises or lifts the limit reaches a bypass read
        already waiting (at a low rate its wait is minutes), as it does a
        fetch thread's (the loop has no event a thread could set)."""
        waited = 0.0
        taken = False
        while True:
            with self._lock:
                taken, wait = _ask(self._limiter, lane, amount, taken)
            if wait <= 0 and taken:
                return waited
            self._metrics.ratelimit_wait.labels(lane).inc(min(wait, MAX_SLICE_S))
            await asyncio.sleep(min(wait, MAX_SLICE_S))
            waited += min(wait, MAX_SLICE_S)


def _ask(limiter: LaneLimiter, lane: str, amount: int, taken: bool) -> tuple[bool, float]:
    """Whether `amount` is granted, and the seconds to wait first. Granted
    already (foreground, in debt): only the rest of the debt is waited for, at
    the lanes now in force (a reload may have changed them)."""
    if taken:
        return True, limiter.foreground_wait()
    grant = limiter.take(lane, amount)
    return grant.taken, grant.wait
