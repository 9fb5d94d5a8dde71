"""Rebuilding the cache index from the slot headers at start (warm restart).

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
(records, per-object sets, the eviction queue, free slots).
``BlockStore.open`` does the reading (``Slab.scan`` in the executor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.policy import EvictionPolicy


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

    Built whole in the executor (100k blocks take a good part of a second of
    CPU), so that the store only has to take the containers over.
    """

    records: dict[BlockIdent, SlotRecord]  # oldest generation first
    objects: dict[tuple[str, str], set[BlockIdent]]  # (bucket, key) -> its blocks
    policy: EvictionPolicy[BlockIdent]  # holding the records, oldest first in line
    used_bytes: int
    free: list[int]  # free slots, as a stack (the last one is used first)
    erase: list[int]  # slots whose header must be erased on disk before reuse
    corrupt_headers: int
    duplicates: int
    next_generation: int  # larger than every generation on disk


def rebuild_index(
    slot_count: int, records: Iterable[SlotRecord], corrupt: Iterable[int],
    admit_to_main: Callable[[BlockIdent], bool] = lambda ident: False,
) -> RecoveredIndex:
    """The index the valid headers describe, duplicates resolved by generation."""
    best: dict[BlockIdent, SlotRecord] = {}
    losers: list[int] = []
    top = 0
    for record in records:
        top = max(top, record.generation)
        held = best.get(record.ident)
        if held is None:
            best[record.ident] = record
        elif (record.generation, record.slot) > (held.generation, held.slot):
            # Equal generations cannot come from one slab's counter; the slot
            # number only makes the choice deterministic if a disk invents one.
            best[record.ident] = record
            losers.append(held.slot)
        else:
            losers.append(record.slot)
    erase = sorted(set(corrupt)) + sorted(losers)
    kept = sorted(best.values(), key=_generation)
    ordered = {record.ident: record for record in kept}
    objects: dict[tuple[str, str], set[BlockIdent]] = {}
    for ident in ordered:
        objects.setdefault((ident.bucket, ident.key), set()).add(ident)
    # Oldest generation first: recovered blocks queue for eviction in the order
    # they were written, as they would have without the restart.
    policy: EvictionPolicy[BlockIdent] = EvictionPolicy(slot_count)
    policy.adopt(ordered, admit_to_main)
    used = {record.slot for record in kept}
    # Free slots as a stack that hands out the lowest slot first, as a new
    # store does.
    free = [slot for slot in range(slot_count - 1, -1, -1) if slot not in used]
    return RecoveredIndex(
        records=ordered,
        objects=objects,
        policy=policy,
        used_bytes=sum(record.length for record in kept),
        free=free,
        erase=erase,
        corrupt_headers=len(set(corrupt)),
        duplicates=len(losers),
        next_generation=top + 1,
    )


def _generation(record: SlotRecord) -> int:
    return record.generation
