"""`sidecar replay`: the pure parts, and the reader against a scripted S3 client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ParamValidationError

from sidecar.errors import ConfigError, OriginUnavailable
from sidecar.layout import parse_aiven_key
from sidecar.tools.kafka_segments import BatchCheckError, build_segment, iter_segment_batches
from sidecar.tools.range_answers import body_length, object_size
from sidecar.tools.replay import (
    PartitionPlan,
    Replayer,
    ReplayOptions,
    Tally,
    build_report,
    format_summary,
    hit_ratios,
    list_prefix,
    next_fetch_position,
    percentile,
    plan_partitions,
)
from sidecar.tools.replay_flags import check_bucket, parse_partitions, parse_range

MIB = 1024 * 1024
TOPIC_ID = "Qx-9_aBcDeFgHiJkLmNoPw"
OTHER_ID = "Zz9_aBcDeFgHiJkLmNoPw0"


def seg_key(topic: str, partition: int, offset: int, *, topic_id: str = TOPIC_ID,
            suffix: str = "log", prefix: str = "") -> str:
    segment_id = f"s{offset:021d}"[-22:]
    return f"{prefix}{topic}-{topic_id}/{partition}/{offset:020d}-{segment_id}.{suffix}"


# --- options -----------------------------------------------------------------


def test_parse_partitions() -> None:
    assert parse_partitions("all") is None
    assert parse_partitions(" ALL ") is None
    assert parse_partitions("0,1") == frozenset({0, 1})
    assert parse_partitions("3") == frozenset({3})


@pytest.mark.parametrize("text", ["", "a", "1,", "-1", "0;1", "1-3"])
def test_parse_partitions_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--partitions"):
        parse_partitions(text)


def test_check_bucket() -> None:
    assert check_bucket("tiered-storage.eu_1") == "tiered-storage.eu_1"
    assert check_bucket("A" * 255) == "A" * 255


@pytest.mark.parametrize("name", ["", "a/b", "a b", "a" * 256, "s3://bucket", "caf\u00e9"])
def test_check_bucket_rejects(name: str) -> None:
    with pytest.raises(ConfigError, match="--bucket: expected a bucket name") as caught:
        check_bucket(name)
    assert len(str(caught.value)) < 200


async def test_a_request_botocore_refuses_is_a_usage_error_not_an_outage() -> None:
    replayer = Replayer(ReplayOptions("http://127.0.0.1:1", "bkt"), None, None)

    async def refused() -> None:
        raise ParamValidationError(report='Invalid bucket name "a/b": Bucket name must '
                                          'match the regex "^[a-zA-Z0-9.\\-_]{1,255}$"')

    with pytest.raises(ConfigError, match=r'not a valid request \(Invalid bucket name "a/b"\)$'):
        await replayer.call(refused(), "k")


def test_list_prefix() -> None:
    assert list_prefix("", None) == ""
    assert list_prefix("tiered/", None) == "tiered/"
    assert list_prefix("tiered/", "orders") == "tiered/orders-"


# --- planning ------------------------------------------------------------------


def test_plan_groups_per_partition_in_offset_order() -> None:
    keys = [
        seg_key("orders", 1, 500), seg_key("orders", 0, 900), seg_key("orders", 0, 0),
        seg_key("orders", 0, 300), seg_key("clicks", 0, 7),
        seg_key("orders", 0, 300, suffix="indexes"),
        seg_key("orders", 0, 300, suffix="rsm-manifest"),
        "orders/not-a-segment.log", "README",
    ]
    plans = plan_partitions(keys, "", None, None)
    assert [(p.topic, p.partition) for p in plans] == [("clicks", 0), ("orders", 0), ("orders", 1)]
    orders0 = plans[1]
    assert [s.start_offset for s in orders0.segments] == [0, 300, 900]
    assert all(s.suffix == "log" for p in plans for s in p.segments)


def test_plan_keeps_topic_ids_apart() -> None:
    # A topic deleted and re-created keeps its name but gets a new id: its
    # offsets start again, so the two must not be read as one partition.
    keys = [seg_key("orders", 0, 0), seg_key("orders", 0, 0, topic_id=OTHER_ID)]
    plans = plan_partitions(keys, "", None, None)
    assert len(plans) == 2 and {p.topic_id for p in plans} == {TOPIC_ID, OTHER_ID}


def test_plan_filters_topic_and_partitions() -> None:
    keys = [seg_key("orders", p, 0) for p in range(3)] + [
        seg_key("orders-eu", 0, 0), seg_key("clicks", 1, 0),
    ]
    plans = plan_partitions(keys, "", "orders", frozenset({0, 2}))
    assert [(p.topic, p.partition) for p in plans] == [("orders", 0), ("orders", 2)]
    assert [p.topic for p in plan_partitions(keys, "", "orders-eu", None)] == ["orders-eu"]


def test_plan_with_prefix() -> None:
    keys = [seg_key("orders", 0, 0, prefix="tiered/"), seg_key("orders", 0, 0)]
    plans = plan_partitions(keys, "tiered/", None, None)
    assert len(plans) == 1 and plans[0].segments[0].prefix == "tiered/"
    assert plan_partitions([], "", None, None) == []


# --- fetch positions -----------------------------------------------------------------


def test_object_size() -> None:
    assert object_size(0, 100, "bytes 0-99/100") == 100
    assert object_size(40, 60, "bytes 40-99/100") == 100
    assert object_size(0, 100, None) == 100  # a 200 to bytes=0- is the whole object
    with pytest.raises(OriginUnavailable, match="ignored Range"):
        object_size(40, 100, None)


@pytest.mark.parametrize("content_range", ["bytes 0-99/*", "bytes */100", "items 0-9/10"])
def test_object_size_of_a_content_range_without_a_size_is_an_endpoint_fault(
        content_range: str) -> None:
    with pytest.raises(OriginUnavailable, match="not bytes FIRST-LAST/SIZE"):
        object_size(40, 60, content_range)


def test_body_length_without_a_content_length_is_the_range_it_says_it_is() -> None:
    assert body_length(60, "bytes 40-99/100") == 60
    assert body_length(None, "bytes 40-99/100") == 60
    with pytest.raises(OriginUnavailable, match="neither Content-Length nor Content-Range"):
        body_length(None, None)


def test_next_fetch_position() -> None:
    # Two whole batches (300 bytes) and part of a third: re-read from the third.
    assert next_fetch_position(1000, 300, 50, 2000) == 1300
    # Everything to the end of the object: the segment is done.
    assert next_fetch_position(1000, 1000, 0, 2000) is None


def test_next_fetch_position_truncated_segment() -> None:
    # The fetch reached the end of the object with half a batch left over:
    # re-reading it would never complete it.
    with pytest.raises(BatchCheckError, match="ends inside a batch"):
        next_fetch_position(1000, 900, 100, 2000)
    with pytest.raises(BatchCheckError, match="ends inside a batch"):
        next_fetch_position(1000, 0, 1000, 2000)


# --- measures --------------------------------------------------------------------


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 50) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([], 50) is None


def stats(hits: int, misses: int, cache: int, origin: int, origin_bytes: int) -> dict[str, Any]:
    return {"hits": hits, "misses": misses, "served_bytes": {"cache": cache, "origin": origin},
            "origin_bytes": origin_bytes, "block_hit_ratio": 0.123}


def test_hit_ratios_are_deltas() -> None:
    before = stats(100, 100, 1000, 1000, 5000)
    after = stats(130, 110, 1900, 1100, 5400)
    assert hit_ratios(before, after) == {
        "block_hit_ratio": 30 / 40, "byte_hit_ratio": 900 / 1000, "origin_bytes": 400,
    }


def test_hit_ratios_without_traffic() -> None:
    same = stats(5, 5, 10, 10, 10)
    assert hit_ratios(same, same) == {
        "block_hit_ratio": None, "byte_hit_ratio": None, "origin_bytes": 0,
    }


def test_hit_ratios_of_a_sidecar_restarted_during_the_replay_are_unknown(
        caplog: pytest.LogCaptureFixture) -> None:
    # It served 40 lookups before the replay, restarted, then served 10 more.
    before = stats(30, 10, 3000, 1000, 1000)
    after = stats(9, 1, 900, 100, 100)
    assert hit_ratios(before, after) == {
        "block_hit_ratio": None, "byte_hit_ratio": None, "origin_bytes": None,
    }
    assert "restarted" in caplog.text


REPORT_KEYS = {
    "endpoint", "bucket", "partitions", "segments", "fetches", "records", "batches", "bytes",
    "seconds", "mb_per_s", "mib_per_s", "records_per_s", "fetch_latency_ms", "crc_errors",
    "block_hit_ratio", "byte_hit_ratio", "origin_bytes", "fetch_hit_ratio",
}
OPTIONS = ReplayOptions(endpoint="http://s3.test", bucket="tiered")


def test_report_keys_and_values() -> None:
    tally = Tally(partitions=2, segments=3, records=1000, batches=10, bytes=4_000_000,
                  errors=1, latencies_s=[0.010, 0.030, 0.020],
                  cache_headers=["hit", "miss", "hit", "hit"])
    report = build_report(OPTIONS, tally, 2.0, None)
    assert set(report) == REPORT_KEYS
    assert set(report["fetch_latency_ms"]) == {"p50", "p99", "max"}
    assert report["fetches"] == 3 and report["crc_errors"] == 1
    assert report["mb_per_s"] == 2.0 and report["records_per_s"] == 500.0
    assert report["fetch_latency_ms"] == {"p50": 20.0, "p99": 30.0, "max": 30.0}
    assert report["fetch_hit_ratio"] == 0.75
    assert report["block_hit_ratio"] is None and report["origin_bytes"] is None
    json.dumps(report)  # serialisable as is


def test_report_with_sidecar_ratios_and_nothing_read() -> None:
    ratios = {"block_hit_ratio": 0.5, "byte_hit_ratio": 0.25, "origin_bytes": 77}
    report = build_report(OPTIONS, Tally(), 0.0, ratios)
    assert report["block_hit_ratio"] == 0.5 and report["origin_bytes"] == 77
    assert report["mb_per_s"] is None and report["fetch_hit_ratio"] is None
    assert report["fetch_latency_ms"] == {"p50": None, "p99": None, "max": None}


def test_format_summary() -> None:
    tally = Tally(partitions=2, segments=3, records=1000, batches=10, bytes=4_000_000,
                  latencies_s=[0.010, 0.030])
    ratios = {"block_hit_ratio": 0.5, "byte_hit_ratio": None, "origin_bytes": 2_000_000}
    text = format_summary(build_report(OPTIONS, tally, 2.0, ratios))
    lines = text.splitlines()
    assert len(lines) == 7
    # Aligned: every value starts in the same column.
    assert len({len(line) - len(line[15:].lstrip()) for line in lines}) == 1
    # MiB throughout, as `sidecar stats` says.
    assert "3.8 MiB in 2.00 s" in text and "1.91 MiB/s" in text
    assert "p99 30.0 ms" in text and "0 failed" in text
    assert "block 50.00%" in text and "byte n/a" in text and "origin read 1.9 MiB" in text
    assert " MB" not in text


# --- the reader, against a scripted client -----------------------------------------------


@dataclass
class FakeBody:
    data: bytes
    closed: bool = False
    position: int = 0

    async def read(self, amount: int) -> bytes:
        assert not self.closed
        # Hand out at most 10 000 bytes at a time, as a socket would.
        chunk = self.data[self.position:self.position + min(amount, 10_000)]
        self.position += len(chunk)
        return chunk

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeS3:
    objects: dict[str, bytes]
    page_size: int = 1000
    ranges: list[tuple[str, str]] = field(default_factory=list)
    listings: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[FakeBody] = field(default_factory=list)
    cache_header: str | None = None

    async def list_objects_v2(self, **params: Any) -> dict[str, Any]:
        self.listings.append(params)
        keys = sorted(k for k in self.objects if k.startswith(params["Prefix"]))
        start = int(params.get("ContinuationToken", "0"))
        page = keys[start:start + self.page_size]
        more = start + self.page_size < len(keys)
        answer: dict[str, Any] = {
            "Contents": [{"Key": k, "Size": len(self.objects[k])} for k in page],
            "IsTruncated": more,
        }
        if more:
            answer["NextContinuationToken"] = str(start + self.page_size)
        return answer

    async def get_object(self, Bucket: str, Key: str, Range: str) -> dict[str, Any]:
        self.ranges.append((Key, Range))
        data = self.objects[Key]
        assert Range.startswith("bytes=") and Range.endswith("-")  # open-ended, as Kafka
        start = int(Range[len("bytes="):-1])
        body = FakeBody(data[start:])
        self.bodies.append(body)
        headers = {"x-sidecar-cache": self.cache_header} if self.cache_header else {}
        return {"Body": body, "ContentLength": len(data) - start,
                "ContentRange": f"bytes {start}-{len(data) - 1}/{len(data)}",
                "ResponseMetadata": {"HTTPHeaders": headers}}


def segments(partition: int, count: int, *, size: int = 50_000) -> dict[str, bytes]:
    objects: dict[str, bytes] = {}
    offset = 0
    for index in range(count):
        data, following = build_segment(offset, target_bytes=size, records_per_batch=7,
                                        value_size=700, base_timestamp_ms=0, seed=index)
        objects[seg_key("orders", partition, offset)] = data
        offset = following
    return objects


def batch_starts(data: bytes) -> list[int]:
    starts, position = [], 0
    for header in iter_segment_batches(data):
        starts.append(position)
        position += header.total_size
    return starts


def plan_of(objects: dict[str, bytes]) -> list[PartitionPlan]:
    return plan_partitions(objects, "", None, None)


async def replay(s3: FakeS3, **options: Any) -> Replayer:
    replay_options = ReplayOptions(endpoint="http://s3.test", bucket="tiered", **options)
    replayer = Replayer(replay_options, s3, s3)
    await replayer.run(plan_of(s3.objects))
    return replayer


async def test_list_keys_paginates_with_prefix_only() -> None:
    objects = {seg_key("orders", 0, n): b"x" for n in range(5)} | {seg_key("clicks", 0, 0): b"x"}
    objects[seg_key("orders", 0, 99)] = b""  # an empty object has no batches to read
    s3 = FakeS3(objects, page_size=2)
    replayer = Replayer(ReplayOptions(endpoint="e", bucket="tiered", topic="orders"), s3, s3)
    keys = await replayer.list_keys()
    assert list(keys) == [seg_key("orders", 0, n) for n in range(5)]
    assert s3.listings[0] == {"Bucket": "tiered", "Prefix": "orders-"}
    assert s3.listings[1] == {"Bucket": "tiered", "Prefix": "orders-", "ContinuationToken": "2"}
    assert len(s3.listings) == 3


class StuckListing(FakeS3):
    """A store whose listing says "more" with the token it was given."""

    async def list_objects_v2(self, **params: Any) -> dict[str, Any]:
        await asyncio.sleep(0)  # a real call yields to the loop
        self.listings.append(params)
        return {"Contents": [{"Key": seg_key("orders", 0, 0), "Size": 1}],
                "IsTruncated": True, "NextContinuationToken": "again"}


async def test_a_listing_that_repeats_its_token_is_an_error_not_a_loop() -> None:
    s3 = StuckListing({})
    replayer = Replayer(ReplayOptions(endpoint="e", bucket="tiered"), s3, s3)
    with pytest.raises(OriginUnavailable, match="same continuation token twice"):
        await asyncio.wait_for(replayer.list_keys(), 5)
    assert len(s3.listings) == 2


async def test_fetches_restart_after_the_last_whole_batch() -> None:
    objects = segments(0, 2)
    s3 = FakeS3(objects)
    replayer = await replay(s3, fetch_bytes=12_000)
    tally = replayer.tally
    assert tally.errors == 0
    assert tally.bytes == sum(len(d) for d in objects.values())
    assert tally.records == sum(h.record_count for d in objects.values()
                                for h in iter_segment_batches(d))
    assert tally.segments == 2 and tally.partitions == 1
    for key, data in objects.items():
        starts = [int(r[len("bytes="):-1]) for k, r in s3.ranges if k == key]
        # Each fetch starts on a batch boundary after the previous one, from 0.
        assert starts[0] == 0 and starts == sorted(set(starts))
        assert set(starts) <= set(batch_starts(data))
        assert len(starts) > 2
    # Every stream was dropped after its fetch, with the rest unread.
    assert all(body.closed for body in s3.bodies)
    assert any(body.position < len(body.data) for body in s3.bodies)
    # Keys are read in offset order, one segment after the other.
    read_order = list(dict.fromkeys(k for k, _ in s3.ranges))
    assert read_order == sorted(objects, key=lambda k: parse_aiven_key(k).start_offset)  # type: ignore[union-attr]


async def test_a_fetch_smaller_than_a_batch_still_delivers_one() -> None:
    # KIP-74: a fetch returns at least one whole batch even past its size limit.
    objects = segments(0, 1)
    s3 = FakeS3(objects)
    replayer = await replay(s3, fetch_bytes=100)
    assert replayer.tally.errors == 0
    assert len(s3.ranges) == len(batch_starts(next(iter(objects.values()))))


async def test_offsets_continue_across_segments() -> None:
    objects = segments(0, 2)
    first = sorted(objects)[0]
    # Re-key the second segment as if it started at offset 0 again: its first
    # batch no longer follows the first segment's last one.
    s3 = FakeS3({first: objects[first], seg_key("orders", 0, 1): objects[first]})
    replayer = await replay(s3)
    assert replayer.tally.errors == 1


async def test_corrupt_batch_is_counted_and_the_partition_goes_on() -> None:
    objects = segments(0, 2)
    first = sorted(objects)[0]
    third_batch = batch_starts(objects[first])[2]
    damaged = bytearray(objects[first])
    damaged[third_batch + 100] ^= 0x01  # inside the third batch's records
    objects[first] = bytes(damaged)
    s3 = FakeS3(objects)
    replayer = await replay(s3, fetch_bytes=4096)
    assert replayer.tally.errors == 1
    # The second segment was still read in full, from its own start offset.
    second = sorted(objects)[1]
    assert (second, "bytes=0-") in s3.ranges
    assert replayer.tally.bytes == third_batch + len(objects[second])


async def test_truncated_segment_is_an_error_not_a_loop() -> None:
    objects = segments(0, 1)
    key = next(iter(objects))
    objects[key] = objects[key][:-10]
    s3 = FakeS3(objects)
    replayer = await replay(s3, fetch_bytes=30_000)
    assert replayer.tally.errors == 1
    assert len(s3.ranges) == 2


async def test_max_bytes_stops_early() -> None:
    objects = segments(0, 3) | segments(1, 3)
    s3 = FakeS3(objects)
    replayer = await replay(s3, fetch_bytes=10_000, max_bytes=30_000, concurrency=1)
    assert 30_000 <= replayer.tally.bytes < 30_000 + 20_000
    assert replayer.tally.partitions == 1


async def test_cache_header_is_collected() -> None:
    s3 = FakeS3(segments(0, 1), cache_header="HIT")
    replayer = await replay(s3)
    assert replayer.tally.cache_headers == ["hit"] * len(s3.ranges)


async def test_progress_lines_say_bytes_of_the_total_segments_and_rate(
    capsys: pytest.CaptureFixture[str]
) -> None:
    options = ReplayOptions(endpoint="e", bucket="tiered", progress_s=0.01)
    replayer = Replayer(options, FakeS3({}), FakeS3({}))
    replayer.tally.bytes, replayer.tally.segments = 3 * MIB, 2
    reporting = asyncio.create_task(replayer.report_progress(12 * MIB, 8))
    try:
        for _ in range(500):  # at most 5 s
            await asyncio.sleep(0.01)
            if "replay:" in (seen := capsys.readouterr().err):
                break
        else:
            raise AssertionError("no progress line in 5 s")
    finally:
        reporting.cancel()
    line = seen.splitlines()[0]
    assert line.startswith("replay: 3.0 of 12.0 MiB (25%), 2 of 8 segments, ") and \
        line.endswith(" MiB/s")


@pytest.mark.parametrize("kind,first,last,expected", [
    ("offset", None, None, None),
    ("offset", 5, None, (5, None)),
    ("offset", None, 7, (0, 7)),
    ("time", "2026-11-01T00:00:00Z", "1793491200001", (1_793_491_200_000, 1_793_491_200_001)),
])
def test_ranges_from_flags(kind: str, first: Any, last: Any, expected: Any) -> None:
    assert parse_range(kind, first, last) == expected
