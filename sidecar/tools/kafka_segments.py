"""Genuine Kafka log segments: build them, check them, and lay them out as
Aiven tiered-storage objects.

A Kafka log segment (``*.log``) is nothing but record batches back to back
(``FileRecords`` in the broker), so a remote copy of it can be checked batch by
batch as its bytes stream past, with no index file. The batch format is the
v2 ("magic 2") RecordBatch of KIP-98, the only one Kafka 3.x writes:

====== ====================== =====
offset field                  type
====== ====================== =====
0      baseOffset             int64
8      batchLength            int32  (bytes after this field)
12     partitionLeaderEpoch   int32
16     magic                  int8   (= 2)
17     crc                    uint32 (CRC-32C of bytes 21 .. end of batch)
21     attributes             int16
23     lastOffsetDelta        int32
27     baseTimestamp          int64
35     maxTimestamp           int64
43     producerId             int64
51     producerEpoch          int16
53     baseSequence           int32
57     recordCount            int32
61     records...
====== ====================== =====

All integers are big-endian. The records themselves are built and the CRC
computed by kafka-python (``DefaultRecordBatchBuilder`` / ``calc_crc32c``), so
the bytes here are the ones a broker would accept, not a look-alike.
"""

from __future__ import annotations

import base64
import json
import random
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from sidecar.layout import parse_aiven_key

with warnings.catch_warnings():
    # kafka-python 3.0's package __init__ loads its protocol schemas through
    # the legacy importlib.resources read_text/open_text API, which warns on
    # every import; the tests run with warnings as errors. Only those two
    # messages are silenced, and only for this import.
    warnings.filterwarnings(
        "ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning
    )
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.util import calc_crc32c

__all__ = [
    "BATCH_HEADER_SIZE",
    "LOG_OVERHEAD",
    "BatchCheckError",
    "BatchHeader",
    "BatchScanner",
    "SegmentIndexes",
    "SegmentObject",
    "aiven_segment_objects",
    "build_segment",
    "build_segment_indexes",
    "generate_topic_segments",
    "iter_segment_batches",
    "kafka_uuid",
    "parse_batch_header",
]

#: Size of the v2 RecordBatch header (DefaultRecordBatch.RECORD_BATCH_OVERHEAD).
BATCH_HEADER_SIZE = 61
#: baseOffset + batchLength: the part of a batch that batchLength does not
#: count (Records.LOG_OVERHEAD in the broker).
LOG_OVERHEAD = 12
#: The only batch format this module reads or writes (RecordBatch.MAGIC_VALUE_V2).
MAGIC_V2 = 2

# The header layout of the table above, as kafka-python's
# DefaultRecordBase.HEADER_STRUCT spells it.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_MAGIC_AT = 16
# The CRC covers attributes onwards (DefaultRecordBatch.ATTRIBUTES_OFFSET):
# baseOffset, batchLength and partitionLeaderEpoch are left out on purpose
# (KIP-98) so the broker can assign offsets and the leader epoch without
# recomputing it. A check on those fields must therefore come from elsewhere,
# which is why the scanner also checks offset continuity.
_CRC_START = 21
# batchLength can be no smaller than the rest of the fixed header.
_MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD

# No producer id / epoch / sequence: what a non-idempotent producer sends
# (RecordBatch.NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE).
_NO_PRODUCER_ID = -1
_NO_PRODUCER_EPOCH = -1
_NO_SEQUENCE = -1
_COMPRESSION_NONE = 0

# Keys cycle through this many distinct values, as a keyed topic would.
_KEY_SPACE = 1024
# The largest key b"key-1023"; used to size the builder's buffer.
_MAX_KEY_LEN = len(b"key-%d" % (_KEY_SPACE - 1))


@dataclass(frozen=True)
class BatchHeader:
    """The fixed 61-byte header of one v2 record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def total_size(self) -> int:
        """Bytes the whole batch occupies in the segment."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        # lastOffsetDelta rather than recordCount: after compaction a batch
        # keeps its offset span even when records are removed from it.
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


