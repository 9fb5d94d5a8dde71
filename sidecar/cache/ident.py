"""What a cached block is (``BlockIdent``) and where it lives (``SlotRecord``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockIdent:
    """One aligned block of one version of an object.

    The ETag is part of the identity so that a rewritten object can never be
    served from blocks of its previous version: a new ETag is simply a miss.
    """

    bucket: str
    key: str
    etag: str
    block: int


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A block resident in slab slot ``slot``, as the store remembers it.

    ``checksums`` are the xxh3_64 of each checksum chunk of the data, kept in
    memory so that a read verifies without touching the slot header on disk.
    ``generation`` is the slab-wide write counter value of the write that made it.
    """

    ident: BlockIdent
    slot: int
    length: int
    generation: int
    checksums: tuple[int, ...]
