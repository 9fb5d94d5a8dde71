"""The engine's tasks that no caller awaits: fetches, the sealing of blocks
that landed whole, read-ahead's look-ups of the next segment.

They are kept, not fired and forgotten, so that `Engine.idle` can wait for
them (tests and a clean stop) and `Engine.close` can cancel them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        """Until the tasks under way now are done (not those they start)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
