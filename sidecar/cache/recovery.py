"""Rebuilding the cache index from the slot headers at start (warm restart
after a crash; after a clean stop the index snapshot is taken over instead,
see ``sidecar.cache.snapshot``).

The slab's slot headers are the index: each names its block (bucket, key,
ETag, block number), its length, the write generation and the checksums of its
data, under a checksum of its own (format and crash analysis in ``slab.py``).
Recovery reads every header once, keeps the valid ones and drops the rest:

- a header that claims a block but fails a check (magic, version, lengths,
  its checksum, UTF-8) is corrupt: dropped, counted, and erased on disk so the
  next start does not count it again;
- two valid headers naming the same block can be left by a crash between
  writing a replacement and clearing the old slot's flag; the higher
  generation is the later write and wins, the other slot is erased and freed
  (erased, so that a later purge of the winner cannot bring the loser back);
- the data is not read: every read verifies the chunks it touches, so a block
  whose data was torn by the crash becomes a miss and a refetch, never bytes.

This module is the pure half: what the headers found mean for the index
(``SlotIndex``, the eviction queue, free slots), built in flat arrays.
``BlockStore.open`` does the reading (``Slab.scan`` in the executor).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from sidecar.cache.index import HASH_BYTES, NO_BLOCK, SlotIndex
from sidecar.cache.slab import SlotScan
from sidecar.cache.slot_fifo import SlotFifo


@dataclass(frozen=True)
class RecoveryReport:
    """What opening the cache found and kept (``cache.recovery`` in /api/v1/stats)."""

    file: str  # Opening.state of slab.py: created, reused, resized, truncated, recreated
    reason: str | None  # why slots were dropped or the file changed; None if it was not
    slots: int  # slots of the cache
    slots_scanned: int  # headers read (the slots kept from the file)
    blocks_recovered: int
    bytes_recovered: int
    corrupt_headers: int  # dropped: claimed a block, failed a check
    duplicates: int  # dropped: an older copy of a block recovered from another slot
    next_generation: int  # where the write counter resumes
    seconds: float
    # "snapshot": the index saved at the last clean stop was taken over (no
    # header read); "scan": every kept slot header was read.
    index: str = "scan"

    @property
    def recreated(self) -> bool:
        return self.file == "recreated"

    @property
    def dropped(self) -> int:
        """Blocks the headers described that recovery threw away."""
        return self.corrupt_headers + self.duplicates

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "recreated": self.recreated,
            "reason": self.reason,
            "slots": self.slots,
            "slots_scanned": self.slots_scanned,
            "blocks_recovered": self.blocks_recovered,
            "bytes_recovered": self.bytes_recovered,
            "corrupt_headers": self.corrupt_headers,
            "duplicates": self.duplicates,
            "dropped": self.dropped,
            "index": self.index,
            "seconds": round(self.seconds, 6),
        }


@dataclass
class ScrubProgress:
    """The background scrub of the recovered blocks (``cache.recovery.scrub``).

    The scrub reads each recovered block once, at most ``rate`` bytes per
    second, and drops the ones whose data no longer matches their checksums
    (counted as checksum failures, like a failed read), so that damage is
    found before a client asks, without a burst of disk reads at start.
    """

    rate: int  # bytes per second
    blocks: int  # recovered blocks to verify
    verified: int = 0
    verified_bytes: int = 0
    dropped: int = 0  # failed their checksums
    skipped: int = 0  # evicted, replaced or read (and so verified) before their turn
    done: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate, "blocks": self.blocks, "verified": self.verified,
            "verified_bytes": self.verified_bytes, "dropped": self.dropped,
            "skipped": self.skipped, "done": self.done,
        }


@dataclass(frozen=True)
class RecoveredIndex:
    """The index to start from: what the store adopts in place of an empty one.

    Built whole in the executor, so that the store only has to take it over.
    """

    index: SlotIndex
    policy: SlotFifo  # holding the slots, oldest first in line
    free: array[int]  # free slots, as a stack (the last one is used first)
    erase: list[int]  # slots whose header must be erased on disk before reuse
    corrupt_headers: int
    duplicates: int
    next_generation: int  # larger than every generation on disk
    from_snapshot: bool = False

    @property
    def used_bytes(self) -> int:
        return self.index.used_bytes


def free_stack(index: SlotIndex) -> array[int]:
    """The slots that hold no block, as a stack handing out the lowest first
    (as a new store does)."""
    lengths = index.lengths
    return array("i", (slot for slot in range(index.slot_count - 1, -1, -1)
                       if lengths[slot] == NO_BLOCK))


def rebuild_index(
    slot_count: int, block_size: int, chunk_size: int, scan: SlotScan,
) -> RecoveredIndex:
    """The index the valid headers describe, duplicates resolved by generation."""
    index = SlotIndex(slot_count, block_size, chunk_size)
    # Per slot while rebuilding only: the generation (duplicates, order) and
    # whether the block skips probation.
    generations = array("Q", [0]) * slot_count
    main = bytearray(slot_count)
    chunks = index.chunks_per_block
    losers: list[int] = []
    top = 0
    hashes, slots, lengths = scan.hashes, scan.slots, scan.lengths
    for entry in range(len(scan)):
        slot, generation = slots[entry], scan.generations[entry]
        top = max(top, generation)
        digest = bytes(hashes[HASH_BYTES * entry:HASH_BYTES * (entry + 1)])
        held = index.find(digest)
        if held >= 0:
            # Equal generations cannot come from one slab's counter; the slot
            # number only makes the choice deterministic if a disk invents one.
            if (generation, slot) < (generations[held], held):
                losers.append(slot)
                continue
            index.remove(held)
            losers.append(held)
        length = lengths[entry]
        first = chunks * entry
        index.add(slot, digest, length, generation,
                  scan.checksums[first:first - (-length // chunk_size)])
        generations[slot] = generation
        main[slot] = scan.main[entry]
    erase = sorted(set(scan.corrupt)) + sorted(losers)
    # Oldest generation first: recovered blocks queue for eviction in the order
    # they were written, as they would have without the restart. One list of
    # ints (generation and slot packed), not a tuple per block.
    order = [generations[slot] << 32 | slot for slot in range(slot_count)
             if index.holds(slot)]
    order.sort()
    policy = SlotFifo(slot_count, index.fingerprint_of)
    policy.adopt((packed & 0xFFFFFFFF for packed in order), lambda slot: bool(main[slot]))
    return RecoveredIndex(
        index=index,
        policy=policy,
        free=free_stack(index),
        erase=erase,
        corrupt_headers=len(set(scan.corrupt)),
        duplicates=len(losers),
        next_generation=top + 1,
    )
