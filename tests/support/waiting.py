"""Awaiting a state instead of sleeping and hoping: one bounded poll, two forms.

`eventually` (threads, subprocesses, servers of another process) and
`eventually_async` (code on the test's own event loop) poll a probe until it
returns something true (a non-empty list, a non-zero count, True, an object),
and fail with what was awaited when the time is up. Either returns the probe's last value, so a test can assert on it.
Prefer awaiting the state itself where the code offers one (an event, a future,
`Engine.idle()`); these are for state that is only visible from outside.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 20.0


def eventually(probe: Callable[[], T | None], what: str, timeout: float = DEFAULT_TIMEOUT_S,
               interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


async def eventually_async(probe: Callable[[], T | None], what: str,
                           timeout: float = DEFAULT_TIMEOUT_S, interval: float = 0.01) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)
