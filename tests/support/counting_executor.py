"""A disk executor that counts what is handed to it (how many trips to the
executor a read took)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class CountingExecutor(ThreadPoolExecutor):
    """The store's disk executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2, thread_name_prefix="test-io")
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)
