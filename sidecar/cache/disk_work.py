"""The store's disk work: run in the executor, tracked until it is done.

Every disk touch (reads, writes, page advice, the scan and the scrub) runs in
the executor handed in; the event loop only does bookkeeping, so it never
waits for the disk. Executor work is run in a task of its own and awaited
through ``shield``: a client that disconnects mid-read cancels its wait, not
the copy, so a pin is released (and a slot reused) only when the executor is
really done with it, and ``close`` waits for every such task before it
closes the slab.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class DiskWork:
    """The executor of the store's disk work and the tasks still under way."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 executor: concurrent.futures.Executor) -> None:
        self.loop = loop
        self._executor = executor
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in the executor (not tracked by itself)."""
        return await self.loop.run_in_executor(self._executor, work, *args)

    async def shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` in a tracked task of its own, awaited through ``shield``."""
        task = self.loop.create_task(work)
        self.track(task)
        return await asyncio.shield(task)

    def start(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """``work`` in the background, tracked."""
        task = self.loop.create_task(work)
        self.track(task)
        return task

    def track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def idle(self) -> None:
        """Wait until no work is under way (work started meanwhile included)."""
        while self._tasks:
            # wait, not gather: cancelling the waiter must not cancel the copies.
            await asyncio.wait(list(self._tasks))
