"""Rebuilding the cache index from the slot headers at start (warm restart
after a crash; after a clean stop the index snapshot is taken over instead,
see ``sidecar.cache.snapshot``).

The slab's slot headers are the index: each names its block (bucket, key,
ETag, block number), its length, the write generation and the checksums of its
data, under a checksum of its own (format and crash analysis in ``slot_format.py``).
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

Serving while the scan runs
===========================

The store serves as soon as the slab is open; the scan reads the headers in
batches in the executor and ``ScanMerge`` merges each batch into the live
index on the event loop. Until the scan reaches a slot, the slot is neither
indexed nor free: a read of its block is a miss (the origin serves it), and a
write takes a slot the scan already found empty or freed, or none at all (the
block is served uncached, like any write that finds no slot).

The same block can then be met twice: written since the start (a miss that
was fetched again) and found on disk by the scan. Both copies hold the same
bytes (same bucket, key, ETag and block number), so either is right; the one
written since the start wins, being the one the eviction policy already
tracks, and the scanned slot is erased and freed. That is also what the
generations say, whatever the scan has seen so far: the start that scans
first moves the slab to a new epoch, and every generation given out in it is
above every generation on disk (``slot_format.py``, "Generations"). The merge
compares full generations throughout, so one rule covers a scanned copy
against a block written since the start and against another scanned copy.

The index keeps only the low 32 bits of a generation (``sidecar.cache.index``);
while the scan runs, ``ScanMerge`` keeps the high 32 bits of each indexed
slot's (4 bytes a slot, given back when the scan ends) to compare full ones.

This module is the pure half: what the headers found mean for the index
(``SlotIndex``, the eviction queue, free slots), with no I/O.
``BlockStore.open`` does the reading (``Slab.scan`` in the executor).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.cache.index import HASH_BYTES, NO_BLOCK, TAG_BYTES, SlotIndex
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.cache.slot_format import SlotScan


@dataclass
class RecoveryReport:
    """What opening the cache found and kept (``cache.recovery`` in /api/v1/stats).

    After a crash the counts grow while the scan runs (``scanning``), and are
    final once it is done."""

    file: str  # Opening.state of slab_file.py: created, reused, resized, truncated, recreated
    reason: str | None  # why slots were dropped or the file changed; None if it was not
    slots: int  # slots of the cache
    slots_scanned: int  # headers read so far (all the slots kept from the file once done)
    blocks_recovered: int
    bytes_recovered: int
    corrupt_headers: int  # dropped: claimed a block, failed a check
    duplicates: int  # dropped: an older copy of a block recovered from another slot
    next_generation: int  # where the write counter resumes
    seconds: float  # until the store was ready to serve (open returned)
    # "snapshot": the index saved at the last clean stop was taken over (no
    # header read); "scan": every kept slot header was read.
    index: str = "scan"
    scanning: bool = False  # the scan is still running (the store serves meanwhile)
    slots_to_scan: int = 0  # the slots kept from the file: the scan's whole length
    scan_seconds: float | None = None  # how long the scan took; None until it is done
    epoch: int = 0  # the slab's epoch (slot_format.py, "Generations")

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
            "scanning": self.scanning,
            "slots_to_scan": self.slots_to_scan,
            "scan_seconds": None if self.scan_seconds is None else round(self.scan_seconds, 6),
            "epoch": self.epoch,
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
    # left the cache before their turn (evicted, replaced, invalidated, or dropped
    # by a read they failed): blocks = verified + dropped + skipped once done
    skipped: int = 0
    done: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate, "blocks": self.blocks, "verified": self.verified,
            "verified_bytes": self.verified_bytes, "dropped": self.dropped,
            "skipped": self.skipped, "done": self.done,
        }


@dataclass(frozen=True)
class RecoveredIndex:
    """The index to start from: what the store adopts in place of an empty one
    (the index snapshot's, or an empty one that a scan then fills)."""

    index: SlotIndex
    policy: SlotFifo  # holding the slots, oldest first in line
    free: array[int]  # free slots, as a stack (the last one is used first)
    next_generation: int  # larger than every generation on disk
    from_snapshot: bool = False

    @property
    def used_bytes(self) -> int:
        return self.index.used_bytes


def free_stack(index: SlotIndex, first: int = 0) -> array[int]:
    """The slots from ``first`` on that hold no block, as a stack handing out
    the lowest first (as a new store does)."""
    lengths = index.lengths
    return array("i", (slot for slot in range(index.slot_count - 1, first - 1, -1)
                       if lengths[slot] == NO_BLOCK))


@dataclass(frozen=True)
class Merged:
    """What the store must do for one merged batch."""

    free: list[int]  # slots found empty: free now
    erase: list[int]  # corrupt headers and losing duplicates: free once erased on disk
    purged: list[int]  # blocks of objects dropped since the start: free once erased


class ScanMerge:
    """Merges the batches of a scan into the live index and policy, oldest of
    each batch next out (see the module docstring). Pure bookkeeping, no I/O.

    ``written`` must be told the generation of every block the store indexes
    while the scan runs, and ``purge`` every object it drops (their blocks
    still on disk, not scanned yet, must not come back); ``merge`` calls
    ``drop`` for a block recovered
    earlier in the scan that a newer copy replaces (the store forgets it like
    any dropped block: it may be being read), and expects the slot gone from
    the index and the policy when ``drop`` returns.
    """

    def __init__(self, index: SlotIndex, policy: SlotFifo, first_generation: int) -> None:
        self._index = index
        self._policy = policy
        self._first_generation = first_generation  # of this start: above every one on disk
        self._high = array("I", [0]) * index.slot_count
        self.blocks_recovered = 0
        self.bytes_recovered = 0
        self.corrupt_headers = 0
        self.duplicates = 0
        self.slots_scanned = 0
        # Object tags (the first bytes of the identity hash) of the objects
        # dropped since the start; another object sharing a tag loses its
        # scanned blocks too, a miss (as in SlotIndex.slots_of_object).
        self._purged: set[bytes] = set()

    def purge(self, object_digest: bytes) -> None:
        self._purged.add(object_digest[:TAG_BYTES])

    def nbytes(self) -> int:
        return self._high.itemsize * len(self._high)

    def written(self, slot: int, generation: int) -> None:
        self._high[slot] = generation >> 32

    def generation(self, slot: int) -> int:
        """The full generation of the block the index holds in ``slot``."""
        return self._high[slot] << 32 | self._index.generation(slot)

    def merge(self, scan: SlotScan, scanned_slots: int,
              drop: Callable[[int], None]) -> Merged:
        """Merge one batch (``scanned_slots`` headers read)."""
        index, high = self._index, self._high
        chunks, chunk_size = index.chunks_per_block, index.chunk_size
        erase = list(scan.corrupt)
        purged: list[int] = []
        winners: dict[int, int] = {}  # slot -> generation, of this batch, not yet queued
        main: set[int] = set()
        hashes, slots, lengths, generations = scan.hashes, scan.slots, scan.lengths, \
            scan.generations
        for entry in range(len(scan)):
            slot, generation = slots[entry], generations[entry]
            if index.holds(slot):
                raise ValueError(f"slot {slot} was indexed before the scan reached it")
            digest = bytes(hashes[HASH_BYTES * entry:HASH_BYTES * (entry + 1)])
            if self._purged and digest[:TAG_BYTES] in self._purged:
                purged.append(slot)
                continue
            held = index.find(digest)
            if held >= 0:
                # Equal generations cannot come from one slab's counter; the
                # slot number only makes the choice deterministic if a disk
                # invents one.
                if (generation, slot) < (self.generation(held), held):
                    erase.append(slot)
                    self.duplicates += 1
                    continue
                if self.generation(held) < self._first_generation:
                    self.blocks_recovered -= 1
                    self.bytes_recovered -= index.length(held)
                if winners.pop(held, None) is not None:
                    # Found earlier in this very batch: nobody has seen it
                    # yet (the merge does not yield), it is not queued.
                    index.remove(held)
                    erase.append(held)
                else:
                    drop(held)
                if index.find(digest) >= 0:
                    raise RuntimeError(f"slot {held} is still indexed after its drop")
                self.duplicates += 1
            length = lengths[entry]
            first = chunks * entry
            index.add(slot, digest, length, generation,
                      scan.checksums[first:first - (-length // chunk_size)])
            high[slot] = generation >> 32
            winners[slot] = generation
            if scan.main[entry]:
                main.add(slot)
            self.blocks_recovered += 1
            self.bytes_recovered += length
        # Newest first, so that the oldest of the batch ends up next out.
        self._policy.adopt_older(sorted(winners, key=lambda slot: (winners[slot], slot),
                                        reverse=True), main.__contains__)
        self.corrupt_headers += len(scan.corrupt)
        self.slots_scanned += scanned_slots
        return Merged(free=list(scan.empty), erase=erase, purged=purged)
