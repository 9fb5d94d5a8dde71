"""How one request's blocks were found: the access log's `blocks` and `lane`.

Pure bookkeeping the engine fills as it serves a range (sidecar.engine), one
letter per block touched, in block order from the first one:

    c  cached: read from the cache, no origin read
    j  joined: already on its way from the origin (read ahead, warmed, or
       fetched for another request): no origin read of its own
    f  fetched: this request started the block's origin read (or read it
       straight from the origin, uncached, in bypass)

A request's blocks are consecutive (it reads one range), so the first block
and the letters say it all, in a few bytes per line.

`origin_bytes` is what the request's own origin reads brought: the whole blocks
of the fetches it started (a coalesced run counts whole even if the client
leaves before its end) and what it read straight from the origin, uncached.
Read-ahead and warm fetches are logged on lines of their own, when they end
(sidecar.telemetry.access_log), so the log's origin bytes, summed, are the
sidecar's `sidecar_origin_bytes_total`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.model import FOREGROUND

CACHED = "c"
JOINED = "j"
FETCHED = "f"


@dataclass
class ReadTally:
    first_block: int | None = None
    found: list[str] = field(default_factory=list)
    joined_lanes: list[str] = field(default_factory=list)  # the lane of each joined fetch
    origin_bytes: int = 0  # brought by this request's own origin reads

    def add(self, block: int, how: str, lane: str = FOREGROUND) -> None:
        """Block `block` was found `how` (a block told twice keeps the later word:
        a cached block that failed its read and was fetched after all)."""
        if self.first_block is None:
            self.first_block = block
        at = block - self.first_block
        if at < len(self.found):
            self.found[at] = how
        else:
            self.found.append(how)
        if how == JOINED:
            self.joined_lanes.append(lane)

    @property
    def letters(self) -> str:
        return "".join(self.found)

    @property
    def lane(self) -> str | None:
        """The lane whose origin reads brought this request's uncached blocks:
        foreground when it fetched any itself, else the lane of the first fetch
        it joined; None when every block was cached."""
        if FETCHED in self.found:
            return FOREGROUND
        return self.joined_lanes[0] if self.joined_lanes else None
