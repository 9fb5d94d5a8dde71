"""Access log lines -> requests: parsing and the facts derived per request. Pure.

A line is the sidecar's access log JSON (sidecar/telemetry/access_log.py,
docs/ARCHITECTURE.md "Access log"). Only object reads that delivered bytes
make a request of the trace; a read-ahead or warm fetch's own line (method
FETCH) is a `Fetch`, whose origin bytes count but which is not replayed; every
other well-formed line (HEAD, errors, pass-through operations) is counted but
not replayed. A line that is not JSON, or lacks a field the analysis needs, is
`Malformed`, with the field named.

Origin bytes: a line with `origin_bytes` says what its own origin reads
brought, and the background lanes have lines of their own, so the log's sum is
the sidecar's counter. Older logs lack both: a request's fetched blocks count,
and joined read-ahead or warm blocks are charged to the first request that
joined them (read-ahead never read is not in those logs at all).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime

from sidecar.blocks import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from sidecar.layout import parse_aiven_key

# The letters of the log's blocks.found (sidecar/tally.py).
CACHED, JOINED, FETCHED = "c", "j", "f"
FETCH_METHOD = "FETCH"  # a background fetch's line (sidecar.telemetry.access_log)
NO_TOPIC = "(other)"  # keys outside the tiered-storage layout
# The largest byte count or offset a line may hold: integers past 2**53 are not
# exact in most JSON readers (RFC 8259 section 6), and the job's tables hold
# them as 64-bit longs, which a sum of lines must not overflow either.
MAX_COUNT = 2 ** 53 - 1


@dataclass(frozen=True)
class Request:
    """One object read of the log, as the analysis needs it."""

    node: str
    time_s: float  # seconds since the epoch
    bucket: str
    key: str
    etag: str
    object_size: int
    first_byte: int
    bytes: int  # delivered
    lazy: bool  # open-ended (read as the client reads), as the data port serves it
    block_size: int
    first_block: int | None
    found: str
    lane: str | None
    topic: str
    partition: int
    cache_bytes: int | None
    duration_s: float
    origin_bytes: int | None = None  # what the line says its origin reads brought

    def block_length(self, block: int) -> int:
        start = block * self.block_size
        return max(0, min(self.object_size, start + self.block_size) - start)

    def delivered_in(self, block: int) -> int:
        """Bytes of this request's delivery that lie in `block`."""
        lo = max(self.first_byte, block * self.block_size)
        hi = min(self.first_byte + self.bytes, (block + 1) * self.block_size)
        return max(0, hi - lo)

    def tallies(self) -> Tally:
        """Bytes and blocks by how they were found, and origin bytes by lane."""
        hit_bytes, hit_blocks = self.hits()
        if self.origin_bytes is not None:
            # The sidecar said: its background fetches have lines of their own.
            return Tally(blocks=len(self.found), hit_blocks=hit_blocks, hit_bytes=hit_bytes,
                         origin_foreground=self.origin_bytes, origin_prefetch=0,
                         origin_warm=0)
        fetched_bytes = joined_bytes = 0
        for offset, how in enumerate(self.found):
            block = (self.first_block or 0) + offset
            if how == JOINED:
                joined_bytes += self.block_length(block)
            elif how == FETCHED:
                fetched_bytes += self.block_length(block)
        # A block joined on the prefetch or warm lane was read from the origin for
        # this request's sake; one joined on the foreground lane was counted by
        # the request that fetched it.
        joined_lane = self.lane if self.lane in ("prefetch", "warm") else None
        return Tally(
            blocks=len(self.found), hit_blocks=hit_blocks, hit_bytes=hit_bytes,
            origin_foreground=fetched_bytes,
            origin_prefetch=joined_bytes if joined_lane == "prefetch" else 0,
            origin_warm=joined_bytes if joined_lane == "warm" else 0,
        )

    def hits(self) -> tuple[int, int]:
        """Bytes delivered from blocks found cached or joined, and those blocks."""
        hit_bytes = hit_blocks = 0
        for offset, how in enumerate(self.found):
            if how in (CACHED, JOINED):
                hit_blocks += 1
                hit_bytes += self.delivered_in((self.first_block or 0) + offset)
        return hit_bytes, hit_blocks


