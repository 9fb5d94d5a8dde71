"""Block cache: fixed-size blocks of S3 objects in one preallocated slab file.

Self-contained on purpose (no HTTP, no origin): the engine looks blocks up,
reads them and writes what it fetched; everything else is in here.

The names below are loaded when first asked for, not when the package is:
pure modules import the package's pure parts (``sidecar.cache.ident``,
``sidecar.cache.slot_fifo``), and that must not load the store and the slab
with their I/O (the capacity analysis ships them to executors on their own).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.cache.block_writes import BlockWrite
    from sidecar.cache.errors import CacheDiskError
    from sidecar.cache.ident import BlockIdent, SlotRecord
    from sidecar.cache.outcomes import CacheMetrics, Purged, Shrunk, Written
    from sidecar.cache.store import BlockStore

_HOMES = {
    "BlockIdent": "sidecar.cache.ident", "SlotRecord": "sidecar.cache.ident",
    "CacheDiskError": "sidecar.cache.errors", "BlockStore": "sidecar.cache.store",
    "BlockWrite": "sidecar.cache.block_writes", "CacheMetrics": "sidecar.cache.outcomes",
    "Purged": "sidecar.cache.outcomes", "Shrunk": "sidecar.cache.outcomes",
    "Written": "sidecar.cache.outcomes",
}

__all__ = [
    "BlockIdent", "BlockStore", "BlockWrite", "CacheDiskError", "CacheMetrics", "Purged", "Shrunk",
    "SlotRecord", "Written",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
