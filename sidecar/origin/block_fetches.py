"""Block fetches: ranged GETs of blocks, presigned on the event loop and read
by worker threads straight from the socket into the engine's sink
(sidecar.origin.range_reader), a chunk at a time.

The same rules as a bypass read: a presigned GET with If-Match, the answer
checked before any byte is used, a broken body resumed from the first chunk
the sink did not take, retries under the deadline (renewed by progress) and
the breaker, all through the operation the caller hands in.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cachetools import TTLCache

from sidecar.config import OriginConfig
from sidecar.model import FOREGROUND, PREFETCH, WARM, ObjectInfo
from sidecar.origin.bandwidth import Bandwidth
from sidecar.origin.operation import Operation, within
from sidecar.origin.range_reader import Progress, RangeReader, Sink
from sidecar.origin.workers import OriginWorkers, Urgency
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.thread_names import name_this_thread

# The largest chunk a fetch hands its sink: the cache's checksum chunk.
_MAX_FETCH_CHUNK = 1024 * 1024
# Who gets the next free origin thread, by lane (a reader waiting on a part of
# a foreground fetch goes first of all: fetch_into's `waited_for`).
_URGENCY = {FOREGROUND: Urgency.FOREGROUND, PREFETCH: Urgency.PREFETCH, WARM: Urgency.WARM}
# How long a presigned block GET stays valid: one fetch, with its retries, at most.
_PRESIGN_SECONDS = 900
_PRESIGNED_REUSE_S = 60.0


class BlockFetches:
    def __init__(
        self, config: OriginConfig, metrics: Metrics, bandwidth: Bandwidth,
        clock: Callable[[], float], stall_s: float,
    ) -> None:
        self._metrics = metrics
        self._bandwidth = bandwidth
        self._stall_s = stall_s
        self._client: Any = None
        # Presigned GET URLs, one per object, reused by its block fetches for a
        # minute of their 15: presigning (botocore's canonical request and HMACs
        # on the event loop) cost about as much as reading a block's worth of
        # chunks from the cache. A minute keeps every URL far from its expiry
        # and from the expiry of the temporary credentials it was signed with
        # (botocore refreshes those at least 10 minutes before they lapse).
        self._urls: TTLCache[tuple[str, str], str] = TTLCache(
            maxsize=1024, ttl=_PRESIGNED_REUSE_S, timer=clock
        )
        # Ranged GETs of blocks are read in these threads, one connection each;
        # the aiobotocore client only presigns them.
        self._reader = RangeReader(
            connect_timeout_s=config.connect_timeout_s, stall_timeout_s=stall_s,
            max_chunk_size=_MAX_FETCH_CHUNK, max_idle=config.max_connections,
        )
        self._workers = OriginWorkers(config.max_connections)

    def use_client(self, client: Any) -> None:
        """The aiobotocore client that presigns the GETs (once it is started)."""
        self._client = client

    def forget(self, bucket: str, key: str) -> None:
        """The object changed: its next fetch signs afresh."""
        self._urls.pop((bucket, key), None)

    async def fetch_into(
        self, operation: Operation, info: ObjectInfo, start: int, end: int, lane: str,
        sink: Sink, chunk_size: int, waited_for: bool,
    ) -> None:
        """Bytes [start, end) of the object to `sink`, chunk by chunk, in
        attempts of `operation`. A sink that fails (the cache disk) ends it
        with the sink's own error, which is nobody's fault at the origin."""
        progress = Progress(start)
        urgency = Urgency.WAITED_FOR if waited_for and lane == FOREGROUND else _URGENCY[lane]
        counted = self._counting_sink(sink, lane)
        pace = self._bandwidth.pacer(lane)
        while progress.position < end:
            async with operation.attempt() as attempt:
                before = progress.received
                try:
                    url = await within(operation.deadline, self._stall_s,
                                       lambda: self._presign(info))
                    work = self._workers.submit(urgency, functools.partial(
                        self._reader.read, url, end, info.etag, info.size, counted,
                        progress, chunk_size, pace,
                    ))
                    try:
                        await asyncio.wrap_future(work)
                    except asyncio.CancelledError:
                        # A thread already reading goes on until it looks at
                        # this: before its next chunk, not at the range's end.
                        if progress.stop():
                            await _left(work)
                        raise
                except BaseException:
                    # Whatever went wrong (a 403 for a revoked key among it),
                    # the next attempt signs afresh.
                    self.forget(info.bucket, info.key)
                    raise
                finally:
                    if progress.received > before:
                        attempt.progressed()

    async def _presign(self, info: ObjectInfo) -> str:
        """A presigned GET of the object (its Range and If-Match headers are
        not signed, so one URL serves every block of it)."""
        where = (info.bucket, info.key)
        url = self._urls.get(where)
        if url is None:
            url = str(await self._client.generate_presigned_url(
                "get_object", Params={"Bucket": info.bucket, "Key": info.key},
                ExpiresIn=_PRESIGN_SECONDS,
            ))
            self._urls[where] = url
        return url

    def _counting_sink(self, sink: Sink, lane: str) -> Sink:
        counter = self._metrics.origin_bytes.labels(lane)

        def count(offset: int, data: memoryview) -> None:
            # Counted before the sink takes the chunk: from then on a reader may
            # have its bytes, and the counter already says they came from the
            # origin (prometheus counters are thread safe).
            counter.inc(len(data))
            sink(offset, data)

        return count

    async def close(self) -> None:
        """Stop the fetch threads and wait for them, off the event loop.

        Threads blocked on the origin (their sockets shut down) or waiting for
        their bandwidth budget return at once; one in its sink may be writing
        to a cache disk that hangs, and joining it on the loop would hold
        every other step of the stop with it. The wait is bounded by the
        stop's deadline (sidecar.stop_deadline), which ends the process."""
        self._bandwidth.close()
        self._reader.close()
        loop = asyncio.get_running_loop()
        joined: asyncio.Future[None] = loop.create_future()

        def join() -> None:
            name_this_thread()
            try:
                self._workers.shutdown()
            finally:
                loop.call_soon_threadsafe(_settle, joined)

        threading.Thread(target=join, name="sidecar-origin-stop", daemon=True).start()
        await joined


def _settle(joined: asyncio.Future[None]) -> None:
    if not joined.done():  # its waiter may have been cancelled meanwhile
        joined.set_result(None)


async def _left(work: Future[None]) -> None:
    """Once a cancelled fetch's thread, caught in its sink, has left its read:
    the sink writes into cache slots that the caller gives back (or hands to
    other blocks) as soon as the cancellation reaches it, so no chunk may
    land after that. The thread stops at once after that chunk (Progress);
    one waiting on the origin is not waited for, as it hands nothing more on.
    A second cancellation (the stop, bounded by its deadline) ends the wait;
    the stop joins the threads itself."""
    if work.done():
        return
    try:
        await asyncio.wrap_future(work)
    except asyncio.CancelledError:
        if not work.done():
            raise
    except Exception:
        return  # the read's own error, which nobody waits for now