@dataclass(frozen=True)
class Tally:
    blocks: int
    hit_blocks: int
    hit_bytes: int
    origin_foreground: int
    origin_prefetch: int
    origin_warm: int


@dataclass(frozen=True)
class Fetch:
    """A read-ahead or warm fetch's own line: origin bytes no request waited for."""

    node: str
    time_s: float
    bucket: str
    key: str
    lane: str
    origin_bytes: int
    first_block: int
    blocks: int
    duration_s: float
    topic: str
    partition: int
    etag: str = ""
    object_size: int = 0
    block_size: int = 0

    @property
    def first_byte(self) -> int:
        return self.first_block * self.block_size

    @property
    def length(self) -> int:
        """The bytes of the blocks it fetched (the last one may end short)."""
        end = min(self.object_size, (self.first_block + self.blocks) * self.block_size)
        return max(0, end - self.first_byte)


@dataclass(frozen=True)
class Other:
    """A well-formed line that is not an object read with bytes (HEAD, an error...)."""

    node: str


@dataclass(frozen=True)
class Malformed:
    reason: str


Parsed = Request | Fetch | Other | Malformed


def _field(doc: dict[str, object], name: str, kind: type | tuple[type, ...]) -> object:
    value = doc.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"field {name!r} is missing or not {_kind_name(kind)}")
    return value


