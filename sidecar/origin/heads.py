"""What the origin said of each object (its HEAD answer): remembered, asked once
at a time, and stood in for while the origin fails.

- An answer is remembered for `ttl_s` (`head_ttl`): a range request needs the
  object's size and ETag, and a replay asks them thousands of times a second.
- One HEAD per key at a time: readers that arrive while it is on its way wait
  for its answer.
- While the origin fails (not when it answers 404 or 403: those are answers),
  the last answer known stands in for up to `stale_if_error_s` after it came
  (RFC 5861 section 4, stale-if-error), so cached blocks stay readable through
  an outage once the TTL has passed.
- `forget` (a write or delete went through the sidecar) drops both, and takes
  a HEAD in flight off the table: its answer, which may predate the write, is
  handed to those already waiting but never remembered.

No I/O of its own: the HEAD itself is handed in, the clock too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cachetools import LRUCache, TTLCache

from sidecar.errors import OriginError, OriginUnavailable
from sidecar.model import ObjectInfo

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str]  # bucket, key


class HeadMemo:
    def __init__(
        self, *, ttl_s: float, stale_if_error_s: float, clock: Callable[[], float],
        remembered: int = 8192, known: int = 16384,
    ) -> None:
        self._stale_s = stale_if_error_s
        self._clock = clock
        self._fresh: TTLCache[ObjectKey, ObjectInfo] = TTLCache(
            maxsize=remembered, ttl=ttl_s, timer=clock)
        # The last answer of each object and when it came (bounded: an
        # ObjectInfo is a few hundred bytes).
        self._known: LRUCache[ObjectKey, tuple[ObjectInfo, float]] = LRUCache(maxsize=known)
        self._in_flight: dict[ObjectKey, asyncio.Task[ObjectInfo]] = {}
        # Every HEAD still running, forgotten ones too: the loop keeps only a
        # weak reference to a task.
        self._running: set[asyncio.Task[ObjectInfo]] = set()

    def remembered(self, bucket: str, key: str) -> ObjectInfo | None:
        """The object's HEAD answer if it is remembered and fresh; else None
        (nothing asked, nothing joined)."""
        return self._fresh.get((bucket, key))

    async def get(
        self, bucket: str, key: str, ask: Callable[[], Awaitable[ObjectInfo]]
    ) -> ObjectInfo:
        """The object's HEAD answer: remembered, joined, asked (`ask`), or stale."""
        where = (bucket, key)
        remembered = self._fresh.get(where)
        if remembered is not None:
            return remembered
        task = self._in_flight.get(where)
        if task is None:
            # A task of its own, not the first reader's: that reader's client
            # going away (its request cancelled) must not cancel the answer
            # the others wait for.
            task = asyncio.get_running_loop().create_task(
                self._ask(where, ask), name=f"HEAD s3://{bucket}/{key}")
            self._in_flight[where] = task
            self._running.add(task)
            task.add_done_callback(self._settled)
        return await asyncio.shield(task)

    async def _ask(
        self, where: ObjectKey, ask: Callable[[], Awaitable[ObjectInfo]]
    ) -> ObjectInfo:
        task = asyncio.current_task()
        try:
            info, fresh = await self._ask_or_stale(where, ask)
            # Remembered only if no write went through meanwhile (see forget).
            if fresh and self._in_flight.get(where) is task:
                self._fresh[where] = info
                self._known[where] = (info, self._clock())
            return info
        finally:
            if self._in_flight.get(where) is task:
                del self._in_flight[where]

    def _settled(self, task: asyncio.Task[ObjectInfo]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its waiters, if any, re-raise it themselves

    def forget(self, bucket: str, key: str) -> None:
        self._fresh.pop((bucket, key), None)
        self._known.pop((bucket, key), None)
        self._in_flight.pop((bucket, key), None)

    async def _ask_or_stale(
        self, where: ObjectKey, ask: Callable[[], Awaitable[ObjectInfo]]
    ) -> tuple[ObjectInfo, bool]:
        """The origin's answer (fresh), or while it fails the last one known (not)."""
        try:
            return await ask(), True
        except OriginUnavailable as exc:
            known = self._known.get(where)
            if known is None or self._clock() - known[1] > self._stale_s:
                raise
            log.debug("s3://%s/%s: using the HEAD answer of %.0fs ago: %s",
                      *where, self._clock() - known[1], exc)
            return known[0], False
        except OriginError:
            # 404 and 403 are answers, not failures: a deleted object is gone.
            self._known.pop(where, None)
            raise
