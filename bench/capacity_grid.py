"""The capacity accuracy grid: its cells, their workloads and how errors are judged. Pure.

A cell is a number of streams (partitions a consumer group reads at once: 1,
4, 16, 48), a pattern of groups and a cache size as a share of the working
set (10, 25, 50, 100 %):

  one-group  one group reads every partition from its first segment to its last
  groups     a second group starts reading the same partitions from the start
             once the first is halfway: re-reads, interleaved with first reads
  lagging    one group reads every partition; a lagging consumer, once the
             group is three quarters through, catches up on partition 0 from
             its start

Each (streams, pattern) is served by a real sidecar at every share; the curve
built from one share's access log (REFERENCE_SHARE) predicts every share,
which is set beside what each run's own counters measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.tools.kafka_segments import SegmentObject

STREAMS = (1, 4, 16, 48)
PATTERNS = ("one-group", "groups", "lagging")
SHARES = (0.10, 0.25, 0.50, 1.00)
REFERENCE_SHARE = 0.25  # whose log builds the curve
MiB = 1024 * 1024
BLOCK = 64 * 1024
SLOT = BLOCK + 4096  # a block and its slot header (sidecar/cache/slot_format.py)
FETCH = 160 * 1024  # not block-aligned: fetches straddle blocks as Kafka's do
SEGMENTS_PER_PARTITION = 2
MIN_BLOCKS = 8  # the smallest cache tried, whatever the share
# The target (issue 34): within 2 points of byte hit ratio, 10% of origin bytes
# per served byte.
HIT_POINTS = 0.02
ORIGIN_SHARE = 0.10


def segment_bytes(streams: int) -> int:
    """Segments long enough that a cell's hit ratio is the workload's, not one
    run's luck: the working set is 64 MiB with 4 and 16 streams, 96 MiB with 48
    (a segment of 1 MiB each); one stream reads the same bytes in every run,
    and 16 MiB of it is enough. With 16 MiB (48 MiB with 48 streams), a cell's
    rounds moved by up to 6 points from one to the next (bench/ANALYSIS.md)."""
    return min(8 * MiB, MiB * max(1, 32 // streams))


@dataclass(frozen=True)
class Reader:
    """One consumer: its fetches (key, first byte, last byte) in order, and when
    it starts: at once, or once the readers of group `after` are `at` through."""

    name: str
    group: str
    fetches: tuple[tuple[str, int, int], ...]
    after: str | None = None
    at: float = 0.0


def _chains(segments: Sequence[SegmentObject]) -> dict[int, list[SegmentObject]]:
    by_partition: dict[int, list[SegmentObject]] = {}
    for segment in segments:
        by_partition.setdefault(segment.partition, []).append(segment)
    for chain in by_partition.values():
        chain.sort(key=lambda s: s.start_offset)
    return by_partition


def _consumer(chain: Sequence[SegmentObject]) -> Iterator[tuple[str, int, int]]:
    for segment in chain:
        size = len(segment.data)
        for start in range(0, size, FETCH):
            yield segment.key, start, min(size, start + FETCH) - 1


def readers(pattern: str, segments: Sequence[SegmentObject]) -> list[Reader]:
    """The consumers of a pattern (PATTERNS) over a topic's segments."""
    chains = _chains(segments)
    group = [Reader(f"a-{p}", "a", tuple(_consumer(chain)))
             for p, chain in sorted(chains.items())]
    if pattern == "one-group":
        return group
    if pattern == "groups":
        return group + [Reader(f"b-{p}", "b", tuple(_consumer(chain)), after="a", at=0.5)
                        for p, chain in sorted(chains.items())]
    if pattern == "lagging":
        first = min(chains)
        return group + [Reader("lag", "lag", tuple(_consumer(chains[first])), after="a",
                               at=0.75)]
    raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")


def working_set_blocks(segments: Sequence[SegmentObject]) -> int:
    return sum(-(-len(segment.data) // BLOCK) for segment in segments)


def cache_bytes(share: float, blocks: int) -> int:
    return max(MIN_BLOCKS, round(share * blocks)) * SLOT


def judged(row: dict[str, Any]) -> dict[str, Any]:
    """A cell's errors: points of byte hit ratio, share of origin bytes per served byte."""
    hit_error = row["predicted_byte_hit_ratio"] - row["measured_byte_hit_ratio"]
    measured = row["measured_origin_per_served"]
    origin_error = (row["predicted_origin_per_served"] / measured - 1) if measured else 0.0
    return {**row, "hit_error": hit_error, "origin_error": origin_error,
            "within": abs(hit_error) <= HIT_POINTS and abs(origin_error) <= ORIGIN_SHARE}


def worst(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The cell farthest from the target, by the larger of its two errors in
    units of the target."""
    return max(rows, default=None, key=lambda r: max(abs(r["hit_error"]) / HIT_POINTS,
                                                     abs(r["origin_error"]) / ORIGIN_SHARE))

