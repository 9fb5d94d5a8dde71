"""Block cache: fixed-size blocks of S3 objects in one preallocated slab file.

Self-contained on purpose (no HTTP, no origin): the engine looks blocks up,
reads them and writes what it fetched; everything else is in here.
"""

from __future__ import annotations

from sidecar.cache.errors import CacheDiskError
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.store import (
    BlockStore,
    BlockWrite,
    CacheMetrics,
    Purged,
    Shrunk,
    Written,
)

__all__ = [
    "BlockIdent", "BlockStore", "BlockWrite", "CacheDiskError", "CacheMetrics", "Purged", "Shrunk",
    "SlotRecord", "Written",
]
