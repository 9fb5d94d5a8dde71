"""Serving a range piece by piece: lookup, the block's fetch joined or started,
pieces in order.

A lookup is a hit when the block is in the cache or already on its way from the
origin (read ahead, warmed, or fetched for an earlier request): the reader's
request causes no origin read. A miss is a lookup that starts an origin fetch,
and only the bytes of fetches a request started count as served from origin.

Open-ended requests (`bytes=pos-`, or no Range at all) are read lazily, a block
at a time as the client consumes: Kafka's RemoteLogManager opens `bytes=pos-`
and closes after about one fetch, so fetching ahead here would waste origin
bytes (read-ahead, which follows what was consumed, does that job).

A block that can get no slot, or whose disk fails under it, is read by its
readers straight from the origin, uncached; so is every block in bypass mode.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from sidecar.blocks import block_span, blocks_for_range
from sidecar.cache import BlockIdent, BlockStore
from sidecar.cache.errors import ChecksumMismatch
from sidecar.engine.evictions import EvictedBlocks
from sidecar.engine.fetches import Fetches
from sidecar.engine.origin_reader import OriginReader
from sidecar.engine.pieces import PIECE_SIZE, Piece, Source, piece_length
from sidecar.engine.read_ahead import ReadAhead
from sidecar.in_flight import InFlightBlock, Unslotted
from sidecar.isolation.modes import ModeState
from sidecar.model import FOREGROUND, ObjectInfo
from sidecar.tally import CACHED, FETCHED, JOINED, ReadTally
from sidecar.telemetry.metrics import Metrics

# The engine's log lines keep the one logger name, whichever of its rooms writes them.
log = logging.getLogger("sidecar.engine")


class RangeServer:
    """The pieces of one range at a time, in order, with their source."""

    def __init__(
        self, store: BlockStore, origin: OriginReader, metrics: Metrics, modes: ModeState,
        fetches: Fetches, read_ahead: ReadAhead | None, evicted: EvictedBlocks,
        *, block_size: int,
    ) -> None:
        self._store = store
        self._origin = origin
        self._metrics = metrics
        self._modes = modes
        self._fetches = fetches
        self._read_ahead = read_ahead
        self._evicted = evicted
        self._block_size = block_size
        self._chunk_size = min(PIECE_SIZE, block_size)

    async def pieces(
        self, info: ObjectInfo, start: int, end: int, lazy: bool, tally: ReadTally
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """The bytes of [start, end] (inclusive) in order, with their source."""
        read_ahead = self._read_ahead if self._modes.read_ahead else None
        stream = read_ahead.on_request(info, start) if read_ahead is not None else None
        reader = stream.number if stream is not None else None  # for the memory tier
        position = start
        started: set[BlockIdent] = set()  # blocks whose origin fetch this request began
        blocks = blocks_for_range(start, end, self._block_size)
        for block in blocks:
            block_start, block_end = block_span(block, self._block_size, info.size)
            lo = max(start, block_start) - block_start
            hi = min(end + 1, block_end) - block_start
            ahead = range(block, block + 1) if lazy else range(block, blocks.stop)
            resumed = stream is not None and stream.resumed_block == block
            async with aclosing(self._block_pieces(info, block, lo, hi, ahead, started,
                                                   tally, resumed, reader)) as pieces:
                async for piece in pieces:
                    yield piece
                    # Back here only once the client took the piece: heads follow
                    # delivered bytes, not the range asked for.
                    position += piece_length(piece[0])
                    # The mode is asked again at each piece: an operator's switch
                    # to a mode without read-ahead stops it within a long read too.
                    if stream is not None and self._modes.read_ahead:
                        assert read_ahead is not None
                        read_ahead.on_delivered(stream, info, position)
            if block_start + hi == block_end:
                # The reader went past the block: its pages may leave the page cache.
                self._store.release_pages(BlockIdent(info.bucket, info.key, info.etag, block))

    async def _block_pieces(
        self, info: ObjectInfo, block: int, lo: int, hi: int, ahead: range,
        started: set[BlockIdent], tally: ReadTally, resumed: bool = False,
        reader: int | None = None,
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        if not self._modes.caching:
            tally.add(block, FETCHED)
            async with aclosing(self._bypass(info, block, lo, hi, tally)) as passing:
                async for passed in passing:
                    yield passed
            return
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        # The rest of a block its stream's previous request ended in: the same
        # reader again, not a reuse for eviction.
        record = self._store.lookup(ident, touch=not resumed)
        on_their_way = self._fetches.on_their_way
        # A block of this request's own run that landed before the reader came
        # to it: read from its slot, but fetched for this request, so a miss
        # (its origin bytes are this request's) and not a hit.
        own = ident in started
        joined = ident in on_their_way and not own
        cached = record is not None and not own
        anticipated = cached or joined
        self._tally_how_found(tally, ident, cached, joined)
        self._metrics.cache_lookups.labels("hit" if anticipated else "miss").inc()
        if not anticipated:
            log.debug("miss %s block %d", info.key, block)
        if self._read_ahead is not None:
            self._read_ahead.on_block_read(ident)
        from_slot = Source.ORIGIN if own else Source.CACHE
        while record is not None and lo < hi:
            # One chunk a piece: each is read and verified once.
            upto = min(hi, (lo // self._chunk_size + 1) * self._chunk_size)
            held = self._store.tier_slice(ident, record.generation, lo, upto, reader=reader)
            if held is not None:
                # Verified when it entered the memory tier: sent from there.
                lo = upto
                yield held, from_slot
                continue
            data = await self._store.read(record, lo, upto, through=hi, reader=reader)
            if data is None:  # evicted meanwhile, or failed its checksum: refetch
                self._evicted.left_cache((ident,))
                self._bypass_disk_if_reads_fail()
                self._tally_how_found(tally, ident, False, ident in on_their_way)
                break
            lo = upto
            yield data, from_slot
        if lo >= hi:
            return
        source = Source.CACHE if joined else Source.ORIGIN
        before = len(started)
        in_flight = self._fetches.join_or_start(info, ident, ahead, started)
        # A fetch this request started: a run of blocks from this one on.
        tally.origin_bytes += sum(self._fetches.block_length(info, number)
                                  for number in range(block, block + len(started) - before))
        try:
            async with aclosing(self._pieces_as_they_land(in_flight, lo, hi, reader)) as landing:
                async for piece in landing:
                    lo += piece_length(piece)
                    yield piece, source
        except (Unslotted, ChecksumMismatch):
            # No slot to land in, its disk failed, or did not keep the bytes:
            # this reader's bytes come straight from the origin, uncached.
            self._bypass_disk_if_reads_fail()
            async with aclosing(self._bypass(info, block, lo, hi, tally)) as passing:
                async for passed in passing:
                    yield passed

    def _tally_how_found(
        self, tally: ReadTally, ident: BlockIdent, cached: bool, joined: bool
    ) -> None:
        """Tell the request's tally (the access log's `blocks`) how the block was found."""
        if cached:
            tally.add(ident.block, CACHED)
        elif joined:
            tally.add(ident.block, JOINED, self._fetches.on_their_way[ident].lane)
        else:
            tally.add(ident.block, FETCHED)

    async def _pieces_as_they_land(
        self, in_flight: InFlightBlock, lo: int, hi: int, reader: int | None = None,
    ) -> AsyncGenerator[Piece, None]:
        """Bytes [lo, hi) of an in-flight block, each chunk as soon as it lands."""
        self._attach(in_flight)
        try:
            while lo < hi:
                chunk = lo // self._chunk_size
                write = await in_flight.wait_for(chunk)
                upto = min(hi, (chunk + 1) * self._chunk_size)
                in_flight.read = True
                held = self._store.tier_slice(write.ident, write.generation, lo, upto,
                                              reader=reader)
                yield held or await self._store.read_landed(write, lo, upto, through=hi)
                lo = upto
        finally:
            self._detach(in_flight)

    def _bypass_disk_if_reads_fail(self) -> None:
        """After a failed read: a disk that keeps failing reads is bypassed, as one
        that fails a write is (until the disk watcher sees it well)."""
        problem = self._store.read_fault()
        if problem is not None and self._modes.disk_problem is None:
            self._modes.disk_failed(f"cache disk reads: {problem}")

    def _attach(self, in_flight: InFlightBlock) -> None:
        """A reader of the block: its slot stays its own (pinned) until the reader
        is done, whatever becomes of the fetch meanwhile."""
        in_flight.readers += 1
        if in_flight.write is not None:
            self._store.pin_write(in_flight.write)

    def _detach(self, in_flight: InFlightBlock) -> None:
        in_flight.readers -= 1
        if in_flight.write is not None:
            self._store.unpin_write(in_flight.write)

    async def _bypass(
        self, info: ObjectInfo, block: int, lo: int, hi: int, tally: ReadTally
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """The bytes straight from the origin, not cached, not shared (bypass mode,
        or a block that could not land in the cache)."""
        start = block_span(block, self._block_size, info.size)[0]
        async with aclosing(
            self._origin.read_range(info, start + lo, start + hi, FOREGROUND)
        ) as chunks:
            async for chunk in chunks:
                tally.origin_bytes += piece_length(chunk)
                yield chunk, Source.ORIGIN
