"""The background scan of the slot headers after a crash.

The store serves while it scans: ``BlockStore.open`` returns once the slab is
open, and the headers are read in the executor in batches, each merged into
the index on the event loop (``sidecar.cache.recovery.ScanMerge``) while the
next one is read. A slot the scan has not reached is neither indexed nor free
(``sidecar.cache.slot_states``). A stop during the scan cancels it at once and
saves no index snapshot: the next start scans again and loses nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

from sidecar.cache.disk_work import DiskWork
from sidecar.cache.ident import BlockIdent
from sidecar.cache.outcomes import REASON_INVALIDATED, REASON_RECOVERY, CacheMetrics
from sidecar.cache.recovery import RecoveryReport, ScanMerge
from sidecar.cache.residency import Residency
from sidecar.cache.scrub import Scrubber
from sidecar.cache.slab import Slab
from sidecar.cache.slot_format import SlotScan
from sidecar.cache.startup import log_recovery

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")

# Slot headers the background scan reads per batch: a batch's merge into the
# index runs on the event loop, a few milliseconds for this many.
SCAN_BATCH_SLOTS = 1024
# Slot headers past the batch being read that the disk is asked for: reads in
# flight while the loop merges, and for a disk that serves many at once.
SCAN_AHEAD_SLOTS = 8192

Pause = Callable[[int], Awaitable[None]]


class BackgroundScan:
    def __init__(self, *, residency: Residency, slab: Slab, work: DiskWork,
                 metrics: CacheMetrics, report: RecoveryReport | None,
                 scrubber: Scrubber) -> None:
        self._residency = residency
        self._slots = residency.slots
        self._slab = slab
        self._work = work
        self._metrics = metrics
        self._report = report
        self._scrubber = scrubber
        self._task: asyncio.Task[Any] | None = None

    def start(self, stop: int, batch: int, pause: Pause | None, started: float,
              admit: bool) -> None:
        """Scan slots ``0..stop-1`` in the background, ``batch`` at a time."""
        self._task = self._work.loop.create_task(self._scan(stop, batch, pause, started, admit))

    async def stop(self) -> None:
        """Cancel the scan; a batch being read is the store's disk work, which
        close waits for."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])

    def log_unsaved(self) -> None:
        """Why close saves no index snapshot while the scan runs."""
        merge = self._residency.scan_merge
        assert merge is not None
        # The index lacks the slots not scanned: a snapshot of it would lose
        # their blocks. The next start scans again instead.
        log.info("cache index snapshot not saved: the scan had read %d of %d slot "
                 "headers", merge.slots_scanned,
                 self._report.slots_to_scan if self._report else 0)

    async def _scan(self, stop: int, batch: int, pause: Pause | None, started: float,
                    admit: bool) -> None:
        """Read the slot headers of slots ``0..stop-1`` in batches in the
        executor and merge each into the index here, on the loop, while the
        next batch is read."""
        merge, report = self._residency.scan_merge, self._report
        assert merge is not None and report is not None
        try:
            if await self._scan_batches(merge, report, stop, batch, pause, admit):
                report.scanning = False
                report.scan_seconds = time.perf_counter() - started
                self._residency.scan_merge = None  # gives its per-slot array back
                log_recovery(report)
                rate = self._scrubber.pending_rate
                if rate is not None and not self._slots.closed:
                    self._scrubber.start(rate)
        finally:
            self._residency.scanned.set()

    async def _scan_batches(self, merge: ScanMerge, report: RecoveryReport, stop: int,
                            batch: int, pause: Pause | None, admit: bool) -> bool:
        """Whether every batch was read and merged."""
        admit_to_main = self._residency.admit_to_main if admit else None
        try:
            first, advised = 0, 0
            while True:
                # Each batch asks the disk for the next one's headers before it
                # returns: the kernel reads them while this batch is merged.
                # The read itself waits for the merge: a thread decoding
                # headers while the loop merges takes the GIL from it every
                # few milliseconds (at 2M slots the loop then stalled up to
                # 96 ms, 13 ms this way, for the same scan time).
                last = min(stop, first + batch)
                found = await asyncio.shield(self._read_batch(first, last, admit_to_main,
                                                              advised))
                if self._slots.closed:
                    return False
                self._merge_batch(merge, report, found, last - first)
                if last >= stop:
                    return True
                if pause is not None:
                    await pause(merge.slots_scanned)
                # The call before hinted SCAN_AHEAD_SLOTS past its end.
                first, advised = last, SCAN_AHEAD_SLOTS
        except asyncio.CancelledError:
            log.info("cache scan stopped at %d of %d slot headers", merge.slots_scanned, stop)
            raise
        except Exception as exc:
            # The slots not scanned stay out of use (neither free nor indexed)
            # until the next start scans them again; the cache works with the rest.
            if isinstance(exc, OSError):
                self._metrics.on_disk_error("read")
            log.warning("cache scan stopped at %d of %d slot headers: %s",
                        merge.slots_scanned, stop, exc)
            return False

    def _read_batch(
        self, first: int, stop: int,
        admit_to_main: Callable[[BlockIdent], bool] | None, advised: int,
    ) -> asyncio.Task[SlotScan]:
        # Its own task (the store's disk work): close waits for a batch being
        # read before it closes the slab, even when the scan itself was cancelled.
        return self._work.start(self._work.run(functools.partial(
            self._slab.scan, first, stop, self._residency.index.identity_key, admit_to_main,
            advised=advised, ahead=SCAN_AHEAD_SLOTS)))

    def _merge_batch(self, merge: ScanMerge, report: RecoveryReport, found: SlotScan,
                     slots: int) -> None:
        merged = merge.merge(found, slots, self._drop_older_copy)
        # Pushed highest first: the stack hands out the lowest slot first.
        self._slots.free.extend(array("i", reversed(merged.free)))
        for _ in merged.erase:
            self._metrics.on_eviction(REASON_RECOVERY)
        if found.unreadable:
            for _ in found.unreadable:
                self._metrics.on_disk_error("read")
            log.warning("cache scan: the disk failed to read %d slot headers (slots %s): "
                        "those slots stay out of use until a start scans the headers again",
                        len(found.unreadable), _listed(found.unreadable))
        for _ in merged.purged:
            self._metrics.on_eviction(REASON_INVALIDATED)
        if merged.erase or merged.purged:
            self._work.start(self._erase_then_free(merged.erase + merged.purged))
        report.slots_scanned = merge.slots_scanned
        report.blocks_recovered = merge.blocks_recovered
        report.bytes_recovered = merge.bytes_recovered
        report.corrupt_headers = merge.corrupt_headers
        report.duplicates = merge.duplicates

    def _drop_older_copy(self, slot: int) -> None:
        """A block recovered earlier in the scan has a newer copy on disk."""
        self._residency.drop(slot, REASON_RECOVERY)

    async def _erase_then_free(self, slots: list[int]) -> None:
        # Out of the free list until erased, so that the erasure never lands
        # on a newer block's header.
        try:
            await self._work.run(_erase_all, self._slab, slots)
        except Exception as exc:  # the next write of each slot clears its flag anyway
            if isinstance(exc, OSError):
                self._metrics.on_disk_error("write")
            log.warning("could not erase %d dropped cache slot headers: %s", len(slots), exc)
        if not self._slots.closed:
            self._slots.free.extend(array("i", reversed(slots)))


def _listed(slots: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, slots[:most]))
    return shown + (f" and {len(slots) - most} more" if len(slots) > most else "")


def _erase_all(slab: Slab, slots: list[int]) -> None:
    for slot in slots:
        slab.erase_header(slot)