def parse_batch_header(data: bytes | bytearray | memoryview) -> BatchHeader:
    """Parse the header at the start of ``data`` (which may hold more).

    Raises ValueError if fewer than 61 bytes are given or the batch is not
    magic 2 (v0/v1 message sets have a different layout entirely, so nothing
    past the magic byte would mean anything).
    """
    if len(data) < BATCH_HEADER_SIZE:
        raise ValueError(
            f"a Kafka record batch header is {BATCH_HEADER_SIZE} bytes, got only {len(data)}"
        )
    magic = data[_MAGIC_AT]
    if magic != MAGIC_V2:
        raise ValueError(
            f"unsupported record batch magic {magic} "
            f"(only v2 batches, magic {MAGIC_V2}, are handled)"
        )
    return BatchHeader(*_HEADER.unpack_from(data, 0))


def build_segment(
    base_offset: int,
    *,
    target_bytes: int,
    records_per_batch: int,
    value_size: int,
    base_timestamp_ms: int,
    seed: int,
    timestamp_step_ms: int = 1,
    partition_leader_epoch: int = 0,
) -> tuple[bytes, int]:
    """Build a genuine Kafka log segment of about ``target_bytes`` bytes.

    Batches of ``records_per_batch`` uncompressed, non-transactional records
    (producerId -1) are appended until the segment reaches ``target_bytes``
    (so the last batch may overshoot it). Offsets run on from ``base_offset``
    without gaps; record ``i`` of the segment has timestamp
    ``base_timestamp_ms + i * timestamp_step_ms``, a small key ``key-N`` and
    ``value_size`` pseudo-random bytes drawn from ``random.Random(seed)`` (so
    the same arguments give the same bytes, and the values do not compress).

    Returns ``(segment_bytes, next_offset)``.
    """
    if base_offset < 0:
        raise ValueError(f"base_offset must be >= 0, got {base_offset}")
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be > 0, got {target_bytes}")
    if records_per_batch <= 0:
        raise ValueError(f"records_per_batch must be > 0, got {records_per_batch}")
    if value_size < 0:
        raise ValueError(f"value_size must be >= 0, got {value_size}")
    if timestamp_step_ms < 0:
        raise ValueError(f"timestamp_step_ms must be >= 0, got {timestamp_step_ms}")

    rng = random.Random(seed)
    randbytes = rng.randbytes
    # Room for every record so append() never refuses one: the builder's own
    # per-record bound (MAX_RECORD_OVERHEAD) plus varint lengths of key and value.
    record_bound = DefaultRecordBatchBuilder.MAX_RECORD_OVERHEAD + 10 + _MAX_KEY_LEN + value_size
    batch_capacity = BATCH_HEADER_SIZE + records_per_batch * record_bound

    batches: list[bytes | bytearray] = []
    size = 0
    offset = base_offset
    while size < target_bytes:
        builder = DefaultRecordBatchBuilder(
            magic=MAGIC_V2,
            compression_type=_COMPRESSION_NONE,
            is_transactional=False,
            producer_id=_NO_PRODUCER_ID,
            producer_epoch=_NO_PRODUCER_EPOCH,
            base_sequence=_NO_SEQUENCE,
            batch_size=batch_capacity,
        )
        first_ts = base_timestamp_ms + (offset - base_offset) * timestamp_step_ms
        for delta in range(records_per_batch):
            # Records carry offset and timestamp as deltas from the batch's
            # baseOffset / baseTimestamp (KIP-98), hence append(delta, ...).
            meta = builder.append(
                delta,
                timestamp=first_ts + delta * timestamp_step_ms,
                key=b"key-%d" % ((offset + delta) % _KEY_SPACE),
                value=randbytes(value_size),
                headers=[],
            )
            if meta is None:  # pragma: no cover - capacity is computed above
                raise RuntimeError("record batch builder refused a record: capacity miscomputed")
        buf = builder.build()
        # The builder writes baseOffset 0 and leader epoch 0, as a producer
        # does; a broker then stamps both in place. Neither is covered by the
        # CRC, so patching them here keeps the batch valid, exactly as on a broker.
        _INT64.pack_into(buf, 0, offset)
        _INT32.pack_into(buf, 12, partition_leader_epoch)
        batches.append(buf)
        size += len(buf)
        offset += records_per_batch
    return b"".join(batches), offset


