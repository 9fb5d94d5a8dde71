"""Tests for sidecar.tools.kafka_segments: genuine v2 record batches, built and
checked, cross-checked against kafka-python's own reader."""

from __future__ import annotations

import base64
import inspect
import itertools
import json
import random
import re
import struct
import warnings

import pytest

with warnings.catch_warnings():
    # kafka-python 3.0 warns (legacy importlib.resources API) when the package
    # is first imported; pytest turns warnings into errors here.
    warnings.filterwarnings(
        "ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning
    )
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords
    from kafka.record.util import calc_crc32c

from sidecar.tools import kafka_segments
from sidecar.tools.kafka_segments import (
    BATCH_HEADER_SIZE,
    BatchCheckError,
    BatchHeader,
    BatchScanner,
    aiven_segment_objects,
    build_segment,
    build_segment_indexes,
    generate_topic_segments,
    iter_segment_batches,
    kafka_uuid,
    parse_batch_header,
)

BASE_TS = 1_790_000_000_000

# The Aiven tiered-storage object key layout, written out independently of
# the f-string in the module.
_UUID = r"[A-Za-z0-9_-]{22}"
KEY_RE = re.compile(
    rf"^(?P<prefix>.*?)(?P<topic>[A-Za-z0-9._-]+)-(?P<topic_id>{_UUID})/"
    rf"(?P<partition>\d+)/(?P<offset>\d{{20}})-(?P<segment_id>{_UUID})\.log$"
)


def _segment(
    base_offset: int = 1000,
    *,
    target_bytes: int = 200_000,
    records_per_batch: int = 7,
    value_size: int = 1500,
    seed: int = 42,
    step: int = 3,
) -> tuple[bytes, int]:
    return build_segment(
        base_offset,
        target_bytes=target_bytes,
        records_per_batch=records_per_batch,
        value_size=value_size,
        base_timestamp_ms=BASE_TS,
        seed=seed,
        timestamp_step_ms=step,
    )


def _kafka_batches(data: bytes) -> list[DefaultRecordBatch]:
    records = MemoryRecords(data)
    out = []
    while records.has_next():
        out.append(records.next_batch())
    return out


def _scan_in_random_chunks(
    data: bytes, rng: random.Random
) -> tuple[BatchScanner, list[BatchHeader]]:
    scanner = BatchScanner()
    headers: list[BatchHeader] = []
    pos = 0
    while pos < len(data):
        # Mix tiny chunks (split headers, even the batchLength field) with big ones.
        size = rng.choice([1, 5, 13, 60, 61, 62, rng.randint(1, 4096), rng.randint(1, 60_000)])
        chunk = memoryview(data)[pos : pos + size] if rng.random() < 0.5 else data[pos : pos + size]
        headers.extend(scanner.feed(chunk))
        pos += size
    return scanner, headers


def _batch_spans(data: bytes) -> list[tuple[int, int]]:
    spans = []
    pos = 0
    for header in iter_segment_batches(data):
        spans.append((pos, pos + header.total_size))
        pos += header.total_size
    return spans


# --- build + scan ----------------------------------------------------------


def test_built_segment_matches_kafka_python_reader() -> None:
    data, next_offset = _segment()
    kbatches = _kafka_batches(data)
    headers = list(iter_segment_batches(data))

    assert len(headers) == len(kbatches) > 10
    assert next_offset == 1000 + 7 * len(headers)
    assert sum(b.size_in_bytes for b in kbatches) == len(data)
    for h, kb in zip(headers, kbatches, strict=True):
        assert kb.validate_crc()
        assert h.magic == kb.magic == 2
        assert h.base_offset == kb.base_offset
        assert h.last_offset == kb.last_offset
        assert h.record_count == kb.records_count == 7
        assert h.crc == kb.crc
        assert h.attributes == kb.attributes == 0  # uncompressed, CreateTime, not transactional
        assert h.base_timestamp == kb.first_timestamp
        assert h.max_timestamp == kb.max_timestamp
        assert h.producer_id == kb.producer_id == -1
        assert h.producer_epoch == kb.producer_epoch == -1
        assert h.base_sequence == kb.base_sequence == -1
        assert h.partition_leader_epoch == kb.leader_epoch == 0
        assert h.total_size == kb.size_in_bytes
        assert kb.compression_type == 0 and not kb.is_transactional


