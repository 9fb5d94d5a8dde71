"""The threads that read block GETs from the origin, most urgent first.

A pool of `threads` worker threads (one origin connection each at a time) takes
work from one priority queue: a reader waiting for its first chunk comes first,
then the rest of a foreground fetch, then read-ahead, then warm-up; within a
priority, first come first served. A plain thread pool is first come first
served only: with many partitions catching up at once, a foreground miss would
wait behind read-ahead of other partitions, and its reader's fetch with it.

Lane budgets (how many connections read-ahead and warm-up may hold) are the
engine's and the planner's; here the order of the queue decides who gets the
next free thread.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sidecar.telemetry.thread_names import name_this_thread

T = TypeVar("T")


class Urgency(enum.IntEnum):
    """Lower goes first."""

    WAITED_FOR = 0  # the part of a foreground fetch a reader is waiting on
    FOREGROUND = 1  # the rest of a foreground fetch
    PREFETCH = 2
    WARM = 3


class OriginWorkers:
    def __init__(self, threads: int, name: str = "sidecar-origin") -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self._queue: list[tuple[int, int, Future[Any], Callable[[], Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
                         for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, urgency: Urgency, work: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the origin workers are shut down")
            heapq.heappush(self._queue, (int(urgency), next(self._order), future, work))
            self._ready.notify()
        return future

    @property
    def queued(self) -> int:
        with self._ready:
            return len(self._queue)

    def shutdown(self) -> None:
        """Cancel what has not started, let what runs finish, wait for the threads."""
        with self._ready:
            self._closed = True
            for _, _, future, _ in self._queue:
                future.cancel()
            self._queue.clear()
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        name_this_thread()
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return
                _, _, future, work = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = work()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
