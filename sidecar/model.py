"""What every layer shares: an object as the origin describes it, and the lanes.

Pure: no I/O. The engine, the prefetch planner, the data port and the origin
client all speak of objects through ``ObjectInfo``, so none of them imports
another's module for a dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# The three priority lanes of origin reads (docs/ARCHITECTURE.md, "Metrics"): a reader is
# waiting; read-ahead; warm-up ahead of a planned replay.
FOREGROUND = "foreground"
PREFETCH = "prefetch"
WARM = "warm"
LANES = (FOREGROUND, PREFETCH, WARM)


@dataclass(frozen=True)
class ObjectInfo:
    bucket: str
    key: str
    size: int
    etag: str  # as the origin sends it, with quotes
    last_modified: datetime
    content_type: str | None = None
    # What else the origin says of the object (object_headers), repeated on
    # every answer served for it, cached or not.
    headers: tuple[tuple[str, str], ...] = ()
    # The whole object's checksums and their type (checksum_headers): only for
    # an answer of the whole object to a request that asked for them.
    checksums: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FetchDone:
    """A background fetch (prefetch or warm lane) that ended: what the access log
    records of it, so the log's origin bytes add up to the origin counters.

    `origin_bytes` counts the blocks that landed whole (all of them when `ok`);
    `first_block`..`last_block` is the run asked for."""

    lane: str
    info: ObjectInfo
    first_block: int
    last_block: int
    origin_bytes: int
    duration_s: float
    ok: bool