def test_records_have_consecutive_offsets_timestamps_and_values() -> None:
    data, next_offset = _segment(records_per_batch=5, value_size=300, step=3)
    offsets: list[int] = []
    for kb in _kafka_batches(data):
        for rec in kb:
            offsets.append(rec.offset)
            assert rec.timestamp == BASE_TS + (rec.offset - 1000) * 3
            assert rec.value is not None and len(rec.value) == 300
            assert rec.key == b"key-%d" % (rec.offset % 1024)
            assert rec.headers == []
    assert offsets == list(range(1000, next_offset))
    # Pseudo-random values: not all the same.
    values = {rec.value for kb in _kafka_batches(data) for rec in kb}
    assert len(values) == len(offsets)


def test_scan_in_random_chunks_matches_whole_scan() -> None:
    data, next_offset = _segment()
    whole = list(iter_segment_batches(data))
    for trial in range(5):
        scanner, headers = _scan_in_random_chunks(data, random.Random(trial))
        assert headers == whole
        assert scanner.pending_bytes == 0
        assert scanner.records == next_offset - 1000
        assert scanner.batches == len(whole)
        assert scanner.bytes_verified == len(data)
        assert scanner.expected_next_offset == next_offset
    offsets = [h.base_offset for h in whole]
    assert offsets == list(range(1000, next_offset, 7))


def test_pending_bytes_holds_the_partial_tail() -> None:
    data, _ = _segment()
    first = parse_batch_header(data)
    scanner = BatchScanner()
    assert scanner.feed(data[: first.total_size - 1]) == []
    assert scanner.pending_bytes == first.total_size - 1
    assert scanner.feed(data[first.total_size - 1 : first.total_size + 10]) == [first]
    assert scanner.pending_bytes == 10
    assert scanner.records == first.record_count


def test_segment_size_stops_at_target() -> None:
    data, _ = _segment(target_bytes=100_000)
    headers = list(iter_segment_batches(data))
    assert len(data) >= 100_000
    # Only the last batch may overshoot.
    assert len(data) - headers[-1].total_size < 100_000


def test_build_is_deterministic_per_seed() -> None:
    assert _segment(seed=7) == _segment(seed=7)
    assert _segment(seed=7)[0] != _segment(seed=8)[0]


def test_build_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        _segment(target_bytes=0)
    with pytest.raises(ValueError):
        _segment(records_per_batch=0)
    with pytest.raises(ValueError):
        _segment(base_offset=-1)


# --- corruption ------------------------------------------------------------


def test_flipping_any_crc_covered_byte_is_caught() -> None:
    data, _ = _segment(target_bytes=600, records_per_batch=3, value_size=40)
    spans = _batch_spans(data)
    assert len(spans) >= 2
    rng = random.Random(0)
    checked = 0
    for start, end in spans:
        # The CRC-32C covers attributes (byte 21 of the batch) to its end.
        for i in range(start + 21, end):
            corrupt = bytearray(data)
            corrupt[i] ^= rng.randint(1, 255)
            with pytest.raises(BatchCheckError):
                list(iter_segment_batches(bytes(corrupt)))
            checked += 1
    assert checked > 500


def test_crc_field_and_magic_corruption_is_caught() -> None:
    data, _ = _segment(target_bytes=600, records_per_batch=3, value_size=40)
    for i in range(16, 21):  # magic, crc
        corrupt = bytearray(data)
        corrupt[i] ^= 0x01
        with pytest.raises(BatchCheckError):
            list(iter_segment_batches(bytes(corrupt)))


def test_leader_epoch_is_outside_the_crc() -> None:
    # Kafka leaves partitionLeaderEpoch out of the CRC so the broker can stamp
    # it; a checker that demanded otherwise would reject real segments.
    data, _ = _segment(target_bytes=600, records_per_batch=3, value_size=40)
    stamped = bytearray(data)
    struct.pack_into(">i", stamped, 12, 17)
    (header,) = [h for h in iter_segment_batches(bytes(stamped)) if h.partition_leader_epoch == 17]
    assert header.base_offset == 1000


def test_bad_magic_is_rejected_before_the_batch_completes() -> None:
    data, _ = _segment()
    corrupt = bytearray(data[:20])
    corrupt[16] = 1
    scanner = BatchScanner()
    with pytest.raises(BatchCheckError, match="magic"):
        scanner.feed(bytes(corrupt))
    # A failed scanner stays failed.
    with pytest.raises(BatchCheckError, match="already failed"):
        scanner.feed(data)


def test_absurd_batch_length_is_rejected() -> None:
    data, _ = _segment()
    corrupt = bytearray(data)
    struct.pack_into(">i", corrupt, 8, 10)  # shorter than the header itself
    with pytest.raises(BatchCheckError, match="batchLength"):
        BatchScanner().feed(bytes(corrupt))
    struct.pack_into(">i", corrupt, 8, 2_000_000_000)
    with pytest.raises(BatchCheckError, match="batchLength"):
        BatchScanner().feed(bytes(corrupt))