def _count(doc: dict[str, object], name: str, label: str | None = None) -> int:
    """A byte count, offset or block number: an integer in [0, MAX_COUNT]
    (`label`: the field's name in messages, where `doc` is nested)."""
    value = _field(doc, name, int)
    assert isinstance(value, int)
    if value < 0:
        raise ValueError(f"field {label or name!r} is negative")
    if value > MAX_COUNT:
        raise ValueError(f"field {label or name!r} is larger than {MAX_COUNT}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def parse_time(text: str) -> float:
    """A line's `time`, UTC as the access log's contract says; one without an
    offset too (not the local time of whichever executor reads it)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_line(line: str, layout_prefix: str = "") -> Parsed:
    """One log line; never raises."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return Malformed("not JSON")
    if not isinstance(doc, dict):
        return Malformed("not a JSON object")
    try:
        node = str(_field(doc, "node", str))
        status = int(_field(doc, "status", int))  # type: ignore[call-overload]
        delivered = _count(doc, "bytes")
        time_s = parse_time(str(_field(doc, "time", str)))
        if doc.get("method") == FETCH_METHOD:
            return _fetch(doc, node, time_s, layout_prefix)
        if doc.get("method") != "GET" or status not in (200, 206) or delivered <= 0 \
                or doc.get("first_byte") is None:
            return Other(node)
        key = str(_field(doc, "key", str))
        block_size = _count(doc, "block_size")
        # The replay cuts the node's reads into blocks of this size: one the
        # sidecar cannot have had would cut them all wrong.
        if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size % 4096:
            raise ValueError(f"field 'block_size' is {block_size}, no block size the sidecar "
                             f"takes (a multiple of 4 KiB from {MIN_BLOCK_SIZE} to "
                             f"{MAX_BLOCK_SIZE})")
        blocks = doc.get("blocks")
        first_block: int | None = None
        found = ""
        if blocks is not None:
            if not isinstance(blocks, dict):
                raise ValueError("field 'blocks' is not an object")
            first_block = _count(blocks, "first", "blocks.first")
            found = str(_field(blocks, "found", str))
            if set(found) - {CACHED, JOINED, FETCHED}:
                raise ValueError("field 'blocks.found' has letters other than c, j, f")
        segment = parse_aiven_key(key, layout_prefix)
        range_header = doc.get("range")
        object_size, first_byte = _count(doc, "object_size"), _count(doc, "first_byte")
        if first_byte + delivered > object_size:
            # Delivered bytes lie in the object; the replay walks each of their
            # blocks, and a read far past the end would keep it walking.
            raise ValueError("field 'bytes' runs past the object's end (first_byte + bytes > "
                             "object_size)")
        return Request(
            node=node, time_s=time_s, bucket=str(_field(doc, "bucket", str)), key=key,
            etag=str(_field(doc, "etag", str)),
            object_size=object_size, first_byte=first_byte, bytes=delivered,
            lazy=status == 200 or (isinstance(range_header, str)
                                   and range_header.rstrip().endswith("-")),
            block_size=block_size, first_block=first_block, found=found,
            lane=doc["lane"] if isinstance(doc.get("lane"), str) else None,
            topic=segment.topic if segment is not None else NO_TOPIC,
            partition=segment.partition if segment is not None else -1,
            cache_bytes=_cache_bytes(doc),
            duration_s=_duration(doc),
            origin_bytes=_origin_bytes(doc),
        )
    except ValueError as exc:
        return Malformed(str(exc))


def _duration(doc: dict[str, object]) -> float:
    """The line's duration_s; 0 when it has none. A negative or non-finite one
    (Python's JSON reader takes NaN and Infinity) would move the read's arrival
    (time less duration) anywhere in the replay."""
    value = doc.get("duration_s")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    try:
        seconds = float(value)
    except OverflowError:  # an integer past a float's range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError("field 'duration_s' is not a finite number")
    if seconds < 0:
        raise ValueError("field 'duration_s' is negative")
    return seconds


def _cache_bytes(doc: dict[str, object]) -> int | None:
    """The configured cache size; None when the line does not say (absent, not
    a positive integer)."""
    value = doc.get("cache_bytes")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    return _count(doc, "cache_bytes")


def _origin_bytes(doc: dict[str, object]) -> int | None:
    """The line's origin_bytes; None in a log written before it was recorded."""
    if "origin_bytes" not in doc:
        return None
    return _count(doc, "origin_bytes")


def _fetch(doc: dict[str, object], node: str, time_s: float, layout_prefix: str) -> Fetch:
    """A FETCH line (raises ValueError naming a field that is missing)."""
    key = str(_field(doc, "key", str))
    lane = str(_field(doc, "lane", str))
    blocks = _field(doc, "blocks", dict)
    assert isinstance(blocks, dict)
    first_block = _count(blocks, "first", "blocks.first")
    found = str(_field(blocks, "found", str))
    origin = _origin_bytes(doc)
    object_size, block_size = _count(doc, "object_size"), _count(doc, "block_size")
    if first_block * block_size > MAX_COUNT:
        raise ValueError(f"field 'blocks.first' starts past byte {MAX_COUNT}")
    segment = parse_aiven_key(key, layout_prefix)
    return Fetch(
        node=node, time_s=time_s, bucket=str(_field(doc, "bucket", str)), key=key,
        lane=lane, origin_bytes=origin or 0, first_block=first_block, blocks=len(found),
        duration_s=_duration(doc),
        topic=segment.topic if segment is not None else NO_TOPIC,
        partition=segment.partition if segment is not None else -1,
        etag=str(_field(doc, "etag", str)),
        object_size=object_size, block_size=block_size,
    )


def partition_prefix(request: Request | Fetch, layout_prefix: str = "") -> str:
    """What spatial sampling hashes: the partition (all its segments, so read-ahead
    across segment boundaries keeps what it needs), else the object."""
    segment = parse_aiven_key(request.key, layout_prefix)
    if segment is not None:
        return f"{request.bucket}/{segment.partition_prefix}"
    return f"{request.bucket}/{request.key}"
