"""`POST /api/v1/warm`: body validation and the decide-then-warm flow, with fakes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from sidecar.admin.warm import (
    MAX_BODY_BYTES,
    MAX_OBJECTS,
    OBJECT_CONCURRENCY,
    RecentWarmCalls,
    WarmAnswer,
    WarmObject,
    WarmRequest,
    WarmRequestError,
    clamp_range,
    parse_warm_body,
    warm,
)
from sidecar.engine import WarmResult
from sidecar.errors import ObjectNotFound, OriginUnavailable
from sidecar.model import ObjectInfo


def body(document: object) -> bytes:
    return json.dumps(document).encode()


def test_a_full_body_parses() -> None:
    request = parse_warm_body(body({
        "objects": [{"bucket": "tiered", "key": "k", "start": 5, "end": 10},
                    {"bucket": "tiered", "key": "k2", "start": 0, "end": None}],
        "ttl_s": 90.5,
    }))
    assert request == WarmRequest(
        (WarmObject("tiered", "k", 5, 10), WarmObject("tiered", "k2", 0, None)), 90.5
    )


def test_defaults_are_the_whole_object_for_an_hour() -> None:
    request = parse_warm_body(body({"objects": [{"bucket": "tiered", "key": "k"}]}))
    assert request == WarmRequest((WarmObject("tiered", "k", 0, None),), 3600.0)


def test_exactly_the_limits_are_accepted() -> None:
    objects = [{"bucket": "tiered", "key": f"k{i}"} for i in range(MAX_OBJECTS)]
    request = parse_warm_body(body({"objects": objects, "ttl_s": 7 * 24 * 3600}))
    assert len(request.objects) == MAX_OBJECTS
    # A legacy us-east-1 name as long as a cache slot records.
    legacy = parse_warm_body(body({"objects": [{"bucket": "Legacy_" + "x" * 56, "key": "k"}]}))
    assert legacy.objects[0].bucket == "Legacy_" + "x" * 56


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "body: not JSON"),
        (b'{"objects": [{"bucket": "tiered", "key": "k"}], "ttl_s": NaN}', "body: not JSON"),
        (b"\xff\xfe", "body: not JSON"),
        (body([1, 2]), "body: must be a JSON object"),
        (body({}), "objects: missing"),
        (body({"objects": [], "ttl_s": 1}), "objects: must name at least one"),
        (body({"objects": {"bucket": "tiered"}}), "objects: must be a list"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}], "ttl": 5}), "unknown field 'ttl'"),
        (body({"objects": [{"bucket": "tiered", "key": "k", "length": 5}]}),
         "objects[0]: unknown field 'length'"),
        (body({"objects": ["b/k"]}), "objects[0]: must be an object"),
        (body({"objects": [{"key": "k"}]}), "objects[0].bucket: missing"),
        (body({"objects": [{"bucket": "tiered"}]}), "objects[0].key: missing"),
        (body({"objects": [{"bucket": "", "key": "k"}]}), "objects[0].bucket: must be a non-empty"),
        (body({"objects": [{"bucket": "tiered", "key": 7}]}),
         "objects[0].key: must be a non-empty"),
        (body({"objects": [{"bucket": "tiered", "key": "k", "start": -1}]}),
         "objects[0].start: must be a non-negative integer"),
        (body({"objects": [{"bucket": "tiered", "key": "k", "start": 1.5}]}), "objects[0].start"),
        (body({"objects": [{"bucket": "tiered", "key": "k", "start": "0"}]}), "objects[0].start"),
        (body({"objects": [{"bucket": "tiered", "key": "k", "start": True}]}), "objects[0].start"),
        (body({"objects": [{"bucket": "tiered", "key": "k", "end": -3}]}), "objects[0].end"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}, {"bucket": "tiered", "key": "k",
                                                          "start": 10, "end": 9}]}),
         "objects[1].end: 9 is before start 10"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}], "ttl_s": 0}), "ttl_s: must be > 0"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}], "ttl_s": -5}), "ttl_s: must be > 0"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}], "ttl_s": 7 * 24 * 3600 + 1}),
         "ttl_s: must be > 0 and at most 604800"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}], "ttl_s": "1h"}),
         "ttl_s: must be a number"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}], "ttl_s": None}),
         "ttl_s: must be a number"),
        (body({"objects": [{"bucket": "tiered", "key": f"k{i}"} for i in range(MAX_OBJECTS + 1)]}),
         f"objects: {MAX_OBJECTS + 1} objects in one call; at most {MAX_OBJECTS}"),
        (b" " * (MAX_BODY_BYTES + 1), "body: larger than"),
        (b"[" * (MAX_BODY_BYTES - 1), "body: not JSON this API reads: nested too deeply"),
        (b'{"objects": [{"bucket": "tiered", "key": "k\\udc80"}]}',
         "objects[0].key: not valid Unicode"),
        (b'{"objects": [{"bucket": "\\ud800", "key": "k"}]}',
         "objects[0].bucket: not valid Unicode"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}, {"bucket": "L" * 64, "key": "k"}]}),
         "objects[1].bucket: a bucket name of 64 characters: the cache holds objects of "
         "buckets named in at most 63"),
        # S3's naming rules, as the data port applies them: told by the field,
        # not sent to the origin.
        (body({"objects": [{"bucket": "ab", "key": "k"}]}),
         "objects[0].bucket: not an S3 bucket name (3-255 letters, digits, '.', '-' and '_'), "
         "got str 'ab'"),
        (body({"objects": [{"bucket": "tiered", "key": "k"}, {"bucket": "two/parts", "key": "k"}]}),
         "objects[1].bucket: not an S3 bucket name (3-255"),
        (body({"objects": [{"bucket": "not a bucket", "key": "k"}]}),
         "objects[0].bucket: not an S3 bucket name (3-255"),
        (body({"objects": [{"bucket": "tiered..logs", "key": "k"}]}),
         "objects[0].bucket: not an S3 bucket name (two dots in a row), got str 'tiered..logs'"),
        (body({"objects": [{"bucket": "L" * 256, "key": "k"}]}),
         "objects[0].bucket: not an S3 bucket name (3-255"),
    ],
)
def test_bad_bodies_name_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(WarmRequestError) as caught:
        parse_warm_body(raw)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("start", "end", "size", "expected"),
    [
        (0, None, 100, (0, 99)),
        (10, 20, 100, (10, 20)),
        (10, 500, 100, (10, 99)),  # end past the object: clamped
        (99, None, 100, (99, 99)),
        (100, None, 100, None),  # start past the object: nothing to warm
        (150, 200, 100, None),
        (0, None, 0, None),  # empty object
    ],
)
def test_clamp_range(start: int, end: int | None, size: int,
                     expected: tuple[int, int] | None) -> None:
    assert clamp_range(start, end, size) == expected


def info(bucket: str, key: str, size: int) -> ObjectInfo:
    return ObjectInfo(bucket, key, size, '"etag"', datetime(2026, 1, 1, tzinfo=UTC))


class FakeOrigin:
    def __init__(self, objects: dict[tuple[str, str], int], buckets: set[str],
                 fail: Exception | None = None) -> None:
        self.objects = objects
        self.buckets = buckets
        self.fail = fail
        self.heads: list[tuple[str, str]] = []

    async def bucket_exists(self, bucket: str) -> bool:
        return bucket in self.buckets

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        self.heads.append((bucket, key))
        if self.fail is not None:
            raise self.fail
        if (bucket, key) not in self.objects:
            raise ObjectNotFound(f"s3://{bucket}/{key}: no such key")
        return info(bucket, key, self.objects[bucket, key])


class FakeEngine:
    """Counts one block per 10 bytes; records what it was asked to warm."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, float]] = []
        self.running = 0
        self.most_running = 0

    async def warm(self, info: ObjectInfo, start: int, end: int, ttl_s: float,
                   concurrency: int = 4) -> WarmResult:
        self.calls.append((info.key, start, end, ttl_s))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await asyncio.sleep(0.001)
        self.running -= 1
        blocks = end // 10 - start // 10 + 1
        return WarmResult(blocks, fetched=blocks, bytes_fetched=end - start + 1)