def test_truncated_segment_raises() -> None:
    data, _ = _segment()
    with pytest.raises(BatchCheckError, match="ends inside a batch"):
        list(iter_segment_batches(data[:-1]))
    with pytest.raises(BatchCheckError, match="ends inside a batch"):
        list(iter_segment_batches(data[:5]))
    assert list(iter_segment_batches(b"")) == []


# --- offsets ---------------------------------------------------------------


def test_offset_gap_raises() -> None:
    first, next_offset = _segment(target_bytes=20_000)
    second, _ = _segment(next_offset + 1, target_bytes=20_000)
    with pytest.raises(BatchCheckError, match="gap"):
        list(iter_segment_batches(first + second))


def test_offsets_going_backwards_raise() -> None:
    first, _ = _segment(target_bytes=20_000)
    with pytest.raises(BatchCheckError, match="backwards"):
        list(iter_segment_batches(first + first))


def test_contiguous_segments_scan_as_one() -> None:
    first, next_offset = _segment(target_bytes=20_000)
    second, end = _segment(next_offset, target_bytes=20_000, seed=9)
    headers = list(iter_segment_batches(first + second))
    assert headers[0].base_offset == 1000 and headers[-1].last_offset == end - 1


def test_expected_next_offset_is_checked_on_the_first_batch() -> None:
    data, next_offset = _segment(target_bytes=20_000)
    assert BatchScanner(expected_next_offset=1000).feed(data)[-1].next_offset == next_offset
    with pytest.raises(BatchCheckError, match="gap"):
        BatchScanner(expected_next_offset=999).feed(data)
    with pytest.raises(BatchCheckError, match="backwards"):
        BatchScanner(expected_next_offset=1001).feed(data)


# --- parse_batch_header ----------------------------------------------------


def test_parse_batch_header_errors() -> None:
    data, _ = _segment()
    with pytest.raises(ValueError, match="61"):
        parse_batch_header(data[:BATCH_HEADER_SIZE - 1])
    old = bytearray(data[:BATCH_HEADER_SIZE])
    old[16] = 1
    with pytest.raises(ValueError, match="magic 1"):
        parse_batch_header(bytes(old))
    header = parse_batch_header(memoryview(data)[:BATCH_HEADER_SIZE])
    assert header.base_offset == 1000 and header.record_count == 7


# --- Aiven layout ----------------------------------------------------------


def _generate(**overrides: object) -> list[kafka_segments.SegmentObject]:
    args: dict[str, object] = dict(
        topic="orders.v1",
        partitions=3,
        segments_per_partition=3,
        segment_bytes=30_000,
        value_size=1024,
        seed=5,
        prefix="tiered/",
    )
    args.update(overrides)
    return list(generate_topic_segments(**args))  # type: ignore[arg-type]


def test_generated_keys_follow_the_aiven_layout() -> None:
    objects = _generate()
    assert len(objects) == 9
    topic_ids = set()
    segment_ids = set()
    for obj in objects:
        m = KEY_RE.match(obj.key)
        assert m, obj.key
        assert m["prefix"] == "tiered/"
        assert m["topic"] == obj.topic == "orders.v1"
        assert int(m["partition"]) == obj.partition
        assert int(m["offset"]) == obj.start_offset
        topic_ids.add(m["topic_id"])
        segment_ids.add(m["segment_id"])
    assert len(topic_ids) == 1
    assert len(segment_ids) == 9
    assert sorted({o.partition for o in objects}) == [0, 1, 2]


def test_generated_offsets_and_timestamps_continue_across_segments() -> None:
    objects = _generate()
    for partition in range(3):
        segs = [o for o in objects if o.partition == partition]
        assert segs[0].start_offset == 0
        prev_end = -1
        prev_max_ts = -1
        for obj in segs:
            assert obj.start_offset == prev_end + 1
            headers = list(iter_segment_batches(obj.data))
            assert headers[0].base_offset == obj.start_offset
            assert headers[-1].last_offset == obj.end_offset
            assert len(obj.data) >= 30_000
            assert headers[0].base_timestamp > prev_max_ts
            prev_end = obj.end_offset
            prev_max_ts = headers[-1].max_timestamp


def test_generation_is_deterministic_and_seeded() -> None:
    a = _generate(partitions=1, segments_per_partition=2)
    b = _generate(partitions=1, segments_per_partition=2)
    c = _generate(partitions=1, segments_per_partition=2, seed=6)
    assert a == b
    assert [o.key for o in a] != [o.key for o in c]
    assert a[0].data != c[0].data


