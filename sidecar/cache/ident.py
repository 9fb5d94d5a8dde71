"""What a cached block is (``BlockIdent``) and where it lives (``SlotRecord``)."""

from __future__ import annotations

from typing import NamedTuple


class BlockIdent(NamedTuple):
    """One aligned block of one version of an object.

    The ETag is part of the identity so that a rewritten object can never be
    served from blocks of its previous version: a new ETag is simply a miss.

    A named tuple rather than a frozen dataclass: it is the key of every
    table of the cache and the engine, and a tuple hashes in C (recovering
    100k blocks hashes each about six times).
    """

    bucket: str
    key: str
    etag: str
    block: int


class SlotRecord(NamedTuple):
    """A block resident in slab slot ``slot``, as the store remembers it.

    ``checksums`` are the xxh3_64 of each checksum chunk of the data, kept in
    memory so that a read verifies without touching the slot header on disk.
    ``generation`` is the slab-wide write counter value of the write that made it
    (its low 32 bits in a record the store's index made: see
    ``sidecar.cache.index``). The store makes records on demand; whether one
    is still the slot's is a comparison of its fields with the index.
    """

    ident: BlockIdent
    slot: int
    length: int
    generation: int
    checksums: tuple[int, ...]
