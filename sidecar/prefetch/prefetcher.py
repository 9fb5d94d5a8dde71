"""Read-ahead that follows what readers consume, into the next segment too.

The engine tells the prefetcher where each request starts, which bytes were
delivered and which blocks readers took; the prefetcher decides (with the pure
StreamTable) what to fetch ahead and asks the engine to fetch it on the
`prefetch` lane, through the same single-flight table as foreground reads.

Prefetch fetches are one block per origin GET and run concurrently: an object
store serves tens of MB/s per connection, so a single long GET caps a catch-up
stream at that speed, while a window of parallel block GETs does not.

Bounds: at most `max_in_flight` blocks being fetched (memory: that many blocks),
and at most `max_pending` prefetched blocks not yet read (a share of the cache),
so read-ahead can never flush the cache or eat the heap.

Cross-segment (Aiven layout): when a stream's window reaches past the end of a
segment, the first blocks of the partition's next segment are fetched, and the
stream's window is handed to the reader that will open that segment, so a
catch-up read does not stall at every segment boundary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from sidecar.blocks import block_count
from sidecar.cache import BlockIdent
from sidecar.layout import next_segment_key, parse_aiven_key
from sidecar.model import ObjectInfo
from sidecar.prefetch.streams import Stream, StreamTable
from sidecar.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class BlockFetcher(Protocol):
    def fetch_ahead(self, info: ObjectInfo, block: int) -> asyncio.Task[None] | None:
        """Start fetching one block unless cached or in flight; the task, or None."""


class Prefetcher:
    def __init__(
        self,
        table: StreamTable,
        fetcher: BlockFetcher,
        metrics: Metrics,
        *,
        head: Callable[[str, str], Awaitable[ObjectInfo]],
        list_keys: Callable[[str, str], Awaitable[list[str]]] | None,
        layout_prefix: str,
        max_in_flight: int,
        max_pending: int,
    ) -> None:
        self._table = table
        self._fetcher = fetcher
        self._metrics = metrics
        self._head = head
        self._list_keys = list_keys
        self._layout_prefix = layout_prefix
        self._max_in_flight = max_in_flight
        self._max_pending = max(1, max_pending)
        self._pending: dict[BlockIdent, Stream] = {}  # prefetched, not yet read
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending_blocks(self) -> int:
        return len(self._pending)

    def on_request(self, info: ObjectInfo, start: int) -> Stream:
        return self._table.attach((info.bucket, info.key, info.etag), start)

    def on_delivered(self, stream: Stream, info: ObjectInfo, position: int) -> None:
        self._table.advance(stream, position)
        plan = self._table.plan(stream, info.size)
        for block in plan.blocks:
            if not self._issue(info, block, stream):
                # Over a bound: reconsider these blocks on the next delivery.
                stream.ahead_to = min(stream.ahead_to, block)
                return
        if plan.beyond_end > stream.next_segment_blocks and self._list_keys is not None:
            wanted = plan.beyond_end
            stream.next_segment_blocks = wanted
            task = asyncio.get_running_loop().create_task(
                self._next_segment(info, stream, wanted)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def on_block_read(self, ident: BlockIdent) -> None:
        """A reader took this block (from the cache or from its fetch)."""
        stream = self._pending.pop(ident, None)
        if stream is not None:
            self._metrics.prefetch_blocks.labels("used").inc()
            stream.used(self._table.max_window)

    def on_evicted(self, ident: BlockIdent, reason: str) -> None:
        stream = self._pending.pop(ident, None)
        if stream is not None:
            self._metrics.prefetch_blocks.labels("wasted").inc()
            stream.wasted()

    def _issue(self, info: ObjectInfo, block: int, stream: Stream) -> bool:
        """Fetch one block ahead; False when a bound says not now."""
        if self._in_flight >= self._max_in_flight or len(self._pending) >= self._max_pending:
            return False
        task = self._fetcher.fetch_ahead(info, block)
        if task is None:
            return True  # cached or already being fetched: nothing to do
        self._in_flight += 1
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        self._pending[ident] = stream
        self._metrics.prefetch_blocks.labels("issued").inc()

        def finished(done: asyncio.Task[None]) -> None:
            self._in_flight -= 1
            if done.cancelled() or done.exception() is not None:
                self._pending.pop(ident, None)

        task.add_done_callback(finished)
        return True

    async def _next_segment(self, info: ObjectInfo, stream: Stream, wanted: int) -> None:
        segment = parse_aiven_key(info.key, self._layout_prefix)
        if segment is None or self._list_keys is None:
            return
        try:
            keys = await self._list_keys(info.bucket, segment.partition_prefix)
            next_key = next_segment_key(keys, info.key, self._layout_prefix)
            if next_key is None:
                return
            next_info = await self._head(info.bucket, next_key)
        except Exception as exc:  # read-ahead is best effort; the reader will ask itself
            log.info("no cross-segment prefetch after s3://%s/%s: %s", info.bucket, info.key, exc)
            return
        self._table.hand_off(stream, (next_info.bucket, next_info.key, next_info.etag))
        for block in range(min(wanted, block_count(next_info.size, self._table.block_size))):
            if not self._issue(next_info, block, stream):
                return

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