def test_generation_is_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = kafka_segments.build_segment

    def counting(*args: object, **kwargs: object) -> tuple[bytes, int]:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kafka_segments, "build_segment", counting)
    gen = generate_topic_segments(
        topic="t", partitions=4, segments_per_partition=100,
        segment_bytes=10_000, value_size=1024, seed=1,
    )
    assert inspect.isgenerator(gen)
    assert calls == 0
    next(gen)
    next(gen)
    assert calls == 2


# --- kafka_uuid ------------------------------------------------------------


def test_kafka_uuid_format() -> None:
    rng = random.Random(3)
    ids = [kafka_uuid(rng) for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert len(text) == 22
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", text)
        # Uuid.randomUuid() never yields a string starting with '-' (about 1 in
        # 64 raw draws would), so 5000 draws would show one.
        assert not text.startswith("-")
        raw = base64.urlsafe_b64decode(text + "==")
        assert len(raw) == 16
        assert raw[6] >> 4 == 4  # version 4
        assert raw[8] >> 6 == 0b10  # IETF variant
    assert kafka_uuid(random.Random(3)) == ids[0]


# --- indexes and manifest -------------------------------------------------------------


@pytest.mark.parametrize("interval", [4096, 30_000, 10**9])
def test_index_entries_follow_the_brokers_interval(interval: int) -> None:
    base = 1000
    data, _ = _segment(base)  # ~10 KiB batches
    batches = list(iter_segment_batches(data))
    positions = [0, *itertools.accumulate(batch.total_size for batch in batches)][:-1]
    # A batch gets an entry when more than `interval` bytes lie between the last
    # entry's batch (or the segment's start) and its own start.
    expected, last = [], 0
    for batch, position in zip(batches, positions, strict=True):
        if position - last > interval:
            expected.append((batch.last_offset - base, position))
            last = position
    indexes = build_segment_indexes(data, base, interval)
    assert list(struct.iter_unpack(">ii", indexes.offset)) == expected
    times = list(struct.iter_unpack(">qi", indexes.timestamp))
    # Timestamps grow with offsets here, so the time index marks the same batches,
    # then the segment's largest timestamp, added when it was rolled unless the
    # last entry holds it already.
    marked = [(batches[positions.index(position)].max_timestamp, offset)
              for offset, position in expected]
    rolled = (batches[-1].max_timestamp, batches[-1].last_offset - base)
    assert times == marked + ([rolled] if rolled not in marked else [])


def test_producer_snapshot_and_leader_epochs() -> None:
    data, _ = _segment(1000)
    indexes = build_segment_indexes(data, 1000)
    version, crc = struct.unpack_from(">hI", indexes.producer_snapshot)
    rest = indexes.producer_snapshot[6:]
    assert (version, rest) == (1, struct.pack(">i", 0)) and crc == calc_crc32c(rest)
    assert indexes.leader_epoch == b"0\n1\n0 1000\n"


def test_aiven_objects_are_the_indexes_and_a_manifest_locating_them() -> None:
    (segment,) = generate_topic_segments(
        topic="orders", partitions=1, segments_per_partition=1, segment_bytes=300_000,
        value_size=1000, seed=3)
    chunk = 128 * 1024
    (indexes_key, indexes), (manifest_key, manifest_bytes) = aiven_segment_objects(
        segment, chunk_size=chunk)
    stem = segment.key.removesuffix(".log")
    assert (indexes_key, manifest_key) == (stem + ".indexes", stem + ".rsm-manifest")
    built = build_segment_indexes(segment.data, segment.start_offset)
    manifest = json.loads(manifest_bytes)
    parts = manifest["segmentIndexes"]
    for name, body in (("offset", built.offset), ("timestamp", built.timestamp),
                       ("producerSnapshot", built.producer_snapshot),
                       ("leaderEpoch", built.leader_epoch)):
        start = parts[name]["position"]
        assert indexes[start:start + parts[name]["size"]] == body
    assert parts["transaction"] is None
    assert manifest["chunkIndex"] == {
        "type": "fixed", "originalChunkSize": chunk, "originalFileSize": len(segment.data),
        "transformedChunkSize": chunk, "finalTransformedChunkSize": len(segment.data) % chunk,
    }
    assert manifest["version"] == "1" and manifest["compression"] is False
    with pytest.raises(ValueError, match=r"not the \.log key"):
        aiven_segment_objects(kafka_segments.SegmentObject(
            key=indexes_key, data=segment.data, topic="orders", partition=0,
            start_offset=0, end_offset=segment.end_offset))