async def test_warm_sums_over_objects_and_clamps() -> None:
    origin = FakeOrigin({("b", "k1"): 100, ("b", "k2"): 50}, {"b"})
    engine = FakeEngine()
    request = WarmRequest((WarmObject("b", "k1", 0, None), WarmObject("b", "k2", 20, 999),
                           WarmObject("b", "k2", 80, None)), 60.0)
    answer = await warm(request, origin, engine)
    assert answer.status == 200
    assert answer.body == {"requested_blocks": 13, "already_cached": 0, "fetched": 13,
                           "failed": 0, "bytes_fetched": 130}
    # The range past the end of k2 warmed nothing and was never handed on.
    assert sorted(engine.calls) == [("k1", 0, 99, 60.0), ("k2", 20, 49, 60.0)]


async def test_unknown_bucket_is_rejected_before_any_head() -> None:
    origin = FakeOrigin({("b", "k"): 10}, {"b"})
    engine = FakeEngine()
    request = WarmRequest((WarmObject("b", "k"), WarmObject("nope", "k")))
    answer = await warm(request, origin, engine)
    assert answer == type(answer)(400, {"error": "no such bucket: nope"})
    assert origin.heads == [] and engine.calls == []


async def test_one_missing_key_rejects_the_whole_call() -> None:
    objects = {("b", f"k{i}"): 100 for i in range(50)}
    origin = FakeOrigin(objects, {"b"})
    engine = FakeEngine()
    request = WarmRequest(tuple(WarmObject("b", f"k{i}") for i in range(50))
                          + (WarmObject("b", "gone"),))
    answer = await warm(request, origin, engine)
    assert answer.status == 400
    assert answer.body == {"error": "no such key: s3://b/gone"}
    assert engine.calls == []  # every object was HEADed first; nothing was warmed


