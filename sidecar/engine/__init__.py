"""Serve a byte range: cache lookup -> single-flight fetch of misses -> stream.

The engine is the one place that starts origin fetches, for every lane:
foreground (a reader waits), prefetch (read-ahead the planner asked for) and
warm (the warm-up API), all through one in-flight table (engine/fetches.py),
so a block is fetched once however many readers want it at the same time.

The other parts answer, the engine acts: the read-ahead planner
(sidecar.prefetch.planner) returns the blocks to fetch ahead; the store returns
what a write evicted and whether the disk failed (the engine then switches the
modes to bypass, and the readers of the blocks caught in it read from the
origin directly); evictions go back to the planner, which counts unread
read-ahead as waste.

One concern a module, `Engine` (facade.py) the façade that wires them:
serving.py serves a range piece by piece, fetches.py fetches missing blocks
once, read_ahead.py starts what the planner asks for, warm_up.py warms,
evictions.py tells the planner what left the cache, background.py keeps the
tasks no caller awaits; pieces.py and origin_reader.py are what the engine
hands the HTTP layer and what it needs of the origin.
"""

from __future__ import annotations

from sidecar.engine.facade import Engine
from sidecar.engine.fetches import FOREGROUND_PARTS, max_coalesce_blocks
from sidecar.engine.origin_reader import OriginReader, Sink
from sidecar.engine.pieces import PIECE_SIZE, Piece, Source, TierSlice, piece_length
from sidecar.engine.warm_up import WarmResult

__all__ = [
    "FOREGROUND_PARTS", "PIECE_SIZE", "Engine", "OriginReader", "Piece", "Sink", "Source",
    "TierSlice", "WarmResult", "max_coalesce_blocks", "piece_length",
]
