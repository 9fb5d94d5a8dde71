"""Object key layouts of the tiered-storage bucket.

The Aiven tiered-storage plugin writes one object per segment file:

    {prefix}{topic}-{topicId}/{partition}/{startOffset:020d}-{segmentId}.{suffix}

Zero-padding the offset makes lexicographic key order equal offset order
within a partition, which is what lets us find the next segment from a
listing alone.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SUFFIXES = frozenset({"log", "indexes", "rsm-manifest"})

# Kafka Uuid.toString(): 16 bytes as URL-safe base64 without padding.
_UUID = r"[A-Za-z0-9_-]{22}"
# Kafka's legal topic characters, at most 249 of them. The topic may itself
# contain "-", so the greedy topic group backtracks until exactly the last 22
# characters of the directory are left for the topic id.
_TOPIC = r"[A-Za-z0-9._-]{1,249}"
_AIVEN_KEY = re.compile(
    rf"(?P<topic>{_TOPIC})-(?P<topic_id>{_UUID})"
    r"/(?P<partition>0|[1-9][0-9]{0,9})"
    rf"/(?P<offset>[0-9]{{20}})-(?P<segment_id>{_UUID})"
    r"\.(?P<suffix>log|indexes|rsm-manifest)"
)


@dataclass(frozen=True)
class SegmentKey:
    prefix: str
    topic: str
    topic_id: str
    partition: int
    start_offset: int
    segment_id: str
    suffix: str

    @property
    def partition_prefix(self) -> str:
        return f"{self.prefix}{self.topic}-{self.topic_id}/{self.partition}/"

    @property
    def key(self) -> str:
        return (
            f"{self.partition_prefix}{self.start_offset:020d}"
            f"-{self.segment_id}.{self.suffix}"
        )

    def with_suffix(self, suffix: str) -> SegmentKey:
        """The key of a sibling file of the same segment (e.g. its indexes)."""
        _require_suffix(suffix)
        return dataclasses.replace(self, suffix=suffix)


def parse_aiven_key(key: str, prefix: str = "") -> SegmentKey | None:
    """Split an Aiven-layout key into its parts; None if it is not one."""
    if not key.startswith(prefix):
        return None
    match = _AIVEN_KEY.fullmatch(key[len(prefix) :])
    if match is None:
        return None
    return SegmentKey(
        prefix=prefix,
        topic=match["topic"],
        topic_id=match["topic_id"],
        partition=int(match["partition"]),
        start_offset=int(match["offset"]),
        segment_id=match["segment_id"],
        suffix=match["suffix"],
    )


def format_aiven_key(
    prefix: str,
    topic: str,
    topic_id: str,
    partition: int,
    start_offset: int,
    segment_id: str,
    suffix: str = "log",
) -> str:
    """Build an Aiven-layout key; ValueError if the parts cannot form one."""
    segment = SegmentKey(
        prefix, topic, topic_id, partition, start_offset, segment_id, suffix
    )
    # Round-tripping through the parser rejects every invalid part (bad topic
    # characters, negative numbers, malformed ids) with a single rule.
    if parse_aiven_key(segment.key, prefix) != segment:
        raise ValueError(f"not a valid Aiven segment key: {segment!r}")
    return segment.key


def next_segment_key(
    log_keys: Iterable[str], current_key: str, prefix: str = ""
) -> str | None:
    """The ``.log`` key of the partition's segment that follows ``current_key``."""
    current = parse_aiven_key(current_key, prefix)
    if current is None:
        return None
    candidates = (parse_aiven_key(key, prefix) for key in log_keys)
    later = [
        c
        for c in candidates
        if c is not None
        and c.suffix == "log"
        and c.partition_prefix == current.partition_prefix
        and c.start_offset > current.start_offset
    ]
    if not later:
        return None
    return min(later, key=lambda c: c.start_offset).key


class Layout(enum.Enum):
    AIVEN = "aiven"
    PLAIN = "plain"  # opaque keys: no segment structure to exploit

    def next_segment_key(
        self, log_keys: Iterable[str], current_key: str, prefix: str = ""
    ) -> str | None:
        if self is Layout.PLAIN:
            return None
        return next_segment_key(log_keys, current_key, prefix)


def parse_layout(name: str) -> Layout:
    try:
        return Layout(name.strip().lower())
    except ValueError:
        choices = ", ".join(layout.value for layout in Layout)
        raise ValueError(
            f"unknown key layout {name!r}; expected one of: {choices}"
        ) from None


def _require_suffix(suffix: str) -> None:
    if suffix not in SUFFIXES:
        choices = ", ".join(sorted(SUFFIXES))
        raise ValueError(f"unknown segment suffix {suffix!r}; expected: {choices}")


# Files of a segment that the plugin reads whole, and often (every fetch that
# starts a segment needs its manifest and indexes); the `.log` itself is the
# big, scanned object.
SMALL_SUFFIXES = frozenset({"indexes", "rsm-manifest"})


def is_small_object(key: str, prefix: str = "") -> bool:
    """Whether an Aiven-layout key is a segment's manifest or indexes file."""
    segment = parse_aiven_key(key, prefix)
    return segment is not None and segment.suffix in SMALL_SUFFIXES


def segments_in_range(starts: Sequence[int | None], first: int, last: int | None) -> list[int]:
    """Indices of a partition's segments, in offset order, that hold part of the
    inclusive range [first, last] (`last` None: open-ended).

    Segment i runs from starts[i] to just before starts[i + 1]; the last one
    never ends. `starts` are start offsets, or the first batch's baseTimestamp
    for a time range (the planning rule: Kafka timestamps need not grow, so a
    segment whose start is unknown, None, counts as inside on its side).
    """
    chosen = []
    for i, start in enumerate(starts):
        begins_in_time = start is None or last is None or start <= last
        following = starts[i + 1] if i + 1 < len(starts) else None
        ends_after = i + 1 == len(starts) or following is None or following > first
        if begins_in_time and ends_after:
            chosen.append(i)
    return chosen
