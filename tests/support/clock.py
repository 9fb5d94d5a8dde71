"""One fake clock for every test of code that takes a `clock` (a callable
returning seconds, like time.monotonic): the test moves time, nothing sleeps."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time does not go back ({seconds} s)")
        self.now += seconds
