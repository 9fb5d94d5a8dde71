"""Where each slot stands: free, being written, pinned by readers, retiring.

A slot is in exactly one of these states:

    free       in ``free``, ready for a write
    writing    in ``writing``: a write is copying into it in the executor
    live       holds a block in the index (``SlotIndex``) and the policy
    retiring   its block was dropped, but readers still pin it or its on-disk
               valid flag is being cleared; free afterwards

and, while the background scan after a crash has not reached it, a sixth,
*unscanned*: neither live nor free, so nothing reads or writes it until its
header has been read (``sidecar.cache.scan``).

Readers pin the slot of the record they read. Only live, unpinned slots are
ever chosen as eviction victims, and a dropped slot goes back to ``free`` only
once nobody pins it, so a write never overwrites bytes that a reader is
copying out. The state is only ever changed on the event loop thread, which is
what serializes the slab's callers.
"""

from __future__ import annotations

import asyncio
import logging
from array import array

from sidecar.cache.disk_work import DiskWork
from sidecar.cache.ident import BlockIdent
from sidecar.cache.outcomes import CacheMetrics
from sidecar.cache.slab import Slab

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")


class SlotStates:
    def __init__(self, free: array[int], slab: Slab, work: DiskWork,
                 metrics: CacheMetrics) -> None:
        # A stack: the most recently freed slot is reused first, while its pages
        # may still be in the page cache.
        self.free = free
        self.pins: dict[int, int] = {}
        self.writing: dict[int, BlockIdent] = {}
        self._cancelled: set[int] = set()  # writing slots whose object was invalidated
        self.landed = asyncio.Event()  # set (and replaced) each time a write ends
        self._retiring: dict[int, bool] = {}  # slot -> clear the on-disk valid flag first
        self._slab = slab
        self._work = work
        self._metrics = metrics
        self.closed = False

    def pin(self, slot: int) -> None:
        self.pins[slot] = self.pins.get(slot, 0) + 1

    def unpin(self, slot: int) -> None:
        count = self.pins[slot] - 1
        if count:
            self.pins[slot] = count
            return
        del self.pins[slot]
        self._recycle_if_idle(slot)

    def end_write(self, slot: int) -> bool:
        """The write into ``slot`` is over; whether its object was invalidated
        meanwhile (then its block must not be cached)."""
        self.writing.pop(slot)
        # Wakes the writes waiting for a victim in probation (Residency.reserve_slot);
        # the record, if any, is inserted before they run again.
        self.landed.set()
        self.landed = asyncio.Event()
        if slot in self._cancelled:
            self._cancelled.discard(slot)
            return True
        return False

    def cancel_writes_of(self, bucket: str, key: str) -> None:
        """A write still copying would otherwise bring the object back."""
        for slot, ident in self.writing.items():
            if (ident.bucket, ident.key) == (bucket, key):
                self._cancelled.add(slot)

    def retire(self, slot: int, *, clear_on_disk: bool) -> None:
        self._retiring[slot] = clear_on_disk or self._retiring.get(slot, False)
        self._recycle_if_idle(slot)

    def _recycle_if_idle(self, slot: int) -> None:
        if slot in self.pins or self.closed:
            return
        clear_on_disk = self._retiring.pop(slot, None)
        if clear_on_disk is None:
            return
        if clear_on_disk:
            self._work.start(self._clear_then_free(slot))
        else:
            self.free.append(slot)

    async def _clear_then_free(self, slot: int) -> None:
        # The slot stays out of the free list until the flag is cleared, so this
        # 2-byte write can never land on top of a newer block's header.
        try:
            await self._work.run(self._slab.invalidate, slot)
        except Exception as exc:  # the next write clears the flag anyway
            if isinstance(exc, OSError):
                self._metrics.on_disk_error("write")
            log.warning("could not clear the valid flag of cache slot %d: %s", slot, exc)
        if not self.closed:
            self.free.append(slot)
