"""Awaiting a state instead of sleeping and hoping: one bounded poll, three forms.

`eventually` (threads, subprocesses, servers of another process) and
`eventually_async` (code on the test's own event loop) poll a probe until it
returns something other than None or False, and fail with what was awaited when
the time is up. `eventually_awaited` is `eventually_async` for a probe that must
itself await (a question asked over the test's own connection, such as a
browser's DevTools socket). Each returns the probe's last value, so a test can
assert on it. Prefer awaiting the state itself where the code offers one (an
event, a future, `Engine.idle()`); these are for state that is only visible from
outside.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 20.0


def eventually(probe: Callable[[], T | None], what: str, timeout: float = DEFAULT_TIMEOUT_S,
               interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# The async forms take their own `timeout` although ruff's ASYNC109 would have
# callers wrap them in asyncio.timeout(): running out of this bound fails with
# what was awaited, which a cancellation from outside would not say.


async def eventually_async(
    probe: Callable[[], T | None], what: str,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (see above)
    interval: float = 0.01,
) -> T:
    async def probe_now() -> T | None:
        return probe()

    return await eventually_awaited(probe_now, what, timeout, interval)


async def eventually_awaited(
    probe: Callable[[], Awaitable[T | None]], what: str,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (see above)
    interval: float = 0.01,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)
