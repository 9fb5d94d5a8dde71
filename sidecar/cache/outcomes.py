"""What the store's calls return, and what it reports to its metrics.

The store calls nobody back: what a call evicted, and a write that failed on
the disk, come back in its result (``Written``, ``Shrunk``, ``Purged``); a read
of a block that fails its checksum returns None. The engine acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sidecar.cache.ident import BlockIdent, SlotRecord

REASON_CAPACITY = "capacity"
REASON_CHECKSUM = "checksum"
REASON_INVALIDATED = "invalidated"
REASON_SHRINK = "shrink"
REASON_RECOVERY = "recovery"
# The low 32 bits of a generation: what the index keeps (sidecar.cache.index).
GENERATION_IN_INDEX = 0xFFFFFFFF


class CacheMetrics(Protocol):
    """What the store reports; sidecar.telemetry.metrics.Metrics implements it."""

    def on_eviction(self, reason: str) -> None:
        """A block left the cache: "capacity", "checksum", "invalidated", "shrink",
        or "recovery" (a slot header dropped when the index was rebuilt at start)."""

    def on_checksum_failure(self) -> None:
        """A read found cached bytes that do not match their checksum."""

    def on_disk_error(self, op: str) -> None:
        """The cache disk failed a "read" or a "write" (EIO, ENOSPC...)."""


@dataclass(frozen=True)
class Written:
    """What ``BlockStore.write`` did.

    ``record``: the block as cached, or None when nothing was cached (every
    slot pinned or being written, the object invalidated meanwhile, the store
    closed, or the disk failed). ``evicted``: blocks pushed out to make room
    that no reader had had (cached ahead of their readers): the index keeps
    no names, only the names of such blocks (``Residency``), which is what the
    engine needs (read-ahead wasted). The others are counted in the metrics.
    ``disk_error``: why the disk refused the write (``ENOSPC: No space left on
    device``), for the caller to decide whether to keep using the cache.
    """

    record: SlotRecord | None
    evicted: tuple[BlockIdent, ...] = ()
    disk_error: str | None = None


@dataclass(frozen=True)
class Shrunk:
    """What ``BlockStore.shrink`` gave back to the disk, and the unread blocks it
    evicted (as ``Written.evicted``)."""

    released_bytes: int
    evicted: tuple[BlockIdent, ...] = ()


@dataclass(frozen=True)
class Purged:
    """What ``BlockStore.invalidate_object`` dropped: how many blocks, and which
    of them no reader had had (as ``Written.evicted``)."""

    blocks: int
    unread: tuple[BlockIdent, ...] = ()
