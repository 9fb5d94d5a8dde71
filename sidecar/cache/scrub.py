"""The scrub: the data of every recovered block verified in the background.

Reads are lazily verified anyway; the scrub finds damage before a client
meets it, with a bound on the disk bandwidth it takes from the foreground:
one block at a time, in slot order (the disk's), paced after each block.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sidecar.cache.disk_work import DiskWork
from sidecar.cache.ident import SlotRecord
from sidecar.cache.recovery import ScrubProgress
from sidecar.cache.residency import NAMELESS, Residency
from sidecar.cache.slab import Slab
from sidecar.cache.slot_reads import SlotReader

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")

# Slots the scrub passes over (marking the blocks to verify, or stepping past
# slots with none to verify) before it gives the event loop back: at a few
# tenths of a microsecond a slot, one pass over two million slots held the
# loop, and every request waiting on it, for most of a second.
SCRUB_BATCH_SLOTS = 4096


class Scrubber:
    def __init__(self, *, residency: Residency, reader: SlotReader, slab: Slab,
                 work: DiskWork) -> None:
        self._residency = residency
        self._slots = residency.slots
        self._reader = reader
        self._slab = slab
        self._work = work
        self.progress: ScrubProgress | None = None
        self._task: asyncio.Task[Any] | None = None
        # The rate asked for while the scan still ran: the scan starts it.
        self.pending_rate: int | None = None

    def start(self, rate: int) -> None:
        """Verify the data of every block cached as it starts (marked in the
        background, a batch of slots at a time), in slot order (the disk's), at
        most ``rate`` bytes per second, in the background until done or closed."""
        if rate <= 0:
            raise ValueError(f"scrub rate must be positive, got {rate}")
        if self._slots.closed or self.progress is not None:
            return
        if self._residency.scan_merge is not None:
            # Not every recovered block is indexed yet: the scan starts it.
            self.pending_rate = rate
            return
        # The blocks are counted as the scrub marks them, in the background.
        self.progress = ScrubProgress(rate=rate, blocks=0)
        self._work.start(self._scrub(self.progress))

    def stop(self) -> None:
        """Cancel the pacing, not a verification in flight: that one runs in a
        task of its own, which the store's close waits for like any read."""
        if self._task is not None:
            self._task.cancel()

    async def _mark(self, progress: ScrubProgress) -> bool:
        """Mark the slots holding a block now: the ones to verify (a block
        leaving clears its mark). False if the store closed meanwhile."""
        index, unscrubbed = self._residency.index, self._residency.unscrubbed
        for first in range(0, index.slot_count, SCRUB_BATCH_SLOTS):
            if self._slots.closed:
                return False
            for slot in range(first, min(index.slot_count, first + SCRUB_BATCH_SLOTS)):
                if index.holds(slot):
                    unscrubbed.add(slot)
            progress.blocks = len(unscrubbed)
            await asyncio.sleep(0)
        return True

    async def _scrub(self, progress: ScrubProgress) -> None:
        self._task = asyncio.current_task()
        if not await self._mark(progress):
            return
        index, unscrubbed, loop = self._residency.index, self._residency.unscrubbed, self._work.loop
        due = loop.time()
        for slot in range(index.slot_count):
            if slot % SCRUB_BATCH_SLOTS == 0:
                await asyncio.sleep(0)
            if self._slots.closed:
                return
            if slot not in unscrubbed:
                continue
            unscrubbed.discard(slot)
            # The slot still holds the block recovered into it (a block leaving
            # clears its bit): verify it by slot, its name is on disk only.
            record = SlotRecord(NAMELESS, slot, index.length(slot), index.generation(slot),
                                index.checksums_of(slot))
            self._slots.pin(slot)
            try:
                intact = await self._work.shielded(self._scrub_pinned(record))
            except Exception as exc:  # the scrub is advice; reads still verify
                log.warning("cache scrub stopped at slot %d: %s", record.slot, exc)
                return
            if intact:
                progress.verified += 1
                progress.verified_bytes += record.length
            else:
                progress.dropped += 1
            self._count_gone(progress)
            # Blocks start at least length/rate seconds apart: never more than
            # `rate` on average, and time lost in a slow read is not made up
            # for with a burst.
            due = max(due + record.length / progress.rate, loop.time())
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        self._count_gone(progress)
        progress.done = True
        log.info("cache scrub done: %d blocks verified, %d dropped, %d gone before their turn",
                 progress.verified, progress.dropped, progress.skipped)

    def _count_gone(self, progress: ScrubProgress) -> None:
        """Blocks that left the cache before their turn (evicted, invalidated,
        dropped by a read that failed them): a block leaving clears its bit,
        so they are the ones neither verified, dropped nor still to come."""
        progress.skipped = (progress.blocks - progress.verified - progress.dropped
                            - len(self._residency.unscrubbed))

    async def _scrub_pinned(self, record: SlotRecord) -> bool:
        try:
            intact = await self._reader.verified(self._slab_intact, record, 0, record.length)
        finally:
            self._slots.unpin(record.slot)
        if record.slot not in self._slots.pins:
            # Read for the check only: out of the page cache again, unless a
            # client is reading the block right now.
            self._residency.drop_pages(record.slot)
        return intact is not None

    def _slab_intact(self, slot: int, start: int, end: int, record: SlotRecord) -> bool:
        self._slab.verify(slot, start, end, record)
        return True
