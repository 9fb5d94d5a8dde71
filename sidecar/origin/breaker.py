"""A circuit breaker in front of the object store (pure: the clock is handed in).

While the origin fails, every miss would otherwise spend its whole deadline on
retries and add load to an origin that is already refusing it. The breaker
counts the outcome of each origin exchange and:

    closed     every call goes through. `failures` consecutive failures, or a
               failure ratio of at least `failure_ratio` over the last `window_s`
               seconds (once `min_calls` calls were seen there), open it.
    open       calls are refused at once (the caller answers 503). After
               `cool_down_s` the next call is let through as a probe: half-open.
    half_open  `probes` calls at a time go through. A success closes the
               breaker; a failure opens it again for another cool-down. A probe
               that never reports (its caller was cancelled) is given up after a
               cool-down, so the breaker cannot stay half-open forever.

Only failures of the origin count: a 404, 403 or 412 is a healthy origin's
answer and counts as a success (see Origin). The pattern is Nygard's, "Release
It!" (2nd ed., ch. 5); the half-open probe limit follows Envoy's outlier
detection, which lets a bounded number of requests test a host.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# Calls remembered for the failure ratio, at most (a ratio over the last
# 10,000 calls is as good as one over more).
MAX_WINDOW_CALLS = 10_000


class BreakerState(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 5  # consecutive failures that open the breaker; 0 turns it off
    failure_ratio: float = 0.5  # share of failed calls in the window that opens it
    window_s: float = 30.0
    min_calls: int = 20  # calls in the window before the ratio is trusted
    cool_down_s: float = 5.0
    probes: int = 1  # calls let through at once while half-open

    @property
    def enabled(self) -> bool:
        return self.failures > 0


# Called with (old state, new state, why) on every change of state.
StateListener = Callable[[BreakerState, BreakerState, str], None]


class CircuitBreaker:
    """Not thread safe: one event loop owns it."""

    def __init__(
        self,
        settings: BreakerSettings,
        clock: Callable[[], float],
        on_change: StateListener | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._window: deque[tuple[float, bool]] = deque()  # (when, failed)
        self._window_failures = 0
        self._opened_at = 0.0
        self._probes: deque[float] = deque()  # start times of probes not yet reported
        self.rejected = 0  # calls refused while open (for stats)
        self.opened = 0  # times the breaker opened

    @property
    def state(self) -> BreakerState:
        """The state now; an open breaker whose cool-down is over reads as half-open."""
        if self._state is BreakerState.OPEN and self._cooled_down():
            self._change(BreakerState.HALF_OPEN, "cool-down over: probing the origin")
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive

    def allow(self) -> bool:
        """Whether a call may go to the origin now. Every allowed call must be
        followed by exactly one of success(), failure() or abandon()."""
        if not self._settings.enabled:
            return True
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN:
            now = self._clock()
            # Probes whose callers vanished without a word are given up.
            while self._probes and now - self._probes[0] >= self._settings.cool_down_s:
                self._probes.popleft()
            if len(self._probes) < self._settings.probes:
                self._probes.append(now)
                return True
        self.rejected += 1
        return False

    def success(self) -> None:
        if not self._settings.enabled:
            return
        self._consecutive = 0
        self._record(failed=False)
        if self._state is BreakerState.HALF_OPEN:
            self._probes.clear()
            self._change(BreakerState.CLOSED, "a probe succeeded")

    def failure(self) -> None:
        if not self._settings.enabled:
            return
        self._consecutive += 1
        self._record(failed=True)
        if self._state is BreakerState.HALF_OPEN:
            self._probes.clear()
            self._open("a probe failed")
        elif self._state is BreakerState.CLOSED:
            if self._consecutive >= self._settings.failures:
                self._open(f"{self._consecutive} consecutive origin failures")
            elif (len(self._window) >= self._settings.min_calls
                  and self._window_failures >= self._settings.failure_ratio * len(self._window)):
                self._open(f"{self._window_failures} of {len(self._window)} origin calls "
                           f"failed in {self._settings.window_s:g}s")

    def abandon(self) -> None:
        """An allowed call ended without a verdict (its caller was cancelled)."""
        if self._probes:
            self._probes.popleft()

    def _record(self, failed: bool) -> None:
        now = self._clock()
        self._window.append((now, failed))
        self._window_failures += failed
        # Memory stays bounded at any call rate: the oldest calls give way.
        while self._window and (now - self._window[0][0] > self._settings.window_s
                                or len(self._window) > MAX_WINDOW_CALLS):
            _, old_failed = self._window.popleft()
            self._window_failures -= old_failed

    def _open(self, why: str) -> None:
        self._opened_at = self._clock()
        self.opened += 1
        # A fresh window after each opening: the failures that opened it must
        # not re-open it the moment a probe closes it.
        self._window.clear()
        self._window_failures = 0
        self._change(BreakerState.OPEN, why)

    def _cooled_down(self) -> bool:
        return self._clock() - self._opened_at >= self._settings.cool_down_s

    def _change(self, new: BreakerState, why: str) -> None:
        old, self._state = self._state, new
        if old is BreakerState.OPEN and new is BreakerState.OPEN:
            return
        if self._on_change is not None:
            self._on_change(old, new, why)
