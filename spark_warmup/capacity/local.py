"""One node's access log replayed in this process, without Spark: what the
Spark job does per (node, size), for a log small enough to read here (the
accuracy benchmark, tests). Pure but for reading the file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spark_warmup.capacity.landing import FetchTimes
from spark_warmup.capacity.pacing import costs_of
from spark_warmup.capacity.simulate import Outcome, Read, Settings, origin_load, replay
from spark_warmup.capacity.trace import Fetch, Request, parse_line


def read_of(request: Request) -> Read:
    """The replay's view of a logged request (as the Spark job builds it)."""
    return Read(request.time_s, request.bucket, request.key, request.etag,
                request.object_size, request.first_byte, request.bytes, request.lazy,
                request.duration_s, found=request.found)


def warm_of(fetch: Fetch) -> Read:
    """A warm-up's fetch, replayed as the warm-up it was (protected until read)."""
    return Read(fetch.time_s, fetch.bucket, fetch.key, fetch.etag, fetch.object_size,
                fetch.first_byte, fetch.length, False, fetch.duration_s, warm=True)


def replay_log(log: Path, settings: Settings, sizes: Sequence[int]) -> dict[int, Outcome]:
    """The curve of one node's log at `sizes`."""
    with log.open(encoding="utf-8") as lines:
        parsed = [parse_line(line, settings.layout_prefix) for line in lines]
    reads = sorted([*(read_of(p) for p in parsed if isinstance(p, Request)),
                    *(warm_of(p) for p in parsed if isinstance(p, Fetch) and p.lane == "warm")],
                   key=lambda r: r.time_s)
    landing = FetchTimes.of((p.time_s - p.duration_s, p.duration_s)
                            for p in parsed if isinstance(p, Fetch))
    # The size the log was written at (the Spark job's current_cache_bytes).
    own = max((p.cache_bytes or 0 for p in parsed if isinstance(p, Request)), default=0)
    costs = costs_of([(p.found, p.first_byte, p.block_size, p.duration_s)
                      for p in parsed if isinstance(p, Request)])
    load = origin_load(settings, own, reads, fetch_s=landing, costs=costs) if own else None
    return {size: replay(settings, size, reads, fetch_s=landing, load=load, costs=costs)
            for size in sizes}