class BatchCheckError(ValueError):
    """The bytes are not a well-formed, intact run of v2 record batches."""


# A corrupted batchLength (it is outside the CRC) could otherwise make the
# scanner buffer without bound waiting for a batch that never ends. The broker
# bounds batches by message.max.bytes (default ~1 MiB); 64 MiB leaves room
# for topics configured far above that.
DEFAULT_MAX_BATCH_SIZE = 64 * 1024 * 1024


@dataclass
class BatchScanner:
    """Incremental checker: feed bytes as they arrive (arbitrary chunk
    boundaries); it returns the headers of the batches completed by each
    chunk after verifying each batch's CRC-32C (kafka-python's
    ``calc_crc32c``, the function ``DefaultRecordBatch.validate_crc`` uses)
    and keeps the partial tail for the next call.

    ``expected_next_offset``, when set, is the offset the next batch must start
    at; it is advanced to ``last_offset + 1`` after each batch, so offsets that
    go backwards or leave a gap are caught even across chunks. A scanner that
    has raised BatchCheckError stays failed: its position in the stream is lost.
    """

    expected_next_offset: int | None = None
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    #: Total records (recordCount summed) in the batches verified so far.
    records: int = 0
    #: Batches verified so far.
    batches: int = 0
    #: Bytes of verified batches so far (excludes the pending tail).
    bytes_verified: int = 0
    _pending: bytearray = field(default_factory=bytearray, init=False, repr=False)
    _failed: str | None = field(default=None, init=False, repr=False)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete batch held until more data arrives."""
        return len(self._pending)

    def feed(self, data: bytes | bytearray | memoryview) -> list[BatchHeader]:
        """Consume ``data``; return the headers of batches it completed."""
        if self._failed is not None:
            raise BatchCheckError(f"scanner already failed: {self._failed}")
        incoming = memoryview(data).cast("B")
        try:
            if self._pending:
                self._pending += incoming
                with memoryview(self._pending) as work:
                    headers, consumed = self._scan(work)
                del self._pending[:consumed]
            else:
                # Fast path, the usual one for large reads: check batches in
                # place and copy only the incomplete tail.
                headers, consumed = self._scan(incoming)
                if consumed < len(incoming):
                    self._pending += incoming[consumed:]
        except BatchCheckError as exc:
            self._failed = str(exc)
            raise
        return headers

    def _scan(self, view: memoryview) -> tuple[list[BatchHeader], int]:
        headers: list[BatchHeader] = []
        pos = 0
        end = len(view)
        while end - pos >= LOG_OVERHEAD:
            where = self.bytes_verified  # stream position of this batch
            (batch_length,) = _INT32.unpack_from(view, pos + 8)
            if (batch_length < _MIN_BATCH_LENGTH
                    or batch_length + LOG_OVERHEAD > self.max_batch_size):
                raise BatchCheckError(
                    f"batch at byte {where}: batchLength {batch_length} is outside "
                    f"[{_MIN_BATCH_LENGTH}, {self.max_batch_size - LOG_OVERHEAD}]"
                )
            # Reject a wrong magic as soon as it is visible rather than after
            # buffering a whole (bogus) batch.
            if end - pos > _MAGIC_AT and view[pos + _MAGIC_AT] != MAGIC_V2:
                raise BatchCheckError(
                    f"batch at byte {where}: magic {view[pos + _MAGIC_AT]}, expected {MAGIC_V2}"
                )
            total = LOG_OVERHEAD + batch_length
            if end - pos < total:
                break
            header = BatchHeader(*_HEADER.unpack_from(view, pos))
            actual_crc = _crc32c(view, pos + _CRC_START, pos + total)
            if actual_crc != header.crc:
                raise BatchCheckError(
                    f"batch at byte {where} (baseOffset {header.base_offset}): CRC-32C mismatch, "
                    f"header says {header.crc:#010x}, data gives {actual_crc:#010x}"
                )
            if header.last_offset_delta < 0 or header.record_count < 0:
                raise BatchCheckError(
                    f"batch at byte {where} (baseOffset {header.base_offset}): negative "
                    f"lastOffsetDelta {header.last_offset_delta} "
                    f"or recordCount {header.record_count}"
                )
            expected = self.expected_next_offset
            if expected is not None and header.base_offset != expected:
                kind = "goes backwards" if header.base_offset < expected else "leaves a gap"
                raise BatchCheckError(
                    f"batch at byte {where}: baseOffset {header.base_offset} {kind}, "
                    f"expected {expected}"
                )
            self.expected_next_offset = header.next_offset
            self.records += header.record_count
            self.batches += 1
            self.bytes_verified += total
            headers.append(header)
            pos += total
        return headers, pos


def _crc32c(view: memoryview, start: int, stop: int) -> int:
    # A helper so the slice is dropped before the caller releases `view`
    # (a live slice would make memoryview.release() fail).
    return int(calc_crc32c(view[start:stop]))


def iter_segment_batches(data: bytes | bytearray | memoryview) -> Iterator[BatchHeader]:
    """Check a whole segment and yield its batch headers in order.

    Raises BatchCheckError on any bad batch, and if the segment ends in the
    middle of a batch (a truncated object).
    """
    scanner = BatchScanner()
    yield from scanner.feed(data)
    if scanner.pending_bytes:
        raise BatchCheckError(
            f"segment ends inside a batch: {scanner.pending_bytes} trailing bytes "
            f"after {scanner.bytes_verified} bytes of complete batches"
        )


@dataclass(frozen=True)
class SegmentObject:
    """One remote log segment object as tiered storage would upload it."""

    key: str
    data: bytes
    topic: str
    partition: int
    start_offset: int
    end_offset: int  # inclusive, like RemoteLogSegmentMetadata.endOffset()


def kafka_uuid(rng: random.Random) -> str:
    """A Kafka ``Uuid`` string: 16 bytes as URL-safe base64 without padding
    (22 chars), as ``org.apache.kafka.common.Uuid.toString()`` prints it.

    Like ``Uuid.randomUuid()`` it is a version-4 variant-2 UUID, never the
    reserved all-zero or ``0...01`` ids, and never one whose string starts with
    ``-`` (Kafka avoids those because they read as command-line options).
    """
    while True:
        raw = bytearray(rng.randbytes(16))
        raw[6] = (raw[6] & 0x0F) | 0x40  # version 4 (java.util.UUID.randomUUID)
        raw[8] = (raw[8] & 0x3F) | 0x80  # IETF variant
        text = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode("ascii")
        # The version bits already exclude the zero and one UUIDs; only the
        # leading-dash case can actually occur.
        if not text.startswith("-"):
            return text


def generate_topic_segments(
    *,
    topic: str,
    partitions: int,
    segments_per_partition: int,
    segment_bytes: int,
    value_size: int,
    seed: int,
    prefix: str = "",
    start_time_ms: int = 1_790_000_000_000,
    records_per_batch: int | None = None,
) -> Iterator[SegmentObject]:
    """Yield demo segment objects for one topic in the Aiven tiered-storage
    key layout, one at a time (a 1 GiB data set is never all in memory):

        ``{prefix}{topic}-{topicId}/{partition}/{startOffset:020d}-{segmentId}.log``

    One topicId for the topic and a fresh segmentId per segment (both Kafka
    Uuid strings, like RemoteLogSegmentId); within a partition offsets
    continue from one segment to the next from 0, and timestamps increase by
    1 ms per record from ``start_time_ms``. Deterministic for a given seed.
    """
    if partitions <= 0:
        raise ValueError(f"partitions must be > 0, got {partitions}")
    if segments_per_partition <= 0:
        raise ValueError(f"segments_per_partition must be > 0, got {segments_per_partition}")
    if records_per_batch is None:
        # About 64 KiB batches, near the producer's batch.size of 16 KiB to
        # 1 MiB in practice, and at least one record.
        records_per_batch = max(1, (64 * 1024) // max(1, value_size + 32))
    rng = random.Random(seed)
    topic_id = kafka_uuid(rng)
    for partition in range(partitions):
        next_offset = 0
        for _ in range(segments_per_partition):
            segment_id = kafka_uuid(rng)
            segment_seed = rng.getrandbits(64)
            start_offset = next_offset
            data, next_offset = build_segment(
                start_offset,
                target_bytes=segment_bytes,
                records_per_batch=records_per_batch,
                value_size=value_size,
                # Tie time to offset so it keeps increasing across segments.
                base_timestamp_ms=start_time_ms + start_offset,
                seed=segment_seed,
                timestamp_step_ms=1,
            )
            # Same 20-digit zero padding as the broker's own segment file
            # names (LogFileUtils.filenamePrefixFromOffset).
            key = f"{prefix}{topic}-{topic_id}/{partition}/{start_offset:020d}-{segment_id}.log"
            yield SegmentObject(
                key=key,
                data=data,
                topic=topic,
                partition=partition,
                start_offset=start_offset,
                end_offset=next_offset - 1,
            )


# --- The segment's other objects: its indexes and the plugin's manifest -----------------

#: Kafka's default ``index.interval.bytes``: the broker adds an offset index and a
#: time index entry once more than this many bytes were appended since the last one.
INDEX_INTERVAL_BYTES = 4096
#: The plugin's ``chunk.size`` in its documentation's examples (4 MiB): the manifest's
#: chunk index splits the ``.log`` object into chunks of this size.
AIVEN_CHUNK_SIZE = 4 * 1024 * 1024

# OffsetIndex: relative offset int32, physical position int32.
_OFFSET_INDEX_ENTRY = struct.Struct(">ii")
# TimeIndex: timestamp int64, relative offset int32.
_TIME_INDEX_ENTRY = struct.Struct(">qi")
# ProducerStateManager's snapshot: version int16, crc uint32, then the entries
# (an int32 count); the CRC-32C covers what follows it.
_PRODUCER_SNAPSHOT_HEADER = struct.Struct(">hI")
_PRODUCER_SNAPSHOT_VERSION = 1
_PRODUCER_SNAPSHOT_ENTRIES_AT = _PRODUCER_SNAPSHOT_HEADER.size


@dataclass(frozen=True)
class SegmentIndexes:
    """The index files the broker hands the remote storage manager with a segment
    (``LogSegmentData``); there is no transaction index, as there are no transactions."""

    offset: bytes
    timestamp: bytes
    producer_snapshot: bytes
    leader_epoch: bytes


def build_segment_indexes(
    data: bytes, base_offset: int, index_interval_bytes: int = INDEX_INTERVAL_BYTES
) -> SegmentIndexes:
    """The indexes the broker would have written for the segment ``data``.

    As ``LogSegment.append`` does, one batch at a time: once more than
    ``index_interval_bytes`` were appended since the last entry, the offset index
    maps the batch's last offset to the batch's position, and the time index the
    largest timestamp so far to its offset (if it grew). Rolling the segment adds
    the largest timestamp last (``onBecomeInactiveSegment``). Offsets in both are
    relative to ``base_offset``.
    """
    offset_index = bytearray()
    time_index = bytearray()
    epochs: list[tuple[int, int]] = []  # (leader epoch, its first offset here)
    bytes_since_entry = 0
    position = 0
    max_timestamp, offset_of_max_timestamp = -1, base_offset
    last_indexed_timestamp = -1
    while position < len(data):
        header = parse_batch_header(data[position:position + BATCH_HEADER_SIZE])
        if not epochs or epochs[-1][0] != header.partition_leader_epoch:
            epochs.append((header.partition_leader_epoch, header.base_offset))
        if header.max_timestamp > max_timestamp:
            max_timestamp, offset_of_max_timestamp = header.max_timestamp, header.last_offset
        if bytes_since_entry > index_interval_bytes:
            offset_index += _OFFSET_INDEX_ENTRY.pack(header.last_offset - base_offset, position)
            if max_timestamp > last_indexed_timestamp:
                time_index += _TIME_INDEX_ENTRY.pack(
                    max_timestamp, offset_of_max_timestamp - base_offset)
                last_indexed_timestamp = max_timestamp
            bytes_since_entry = 0
        bytes_since_entry += header.total_size
        position += header.total_size
    if max_timestamp > last_indexed_timestamp:
        time_index += _TIME_INDEX_ENTRY.pack(max_timestamp, offset_of_max_timestamp - base_offset)
    # No idempotent or transactional producer wrote here: a snapshot of no producers.
    entries = _INT32.pack(0)
    producer_snapshot = _PRODUCER_SNAPSHOT_HEADER.pack(
        _PRODUCER_SNAPSHOT_VERSION, int(calc_crc32c(entries))) + entries
    # LeaderEpochCheckpointFile's text form: version 0, the count, "epoch offset" lines.
    # (The broker's own cache also lists the partition's earlier epochs; the demo's
    # partitions have one epoch each.)
    leader_epoch = "".join(
        ["0\n", f"{len(epochs)}\n", *(f"{epoch} {start}\n" for epoch, start in epochs)])
    return SegmentIndexes(bytes(offset_index), bytes(time_index), producer_snapshot,
                          leader_epoch.encode("ascii"))


def aiven_segment_objects(
    segment: SegmentObject, chunk_size: int = AIVEN_CHUNK_SIZE
) -> list[tuple[str, bytes]]:
    """The ``.indexes`` and ``.rsm-manifest`` objects Aiven's plugin uploads beside a
    segment's ``.log`` (its ``RemoteStorageManager.copyLogSegmentData``), as (key, body).

    ``.indexes`` is the indexes back to back: offset, timestamp, producer snapshot,
    leader epoch. The manifest (``SegmentManifestV1``, JSON) says where each one
    lies in it and how the ``.log`` is chunked: ``chunk_size`` chunks, neither
    compressed nor encrypted. The plugin also writes the segment's metadata into
    the manifest, but never reads it back; it is left out here.
    """
    log_key = parse_aiven_key(segment.key)
    if log_key is None or log_key.suffix != "log":
        raise ValueError(f"not the .log key of an Aiven-layout segment: {segment.key!r}")
    indexes = build_segment_indexes(segment.data, segment.start_offset)
    positions: dict[str, dict[str, int] | None] = {}
    position = 0
    for name, body in (("offset", indexes.offset), ("timestamp", indexes.timestamp),
                       ("producerSnapshot", indexes.producer_snapshot),
                       ("leaderEpoch", indexes.leader_epoch)):
        positions[name] = {"position": position, "size": len(body)}
        position += len(body)
    positions["transaction"] = None
    size = len(segment.data)
    last_chunk = size - (max(0, size - 1) // chunk_size) * chunk_size
    manifest = {
        "version": "1",
        "chunkIndex": {"type": "fixed", "originalChunkSize": chunk_size,
                       "originalFileSize": size, "transformedChunkSize": chunk_size,
                       "finalTransformedChunkSize": last_chunk},
        "segmentIndexes": positions,
        "compression": False,
    }
    return [
        (log_key.with_suffix("indexes").key,
         indexes.offset + indexes.timestamp + indexes.producer_snapshot + indexes.leader_epoch),
        (log_key.with_suffix("rsm-manifest").key,
         json.dumps(manifest, separators=(",", ":")).encode()),
    ]