async def test_origin_down_is_a_503_so_callers_retry() -> None:
    origin = FakeOrigin({}, {"b"}, fail=OriginUnavailable("s3://b/k: origin answered 500"))
    answer = await warm(WarmRequest((WarmObject("b", "k"),)), origin, FakeEngine())
    assert answer.status == 503 and "origin unavailable" in answer.body["error"]
    assert "mode" not in answer.body  # not the 503 of a mode that pauses warm-up


async def test_objects_are_warmed_concurrently_but_bounded() -> None:
    objects = {("b", f"k{i}"): 100 for i in range(40)}
    engine = FakeEngine()
    answer = await warm(WarmRequest(tuple(WarmObject("b", f"k{i}") for i in range(40))),
                        FakeOrigin(objects, {"b"}), engine)
    assert answer.status == 200 and len(engine.calls) == 40
    assert 1 < engine.most_running <= OBJECT_CONCURRENCY


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_recent_warm_calls_show_a_call_while_it_runs_and_how_it_ended() -> None:
    clock = Clock()
    recent = RecentWarmCalls(capacity=3, wall=clock, monotonic=clock)
    call = recent.begin(WarmRequest((WarmObject("b", "orders-0/1.log"), WarmObject("b", "k")),
                                    60.0))
    assert recent.as_json() == [{"started": 1000.0, "objects": 2,
                                 "first_object": "b/orders-0/1.log", "ttl_s": 60.0,
                                 "status": None, "seconds": None, "result": None,
                                 "error": None}]
    clock.now += 2.5
    recent.finish(call, WarmAnswer(200, {"requested_blocks": 3, "already_cached": 1,
                                         "fetched": 2, "failed": 0, "bytes_fetched": 9}))
    [shown] = recent.as_json()
    assert shown["status"] == 200 and shown["seconds"] == 2.5
    assert shown["result"] == {"requested_blocks": 3, "already_cached": 1, "fetched": 2,
                               "failed": 0, "bytes_fetched": 9}


def test_recent_warm_calls_are_bounded_newest_first() -> None:
    clock = Clock()
    recent = RecentWarmCalls(capacity=3, wall=clock, monotonic=clock)
    for i in range(10):
        clock.now = float(i)
        recent.finish(recent.begin(WarmRequest((WarmObject("b", f"k{i}"),))),
                      WarmAnswer(503, {"error": "origin unavailable: " + "x" * 1000}))
    calls = recent.as_json()
    assert [c["first_object"] for c in calls] == ["b/k9", "b/k8", "b/k7"]
    assert calls[0]["status"] == 503 and len(calls[0]["error"]) == 200


def test_a_cancelled_warm_call_says_so_and_a_long_name_is_cut() -> None:
    recent = RecentWarmCalls()
    call = recent.begin(WarmRequest((WarmObject("b", "k" * 5000),)))
    recent.finish(call, None)
    [shown] = recent.as_json()
    assert shown["status"] is None and shown["error"] == "cancelled"
    assert len(shown["first_object"]) == 200
