"""What the engine hands the HTTP layer: the pieces of a range and where each
came from.

Every piece is at most one chunk, verified: a copy of its own
(sidecar.cache.slab explains why never a reference to the slab's pages), or
a pinned slice of the memory tier (``TierSlice``), which the HTTP layer sends
with sendfile and then releases, sent or not.
"""

from __future__ import annotations

import enum

from sidecar.cache.memory_tier import TierSlice

__all__ = ["PIECE_SIZE", "Piece", "Source", "TierSlice", "piece_length"]

# Pieces handed to the HTTP layer: a client that stops after 1 MiB costs about
# 1 MiB of hashing, not a whole block. Equal to the cache's checksum chunk.
PIECE_SIZE = 1024 * 1024

# What the engine hands the HTTP layer: bytes of its own, never a view of
# memory that changes once the piece is handed over; or a tier slice, whose
# region nothing refills until it is released.
Piece = bytes | memoryview | TierSlice


def piece_length(piece: Piece) -> int:
    return len(piece)


class Source(enum.Enum):
    CACHE = "cache"
    ORIGIN = "origin"
