"""The bandwidth lanes' budget as the origin's readers take it: by the event
loop for bypass reads, by the fetch threads for block fetches, the one
limiter behind a lock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from sidecar.isolation.lanes import LaneLimiter
from sidecar.telemetry.metrics import Metrics


class Bandwidth:
    def __init__(self, limiter: LaneLimiter, metrics: Metrics) -> None:
        self._limiter = limiter
        self._metrics = metrics
        # The lanes' budget is taken by the loop and by the fetch threads alike.
        self._lock = threading.Lock()
        # Set at the stop: a fetch thread waiting for its budget returns at once.
        self._closed = threading.Event()

    def replace(self, limiter: LaneLimiter) -> None:
        """New lanes: every read from now on takes its budget from them, and
        they begin with the tokens (or the debt) the old ones had."""
        with self._lock:
            limiter.continue_from(self._limiter)
            self._limiter = limiter

    def pacer(self, lane: str) -> Callable[[int], None]:
        """The lane's bandwidth budget, taken chunk by chunk in the fetch thread.

        The lanes are looked up at every chunk, not once per fetch: a reload
        that adds, changes or lifts a limit reaches the fetches already under
        way at their next chunk (a block fetch of a coalesced run may read
        for minutes), and a fetch begun unlimited does not stay so."""
        waits = self._metrics.ratelimit_wait.labels(lane)

        def pace(amount: int) -> None:
            while True:
                with self._lock:
                    limiter = self._limiter
                    if not limiter.limited:
                        return
                    grant = limiter.take(lane, amount)
                if grant.wait > 0:
                    waits.inc(grant.wait)
                    # A wait for a foreground debt at a low limit may be long:
                    # the stop does not wait for it.
                    if self._closed.wait(grant.wait):
                        raise ConnectionAbortedError("the origin reader is closed")
                if grant.taken:
                    return

        return pace

    def close(self) -> None:
        """The stop: fetch threads waiting for their budget give up now."""
        self._closed.set()

    async def throttle(self, lane: str, amount: int) -> float:
        """Wait until the lane may read `amount` more bytes from the origin; the wait."""
        waited = 0.0
        while True:
            with self._lock:
                grant = self._limiter.take(lane, amount)
            if grant.wait > 0:
                self._metrics.ratelimit_wait.labels(lane).inc(grant.wait)
                await asyncio.sleep(grant.wait)
                waited += grant.wait
            if grant.taken:
                return waited
