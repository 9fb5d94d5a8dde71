"""Read-ahead planning: which blocks to fetch ahead of readers, within bounds.

Pure: no I/O, no tasks, no clock of its own (the StreamTable has the clock).
The engine, the one owner of origin fetches, tells the planner what happened
(a request started, bytes were delivered, a reader took a block, a block left
the cache, a read-ahead fetch ended) and the planner answers with the blocks to
fetch; the engine starts them on the `prefetch` lane, through the same
single-flight table as foreground reads.

Read-ahead is one block per origin GET, run concurrently (the engine's part):
an object store serves tens of MB/s per connection, so a single long GET caps
a catch-up stream at that speed, while a window of parallel block GETs does not.

Bounds: at most `max_in_flight` read-ahead blocks being fetched (memory: that
many blocks), and at most `max_pending` read-ahead blocks cached but not yet
read (a share of the cache), so read-ahead can never flush the cache or eat
the heap. A block refused by a bound is reconsidered at the stream's next
delivery.

Cross-segment (Aiven layout, docs/ARCHITECTURE.md "Facts"): when a stream's window reaches
past the end of a segment, the plan asks for the partition's next segment (the
next `.log` key under the same `{topic}-{topicId}/{partition}/`); the engine
looks it up, and `continue_into` hands the stream's window to the reader that
will open that segment and names its first blocks to fetch, so a catch-up read
does not stall at every segment boundary.

A segment's successor, once listed, is remembered (`NextSegment.known`): a
stream's window reaches further past the segment's end at several deliveries
in a row, and each reach would otherwise list the partition again (S3 bills
a LIST as ten GETs). The successor of a closed segment does not change; one
that is gone when the engine looks it up (an orphan of a retried copy) is
forgotten (`forget`). While a look-up is under way, and for a while after
one found no successor yet or failed, further reaches ask nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from sidecar.blocks import block_count
from sidecar.cache.ident import BlockIdent
from sidecar.layout import Layout, next_segment_key, parse_aiven_key
from sidecar.model import ObjectInfo
from sidecar.prefetch.streams import Stream, StreamTable

# Segments whose successor is remembered (the oldest goes first).
SUCCESSORS_REMEMBERED = 4096
# How long a look-up under way, or one that found no successor, holds off the
# next: the partition's next segment appears when the broker uploads it.
NO_SUCCESSOR_S = 10.0


@dataclass(frozen=True)
class _Successor:
    key: str | None  # None: being looked up, or none was listed
    since: float


@dataclass(frozen=True)
class NextSegment:
    """Look up the segment after `after` (a key under `partition_prefix`) and
    fetch its first `blocks` blocks for `stream`; `known`: its key, when an
    earlier look-up listed it (no listing needed)."""

    stream: Stream
    after: ObjectInfo
    partition_prefix: str
    blocks: int
    known: str | None = None


@dataclass(frozen=True)
class ReadAhead:
    """What to fetch now for one delivery: blocks of the object being read, and
    possibly the start of the next segment."""

    blocks: range
    next_segment: NextSegment | None = None


NOTHING = ReadAhead(range(0))


class ReadAheadPlanner:
    def __init__(
        self,
        table: StreamTable,
        *,
        max_in_flight: int,
        max_pending: int,
        layout: Layout,
        layout_prefix: str = "",
    ) -> None:
        self._table = table
        self._max_in_flight = max_in_flight
        self._max_pending = max(1, max_pending)
        self._layout = layout
        self._layout_prefix = layout_prefix
        self._pending: dict[BlockIdent, Stream] = {}  # read ahead, not yet read
        self._in_flight: set[BlockIdent] = set()
        # (bucket, segment key) -> its successor, as listed (module docstring).
        self._successors: OrderedDict[tuple[str, str], _Successor] = OrderedDict()

    @property
    def table(self) -> StreamTable:
        return self._table

    @property
    def pending_blocks(self) -> int:
        return len(self._pending)

    @property
    def blocks_in_flight(self) -> int:
        return len(self._in_flight)

    def on_request(self, info: ObjectInfo, start: int) -> Stream:
        """A request for `info` starts at `start`: the stream it continues, or a new one."""
        return self._table.attach((info.bucket, info.key, info.etag), start)

    def on_delivered(self, stream: Stream, info: ObjectInfo, position: int) -> ReadAhead:
        """Bytes up to `position` went to the stream's client: what to fetch now."""
        self._table.advance(stream, position)
        plan = self._table.plan(stream, info.size)
        next_segment = None
        if plan.beyond_end > stream.next_segment_blocks and self._layout is Layout.AIVEN:
            segment = parse_aiven_key(info.key, self._layout_prefix)
            # Only a `.log` goes on into the next segment's `.log`: a segment's
            # manifest and indexes are read before its own `.log`.
            go, known = (False, None) if segment is None or segment.suffix != "log" \
                else self._successor_of(info)
            if go:
                assert segment is not None
                stream.next_segment_blocks = plan.beyond_end
                next_segment = NextSegment(stream, info, segment.partition_prefix,
                                           plan.beyond_end, known)
        if not plan.blocks and next_segment is None:
            return NOTHING
        return ReadAhead(plan.blocks, next_segment)

    def next_key(self, wanted: NextSegment, keys: list[str]) -> str | None:
        """The next segment's `.log` key among the partition's keys, if there is
        one (remembered either way: module docstring)."""
        key = next_segment_key(keys, wanted.after.key, self._layout_prefix)
        self._remember(wanted.after, _Successor(key, self._table.now()))
        return key

    def forget(self, wanted: NextSegment) -> None:
        """The successor of `wanted` could not be looked at (gone, or the origin
        failed): the next reach past the segment's end lists it afresh."""
        self._successors.pop((wanted.after.bucket, wanted.after.key), None)

    def _successor_of(self, info: ObjectInfo) -> tuple[bool, str | None]:
        """Whether to go into the segment after `info` now, and its key if known."""
        known = self._successors.get((info.bucket, info.key))
        if known is not None and known.key is not None:
            return True, known.key
        now = self._table.now()
        if known is not None and now - known.since < NO_SUCCESSOR_S:
            return False, None  # looked up now, or none lately: asked again later
        self._remember(info, _Successor(None, now))  # a look-up is under way
        return True, None

    def _remember(self, info: ObjectInfo, successor: _Successor) -> None:
        self._successors[(info.bucket, info.key)] = successor
        self._successors.move_to_end((info.bucket, info.key))
        while len(self._successors) > SUCCESSORS_REMEMBERED:
            self._successors.popitem(last=False)

    def continue_into(self, wanted: NextSegment, next_info: ObjectInfo) -> range:
        """The stream goes on in `next_info`: hand its window over; the blocks to fetch."""
        self._table.hand_off(wanted.stream,
                             (next_info.bucket, next_info.key, next_info.etag))
        return range(min(wanted.blocks, block_count(next_info.size, self._table.block_size)))

    def admit(self, ident: BlockIdent, stream: Stream) -> bool:
        """May a read-ahead fetch of `ident` (not cached, not in flight) start now?

        Yes: it is counted against the bounds until `finished`, and against the
        pending share until read or evicted. No (a bound is reached): the stream
        will reconsider the block at its next delivery.
        """
        if len(self._in_flight) >= self._max_in_flight or \
                len(self._pending) >= self._max_pending:
            if ident.key == stream.object_id[1]:
                stream.ahead_to = min(stream.ahead_to, ident.block)
            return False
        self._in_flight.add(ident)
        self._pending[ident] = stream
        return True

    def finished(self, ident: BlockIdent, cached: bool) -> None:
        """A read-ahead fetch ended; `cached`: its block is in the cache now."""
        self._in_flight.discard(ident)
        if not cached:
            self._pending.pop(ident, None)

    def on_block_read(self, ident: BlockIdent) -> bool:
        """A reader took this block; True if it was read ahead (it was used)."""
        stream = self._pending.pop(ident, None)
        if stream is None:
            return False
        stream.used(self._table.max_window)
        return True

    def on_evicted(self, ident: BlockIdent) -> bool:
        """The block left the cache; True if it was read ahead and never read (waste)."""
        stream = self._pending.pop(ident, None)
        if stream is None:
            return False
        stream.wasted()
        return True
