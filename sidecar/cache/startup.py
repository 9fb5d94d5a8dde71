"""Where the store starts from: the index snapshot of a clean stop, or an
empty index that the background scan of the slot headers fills
(``sidecar.cache.scan``), and the recovery report that says which.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging

from sidecar.cache import snapshot
from sidecar.cache.index import SlotIndex
from sidecar.cache.recovery import RecoveredIndex, RecoveryReport, ScanMerge, free_stack
from sidecar.cache.slab import Slab
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.cache.slot_format import SLOT_HEADER_SIZE, chunk_size_for

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")

# Memory for verified chunks kept for the next reader (sidecar.cache.recent).
RECENT_CHUNK_BYTES = 64 * 1024 * 1024
# Read buffers kept past what the recent-chunk memory holds: reads in flight
# and pieces being sent.
SPARE_READ_BUFFERS = 32


def read_buffers_for(recent_chunk_bytes: int, block_size: int) -> int:
    """How many read buffers the slab keeps for reuse: one per chunk the
    recent-chunk memory holds, and SPARE_READ_BUFFERS more."""
    return recent_chunk_bytes // chunk_size_for(block_size) + SPARE_READ_BUFFERS


def slots_for_capacity(capacity_bytes: int, block_size: int) -> int:
    """Slots that fit ``capacity_bytes``, counting each slot's 4 KiB header."""
    slot_count = capacity_bytes // (block_size + SLOT_HEADER_SIZE)
    if slot_count < 1:
        raise ValueError(
            f"cache capacity of {capacity_bytes} bytes cannot hold one block of "
            f"{block_size} bytes plus its {SLOT_HEADER_SIZE}-byte slot header"
        )
    return slot_count


async def recover_index(
    slab: Slab, executor: concurrent.futures.Executor, loop: asyncio.AbstractEventLoop,
) -> tuple[RecoveredIndex, ScanMerge | None]:
    """The index to start from, and the merge of the scan that is to fill it
    (None: nothing to scan). Closes the slab if it fails."""
    try:
        recovered = await _take_snapshot(slab, executor, loop)
        if recovered is not None:
            return recovered, None
        # Before any write: every generation of this start must outrank
        # those on disk the scan has yet to find (slot_format.py, "Generations").
        await loop.run_in_executor(executor, slab.advance_epoch)
        recovered = empty_index(slab, first_free=slab.opening.kept_slots,
                                next_generation=slab.first_generation())
    except BaseException:
        await loop.run_in_executor(executor, slab.close)
        raise
    if not slab.opening.kept_slots:
        return recovered, None
    return recovered, ScanMerge(recovered.index, recovered.policy, recovered.next_generation)


def report_for(slab: Slab, recovered: RecoveredIndex, merge: ScanMerge | None
               ) -> RecoveryReport:
    """The recovery report as the store opens (the scan, if any, updates it)."""
    opening = slab.opening
    if opening.damaged:
        log.warning("cache file %s: %s", slab.path, opening.reason)
    elif opening.reason is not None:
        log.info("cache file %s: %s", slab.path, opening.reason)
    return RecoveryReport(
        file=opening.state,
        reason=opening.reason,
        slots=slab.slot_count,
        slots_scanned=0 if merge is not None else opening.kept_slots,
        blocks_recovered=len(recovered.index),
        bytes_recovered=recovered.used_bytes,
        corrupt_headers=0,
        duplicates=0,
        next_generation=recovered.next_generation,
        seconds=0.0,
        index="snapshot" if recovered.from_snapshot else "scan",
        scanning=merge is not None,
        slots_to_scan=0 if merge is None else opening.kept_slots,
        scan_seconds=None if merge is not None else 0.0,
        epoch=slab.epoch,
    )


def log_recovery(report: RecoveryReport) -> None:
    if report.dropped:
        log.warning(
            "cache recovery dropped %d slot headers: %d corrupt, %d older duplicates",
            report.dropped, report.corrupt_headers, report.duplicates,
        )
    log.info(
        "cache recovery: %s file, index from the %s, %d of %d slots kept, %d blocks "
        "(%d bytes) recovered, %d corrupt headers and %d duplicates dropped, ready in "
        "%.3f s, scanned in %.3f s",
        report.file, report.index, report.slots_scanned, report.slots,
        report.blocks_recovered, report.bytes_recovered, report.corrupt_headers,
        report.duplicates, report.seconds, report.scan_seconds or 0.0,
    )


async def _take_snapshot(
    slab: Slab, executor: concurrent.futures.Executor, loop: asyncio.AbstractEventLoop,
) -> RecoveredIndex | None:
    """The index snapshot of the last clean stop if there is a good one (read
    in the executor); None: the slot headers must be scanned.

    One scan job at a time, not several in parallel: ``Slab.scan`` already
    keeps a batch of header reads in flight, and decoding holds the GIL, so
    more threads only contend for it (``python -m bench.recovery``).
    """
    taken = await loop.run_in_executor(
        executor, functools.partial(
            snapshot.take, slab.path.parent, slab.path, slab.slot_count, slab.block_size,
            slab.chunk_size, usable=slab.opening.state == "reused"))
    if taken.reason is not None:
        log.warning("cache file %s: %s", slab.path, taken.reason)
    if taken.restored is None:
        return None
    return RecoveredIndex(
        index=taken.restored.index, policy=taken.restored.policy,
        free=taken.restored.free, next_generation=taken.restored.next_generation,
        from_snapshot=True)


def empty_index(slab: Slab, first_free: int = 0, next_generation: int = 1) -> RecoveredIndex:
    """An empty index; the slots below ``first_free`` are not free (yet): the
    scan frees those it finds empty."""
    index = SlotIndex(slab.slot_count, slab.block_size, slab.chunk_size)
    return RecoveredIndex(index=index, policy=SlotFifo(slab.slot_count, index.fingerprint_of),
                          free=free_stack(index, first_free), next_generation=next_generation)
