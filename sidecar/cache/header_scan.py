"""The slot headers read back from the slab file, for recovery after a crash.

The store scans them in batches, in the background while it already serves
(``sidecar.cache.scan``): one 4 KiB header read per slot, the batch's headers
asked of the disk first (``POSIX_FADV_WILLNEED``, one hint per header: they lie
a block apart, and a hint over the batch's range would read the blocks' data
too). Zeros and clear flags are empty slots, valid headers come back as cached
blocks into flat arrays (``SlotScan``), anything else that claims a block is
corrupt. A header the disk fails to read (EIO) leaves its slot out of use
(``SlotScan.unreadable``); only a run of such failures stops the scan. Data
pages are never read here.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable

from sidecar.cache.ident import BlockIdent
from sidecar.cache.index import block_hash, object_hash
from sidecar.cache.slot_format import (
    SLOT_HEADER_SIZE,
    ZEROS_8,
    HeaderState,
    SlotScan,
    chunk_size_for,
    parse_slot_header,
    slot_offset,
)

SCAN_BATCH = 1024  # slot headers asked of the disk at once
# Header reads the disk may fail in one call before the disk counts as failing
# and the call raises (the scan stops; the slots not scanned stay out of use).
MAX_UNREADABLE_HEADERS = 16


def scan_headers(
    fd: int, slot_count: int, block_size: int, first: int, stop: int, identity_key: bytes,
    admit_to_main: Callable[[BlockIdent], bool] | None = None,
    *, advised: int = 0, ahead: int = 0,
) -> SlotScan:
    """The slot headers of slots ``first..stop-1`` of the slab file open as
    ``fd`` with ``slot_count`` slots of ``block_size`` bytes. Blocking.

    A scan in batches keeps the disk reading ahead of it: ``ahead`` slots
    after ``stop`` are hinted too, and the caller says how many slots from
    ``first`` on an earlier call already hinted (``advised``), so that
    each header is hinted once.

    One ``pread`` of a header page per slot rather than the mapping: a read
    releases the GIL while the disk works, so a few threads scanning
    disjoint runs keep the disk busy, and no page fault stalls a thread
    that holds the GIL. Data pages are never read here.
    ``admit_to_main`` marks the blocks the policy keeps out of probation;
    identities are hashed with ``identity_key``, the index's
    (``sidecar.cache.index``, "Identity hash").
    """
    if not 0 <= first <= stop <= slot_count:
        raise IndexError(f"slots {first}..{stop} outside 0..{slot_count}")
    found = SlotScan(array("I"), array("Q"), array("I"), bytearray(), array("Q"),
                     bytearray(), [])
    pread, stride = os.pread, SLOT_HEADER_SIZE + block_size
    chunk_size = chunk_size_for(block_size)
    chunks = -(-block_size // chunk_size)
    padding = [array("Q", [0]) * n for n in range(chunks + 1)]
    # Blocks of one object sit in neighbouring slots more often than not
    # (an object is written front to back): its half of the identity hash
    # is computed once for the run.
    last_bucket, last_key, last_object = b"", b"", b""
    hinted = min(slot_count, first + advised)
    for batch in range(first, stop, SCAN_BATCH):
        # Ask for the next batch (and ``ahead``) before decoding this one:
        # the kernel reads those pages while this thread hashes, many reads
        # in flight at once.
        wanted = min(slot_count, min(stop, batch + 2 * SCAN_BATCH) + ahead)
        if wanted > hinted:
            _advise_headers(fd, block_size, hinted, wanted)
            hinted = wanted
        offset = slot_offset(batch, block_size)
        for slot in range(batch, min(stop, batch + SCAN_BATCH)):
            try:
                header = pread(fd, SLOT_HEADER_SIZE, offset)
            except OSError:
                # One bad sector costs its slot, not the batch (nor every
                # slot after it, at every start): the slot is left out of use.
                found.unreadable.append(slot)
                if len(found.unreadable) >= MAX_UNREADABLE_HEADERS:
                    raise
                offset += stride
                continue
            offset += stride
            if header[:8] == ZEROS_8:  # the common empty slot, without decoding
                found.empty.append(slot)
                continue
            parsed = parse_slot_header(header, block_size, chunk_size)
            if parsed is HeaderState.CORRUPT:
                found.corrupt.append(slot)
                continue
            if isinstance(parsed, HeaderState):
                found.empty.append(slot)
                continue
            length, block, generation, count, bucket, key, etag, names_end = parsed
            if key != last_key or bucket != last_bucket:
                last_bucket, last_key = bucket, key
                last_object = object_hash(bucket, key, identity_key)
            found.slots.append(slot)
            found.generations.append(generation)
            found.lengths.append(length)
            found.hashes.extend(block_hash(last_object, etag, block, identity_key))
            found.checksums.frombytes(header[names_end:names_end + 8 * count])
            found.checksums.extend(padding[chunks - count])
            found.main.append(admit_to_main is not None and admit_to_main(BlockIdent(
                bucket.decode(), key.decode(), etag.decode(), block)))
    return found


def _advise_headers(fd: int, block_size: int, first: int, stop: int) -> None:
    """Start reading the header pages of slots ``first..stop-1`` (readahead(2)
    style, without waiting): one pread after another would wait for each."""
    stride = SLOT_HEADER_SIZE + block_size
    offset = slot_offset(first, block_size) if first < stop else 0
    for _ in range(first, stop):
        os.posix_fadvise(fd, offset, SLOT_HEADER_SIZE, os.POSIX_FADV_WILLNEED)
        offset += stride
