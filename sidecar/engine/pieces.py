"""What the engine hands the HTTP layer: the pieces of a range and where each
came from.

Every piece is a verified copy of at most one chunk (sidecar.cache.slab
explains why never a reference to the slab's pages).
"""

from __future__ import annotations

import enum

# Pieces handed to the HTTP layer: a client that stops after 1 MiB costs about
# 1 MiB of hashing, not a whole block. Equal to the cache's checksum chunk.
PIECE_SIZE = 1024 * 1024

# What the engine hands the HTTP layer: bytes of its own, never a view of
# memory that changes once the piece is handed over.
Piece = bytes | memoryview


def piece_length(piece: Piece) -> int:
    return len(piece)


class Source(enum.Enum):
    CACHE = "cache"
    ORIGIN = "origin"
