"""Read heads and read-ahead windows: pure bookkeeping, the clock handed in.

Kafka's remote reader opens a segment with `bytes=pos-`, reads about one fetch
(max.partition.fetch.bytes, ~1 MiB) and closes; its next fetch starts at the
next offset, i.e. at the first byte of the batch it did not receive whole. So a
consumer shows up as a series of requests each starting after the previous
one started and at or before where the bytes delivered to it ended. A head
follows the bytes actually delivered, never the range asked for (open-ended
ranges are mostly not read to their end). "Delivered" means handed to the
socket, which runs ahead of what the client read by up to its buffers, so the
next request's start, not the delivered end, says where the consumer really is.

A stream earns read-ahead only once it is shown to be sequential: continued by
two requests in a row, or one request delivering two whole blocks. A random
reader whose start happens to land near an old head once is not enough, so
random access does not trigger prefetch. The window starts at one block, doubles each time the
stream consumes a block that was prefetched for it, and halves when such a block
is evicted unread.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.blocks import block_count

ObjectId = tuple[str, str, str]  # bucket, key, etag


@dataclass(eq=False)
class Stream:
    object_id: ObjectId
    position: int  # first byte not yet delivered
    request_start: int  # where the latest request of this stream started
    last_active: float
    window: int = 1  # read-ahead, in blocks
    sequential: bool = False
    continuations: int = 0
    ahead_to: int = 0  # blocks below this id have been considered for prefetch
    delivered_since_attach: int = 0
    next_segment_blocks: int = 0  # blocks of the next segment prefetched for it
    # The block the stream's previous request ended in, when this one started
    # in it again: the same reader's bytes, not a reuse (-1: none).
    resumed_block: int = -1
    # Names the reader to the memory tier, which takes a chunk read again as a
    # sign of reuse only when another reader reads it (cache.tier_regions).
    number: int = 0

    def used(self, max_window: int) -> None:
        """A block prefetched for this stream was read: the window was right, grow it."""
        self.window = min(max_window, self.window * 2)

    def wasted(self) -> None:
        """A block prefetched for it was evicted unread: the window was too long."""
        self.window = max(1, self.window // 2)


@dataclass(frozen=True)
class AheadPlan:
    blocks: range  # blocks of this object to prefetch now
    beyond_end: int  # how many blocks the window reaches past the object's end


class StreamTable:
    """Several heads per object (several consumers of one partition), idle ones expiring."""

    def __init__(
        self,
        *,
        block_size: int,
        max_window_blocks: int,
        idle_s: float,
        clock: Callable[[], float],
        max_heads_per_object: int = 8,
        max_objects: int = 4096,
    ) -> None:
        self._block_size = block_size
        self._max_window = max_window_blocks
        self._idle_s = idle_s
        self._clock = clock
        self._max_heads = max_heads_per_object
        self._max_objects = max_objects
        self._heads: OrderedDict[ObjectId, list[Stream]] = OrderedDict()
        # Window and confirmation handed from a segment to the next one.
        self._handoffs: OrderedDict[ObjectId, int] = OrderedDict()
        self._numbers = itertools.count(1)

    @property
    def max_window(self) -> int:
        return self._max_window

    @max_window.setter
    def max_window(self, blocks: int) -> None:
        """A new bound (a configuration reload): streams grow to it, or are held
        to it from their next plan on."""
        if blocks < 1:
            raise ValueError(f"max_window must be at least 1 block, got {blocks}")
        self._max_window = blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    def now(self) -> float:
        """The table's clock (handed in): what the planner times its own memory by."""
        return self._clock()

    def streams(self, object_id: ObjectId) -> list[Stream]:
        return list(self._heads.get(object_id, ()))

    def attach(self, object_id: ObjectId, start: int) -> Stream:
        """The stream a request starting at `start` continues, or a new one."""
        now = self._clock()
        heads = [h for h in self._heads.pop(object_id, []) if now - h.last_active <= self._idle_s]
        # Anywhere from the previous request's start up to just after what was
        # delivered: the broker re-reads the batch it did not get whole, and
        # the socket took more than the client read.
        candidates = [h for h in heads
                      if h.request_start <= start <= h.position + self._block_size]
        resumed = -1
        if candidates:
            stream = max(candidates, key=lambda h: h.request_start)
            if stream.position > 0 and \
                    (stream.position - 1) // self._block_size == start // self._block_size:
                resumed = start // self._block_size
            stream.continuations += 1
            stream.sequential = stream.sequential or stream.continuations >= 2
        else:
            stream = Stream(object_id, start, start, now, ahead_to=start // self._block_size + 1,
                            number=next(self._numbers))
            inherited = self._handoffs.pop(object_id, None)
            if inherited is not None and start < self._block_size:
                # Handed over before a reload may have lowered the bound.
                stream.window = min(inherited, self._max_window)
                stream.sequential = True
            heads.append(stream)
            if len(heads) > self._max_heads:
                heads.sort(key=lambda h: h.last_active)
                del heads[0]
        stream.position = start
        stream.resumed_block = resumed
        stream.request_start = start
        stream.last_active = now
        stream.delivered_since_attach = 0
        self._heads[object_id] = heads
        while len(self._heads) > self._max_objects:
            self._heads.popitem(last=False)
        return stream

    def advance(self, stream: Stream, position: int) -> None:
        """Bytes up to `position` (exclusive) were delivered to the client."""
        if position > stream.position:
            stream.delivered_since_attach += position - stream.position
            stream.position = position
        stream.last_active = self._clock()
        if stream.delivered_since_attach >= 2 * self._block_size:
            stream.sequential = True

    def plan(self, stream: Stream, object_size: int) -> AheadPlan:
        """Which blocks to prefetch now, given what was already considered."""
        blocks = block_count(object_size, self._block_size)
        if not stream.sequential:
            return AheadPlan(range(0), 0)
        # A window grown before a reload lowered the bound is held to it now,
        # not once a block read ahead for it is read (which may never come).
        stream.window = min(stream.window, self._max_window)
        current = stream.position // self._block_size
        want_to = current + 1 + stream.window
        first = max(stream.ahead_to, current + 1)
        plan = AheadPlan(range(first, min(want_to, blocks)), max(0, want_to - blocks))
        stream.ahead_to = max(stream.ahead_to, min(want_to, blocks))
        return plan

    def hand_off(self, stream: Stream, next_object: ObjectId) -> None:
        """The stream will continue into the next segment with its window."""
        self._handoffs[next_object] = stream.window
        while len(self._handoffs) > self._max_objects:
            self._handoffs.popitem(last=False)
