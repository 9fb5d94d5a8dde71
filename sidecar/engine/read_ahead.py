"""Read-ahead: the planner decides, the engine fetches.

The read-ahead planner (sidecar.prefetch.planner) hears where a request starts
and, after each piece, what was delivered; it answers with blocks to fetch
ahead, which are started here on the `prefetch` lane through the one in-flight
table, and, at the end of a segment, with the partition's next segment to
look up and read the first blocks of.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sidecar.cache import BlockIdent
from sidecar.engine.background import BackgroundTasks
from sidecar.engine.fetches import Fetches
from sidecar.engine.origin_reader import OriginReader
from sidecar.in_flight import InFlightBlock
from sidecar.isolation.modes import ModeState
from sidecar.model import PREFETCH, ObjectInfo
from sidecar.prefetch.planner import NextSegment, ReadAheadPlanner
from sidecar.prefetch.streams import Stream
from sidecar.telemetry.metrics import Metrics

# The engine's log lines keep the one logger name, whichever of its rooms writes them.
log = logging.getLogger("sidecar.engine")


class ReadAhead:
    def __init__(
        self, planner: ReadAheadPlanner, origin: OriginReader, metrics: Metrics,
        fetches: Fetches, tasks: BackgroundTasks, modes: ModeState,
    ) -> None:
        self._planner = planner
        self._modes = modes
        self._origin = origin
        self._metrics = metrics
        self._fetches = fetches
        self._tasks = tasks

    @property
    def blocks_in_flight(self) -> int:
        return self._planner.blocks_in_flight

    @property
    def pending_blocks(self) -> int:
        return self._planner.pending_blocks

    def on_request(self, info: ObjectInfo, start: int) -> Stream | None:
        """A request starts at `start`: the read stream it continues, if any,
        which reads ahead at once."""
        stream = self._planner.on_request(info, start)
        if stream is not None:
            self.on_delivered(stream, info, start)
        return stream

    def on_delivered(self, stream: Stream, info: ObjectInfo, position: int) -> None:
        """The client took the bytes up to `position`: fetch what the planner asks."""
        plan = self._planner.on_delivered(stream, info, position)
        self._fetch_ahead(stream, info, plan.blocks)
        if plan.next_segment is not None:
            self._tasks.spawn(self._into_next_segment(plan.next_segment))

    def on_block_read(self, ident: BlockIdent) -> None:
        """A reader came to the block: read-ahead of it, if any, was used."""
        if self._planner.on_block_read(ident):
            self._metrics.prefetch_blocks.labels("used").inc()

    def _fetch_ahead(self, stream: Stream, info: ObjectInfo, blocks: Iterable[int]) -> None:
        if not self._modes.read_ahead:
            # Asked here, not only when the plan was made: the next segment's
            # look-up awaits the origin, and the operator may have turned
            # read-ahead off (or paused downloads) meanwhile.
            return
        for block in blocks:
            ident = BlockIdent(info.bucket, info.key, info.etag, block)
            if self._fetches.present(ident):
                continue
            if not self._fetches.background_fits(self._fetches.block_length(info, block)):
                return  # readers' blocks fill max_buffered: asked again at the next delivery
            if not self._planner.admit(ident, stream):
                return  # over a bound: the stream asks again at its next delivery
            self._metrics.prefetch_blocks.labels("issued").inc()
            self._tasks.spawn(self._prefetch(info, self._fetches.enter(info, block, PREFETCH)))

    async def _prefetch(self, info: ObjectInfo, in_flight: InFlightBlock) -> None:
        cached = False
        try:
            cached = await self._fetches.fetch_run(info, [in_flight], PREFETCH)
        except Exception:  # logged by fetch_run; read-ahead is best effort
            pass
        finally:
            self._planner.finished(in_flight.ident, cached)

    async def _into_next_segment(self, wanted: NextSegment) -> None:
        """Look up the partition's next segment and read its first blocks ahead."""
        bucket = wanted.after.bucket
        try:
            next_key = wanted.known
            if next_key is None:
                # Keys after the segment being read: its successor is among the first.
                # A listing that fails holds the next one off a while (the
                # planner's NO_SUCCESSOR_S): an origin that cannot list is not
                # asked again at every delivery.
                keys = await self._origin.list_keys(bucket, wanted.partition_prefix,
                                                    start_after=wanted.after.key)
                next_key = self._planner.next_key(wanted, keys)
            if next_key is None:
                return
            try:
                next_info = await self._origin.head(bucket, next_key)
            except Exception:
                self._planner.forget(wanted)  # gone, or unreachable: listed afresh next time
                raise
        except Exception as exc:  # read-ahead is best effort; the reader will ask itself
            log.info("no cross-segment prefetch after s3://%s/%s: %s",
                     bucket, wanted.after.key, exc)
            return
        self._fetch_ahead(wanted.stream, next_info,
                          self._planner.continue_into(wanted, next_info))
