"""The warm-up plan's validation: the example of docs/ARCHITECTURE.md parses; every bad
field is named."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from spark_warmup.plan import (
    DEFAULT_WARM_RATE,
    OriginSpec,
    PlanError,
    Span,
    load_plan,
    parse_plan,
)

MIB = 1024 * 1024

# The example of docs/ARCHITECTURE.md, verbatim (test_the_documented_example_is_this).
DESIGN_EXAMPLE: dict[str, Any] = {
    "origin": {"endpoint": "http://127.0.0.1:9000", "bucket": "tiered", "prefix": "",
               "region": "us-east-1"},
    "layout": "aiven",
    "sidecars": {"broker-1": "http://10.0.0.1:9331", "broker-2": "http://10.0.0.2:9331"},
    "assignment": {"orders-0": "broker-1", "orders-1": "broker-2"},
    "replays": [
        {"topic": "orders", "partitions": [0, 1], "from_offset": 1000, "to_offset": 500000},
        {"topic": "clicks", "partitions": "all",
         "from_time": "2026-11-01T00:00:00Z", "to_time": "2026-11-01T06:00:00Z"},
    ],
    "ttl_s": 7200,
}


def test_the_documented_example_is_this() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    documented = text.split("### Warm-up plan", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    assert json.loads(documented) == DESIGN_EXAMPLE


def test_a_legacy_us_east_1_bucket_is_an_origin_bucket() -> None:
    """Buckets created in us-east-1 before March 2018 may hold upper case and '_'."""
    plan = parse_plan({**DESIGN_EXAMPLE, "origin": {**DESIGN_EXAMPLE["origin"],
                                                    "bucket": "Kafka_Tiered"}}, env={})
    assert plan.origin.bucket == "Kafka_Tiered"


def test_the_design_example_parses() -> None:
    plan = parse_plan(DESIGN_EXAMPLE, env={})
    assert plan.origin == OriginSpec("http://127.0.0.1:9000", "tiered", "", "us-east-1")
    assert dict(plan.sidecars) == {"broker-1": "http://10.0.0.1:9331",
                                   "broker-2": "http://10.0.0.2:9331"}
    assert dict(plan.assignment) == {"orders-0": "broker-1", "orders-1": "broker-2"}
    orders, clicks = plan.replays
    assert (orders.topic, orders.partitions, orders.offsets, orders.times_ms) == (
        "orders", (0, 1), Span(1000, 500000), None)
    assert clicks.partitions is None and clicks.offsets is None
    # 2026-11-01T00:00:00Z in epoch milliseconds, and six hours later.
    assert clicks.times_ms == Span(1_793_491_200_000, 1_793_491_200_000 + 6 * 3600 * 1000)
    assert plan.ttl_s == 7200.0
    assert plan.admin_token is None
    assert plan.warm_rate("broker-1") == DEFAULT_WARM_RATE == 100 * MIB
    assert plan.block_size == 8 * MIB and plan.concurrency == 4 and plan.retries == 3


def test_optional_keys() -> None:
    document = {**DESIGN_EXAMPLE, "warm_rate": {"broker-2": "200MiB/s"}, "block_size": "1MiB",
                "concurrency": 2, "retries": 0, "admin_token": "s3cret"}
    plan = parse_plan(document, env={"SIDECAR_ADMIN_TOKEN": "from-env"})
    assert plan.warm_rate("broker-1") == 100 * MIB and plan.warm_rate("broker-2") == 200 * MIB
    assert (plan.block_size, plan.concurrency, plan.retries) == (MIB, 2, 0)
    assert plan.admin_token == "s3cret"  # the plan's own token wins over the env


def test_one_rate_for_every_sidecar_and_the_token_from_env() -> None:
    plan = parse_plan({**DESIGN_EXAMPLE, "warm_rate": "1.5GB/s"},
                      env={"SIDECAR_ADMIN_TOKEN": "from-env"})
    assert plan.warm_rate("broker-1") == plan.warm_rate("broker-2") == 1.5e9
    assert plan.admin_token == "from-env"


def test_a_token_from_a_secret_loses_its_newline_as_the_sidecar_reads_it() -> None:
    # A Secret given as an environment variable often ends in a newline; the
    # sidecar strips it from the same variable, and a header cannot carry it.
    plan = parse_plan(DESIGN_EXAMPLE, env={"SIDECAR_ADMIN_TOKEN": "from-secret\n"})
    assert plan.admin_token == "from-secret"
    plan = parse_plan({**DESIGN_EXAMPLE, "admin_token": " s3cret\n"}, env={})
    assert plan.admin_token == "s3cret"


@pytest.mark.parametrize(
    ("document", "env", "message"),
    [
        ({"admin_token": "two words"}, {},
         "admin_token: must be one token (printable ASCII without spaces)"),
        ({"admin_token": "line\nbreak"}, {}, "admin_token: must be one token"),
        ({}, {"SIDECAR_ADMIN_TOKEN": "tab\tinside"}, "SIDECAR_ADMIN_TOKEN: must be one token"),
        ({}, {"SIDECAR_ADMIN_TOKEN": "clé"}, "SIDECAR_ADMIN_TOKEN: must be one token"),
    ],
)
def test_a_token_no_header_can_carry_is_refused_naming_where_it_came_from(
        document: dict[str, Any], env: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan({**DESIGN_EXAMPLE, **document}, env=env)
    assert str(caught.value).startswith(message)
    assert "two words" not in str(caught.value) and "clé" not in str(caught.value)


def test_ranges_may_be_open_or_absent() -> None:
    document = {**DESIGN_EXAMPLE, "replays": [
        {"topic": "a", "to_offset": 10},
        {"topic": "b", "from_offset": 10},
        {"topic": "c", "from_time": 1_700_000_000_000},
        {"topic": "d", "to_time": "2026-11-01T02:00:00+02:00"},
        {"topic": "e"},
    ]}
    a, b, c, d, e = parse_plan(document, env={}).replays
    assert a.offsets == Span(0, 10) and b.offsets == Span(10, None)
    assert c.times_ms == Span(1_700_000_000_000, None)
    assert d.times_ms == Span(0, 1_793_491_200_000)  # the zone is honoured
    assert e.offsets is None and e.times_ms is None and e.partitions is None


def with_change(path: str, value: object) -> dict[str, Any]:
    """DESIGN_EXAMPLE with the field at `path` ('a.b', 'replays.0.x') set, or deleted if ...."""
    document = copy.deepcopy(DESIGN_EXAMPLE)
    *parents, last = path.split(".")
    target: Any = document
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return document


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("origins", {}, "origins: unknown field"),
        ("origin", ..., "origin: missing"),
        ("origin", "http://x", "origin: must be a JSON object"),
        ("origin.endpoint", "ftp://x", "origin.endpoint: must be an http(s) URL"),
        ("origin.endpoint", "http://host:port", "origin.endpoint: bad port"),
        ("origin.endpoint", "http://[::1", "origin.endpoint: not a URL (Invalid IPv6 URL)"),
        ("origin.endpoint", "http://[zz]:9000", "origin.endpoint: not a URL ("),
        ("origin.endpoint", "http://h:\u00b2", "origin.endpoint: bad port"),
        ("sidecars.broker-1", "http://[::1", "sidecars.broker-1: a bracketed IPv6 host"),
        ("origin.bucket", ..., "origin.bucket: missing"),
        ("origin.bucket", "not!a-bucket", "origin.bucket: not an S3 bucket name"),
        ("origin.bucket", "Legacy_" + "x" * 60,
         "origin.bucket: a bucket name of 67 characters: the cache holds objects of buckets"),
        ("origin.prefix", 5, "origin.prefix: must be a string"),
        ("origin.regoin", "x", "origin.regoin: unknown field"),
        ("layout", "plain", "layout: only 'aiven'"),
        ("sidecars", {}, "sidecars: must name at least one"),
        ("sidecars", ..., "sidecars: missing"),
        ("sidecars.broker-1", "10.0.0.1:9331", "sidecars.broker-1: must be an http(s) URL"),
        ("assignment.orders-0", "broker-9", "assignment.orders-0: 'broker-9' is not one of"),
        ("assignment.orders", "broker-1", "assignment.orders: a key must be 'topic-partition'"),
        ("replays", [], "replays: must be a non-empty list"),
        ("replays", ..., "replays: missing"),
        ("replays.0.topic", "bad topic!", "replays[0].topic: not a Kafka topic name"),
        ("replays.0.topic", ..., "replays[0].topic: missing"),
        ("replays.0.partition", [0], "replays[0].partition: unknown field"),
        ("replays.0.partitions", "some", "replays[0].partitions: must be \"all\""),
        ("replays.0.partitions", [], "replays[0].partitions: must be \"all\""),
        ("replays.0.partitions", [0, -1], "replays[0].partitions: -1 is not a partition"),
        ("replays.0.partitions", [1, 1], "replays[0].partitions: lists a partition twice"),
        ("replays.0.partitions", [2**31], "replays[0].partitions: 2147483648 is not a partition"),
        ("replays.0.partitions", [10**30], "replays[0].partitions: 1000000000000000000000000000000 "
         "is not a partition number (0 to 2147483647, as Kafka's)"),
        ("replays.0.to_offset", 10**40, "replays[0].to_offset: must be a non-negative integer "
         "offset (at most 9223372036854775807, as Kafka's)"),
        ("replays.0.from_offset", 2**63, "replays[0].from_offset: must be a non-negative"),
        ("replays.1.from_time", 10**30, "replays[1].from_time: 1000000000000000000000000000000 is "
         "not a Kafka timestamp (epoch milliseconds from 0, 1970-01-01T00:00:00Z, to 922337"),
        ("replays.1.from_time", -1, "replays[1].from_time: -1 is not a Kafka timestamp"),
        ("replays.1.from_time", "1969-12-31T23:59:59Z",
         "replays[1].from_time: '1969-12-31T23:59:59Z' is not a Kafka timestamp"),
        ("assignment", {"orders-2147483648": "broker-1"},
         "assignment.orders-2147483648: a key must be 'topic-partition'"),
        ("replays.0.from_offset", -1, "replays[0].from_offset: must be a non-negative integer"),
        ("replays.0.from_offset", "1000", "replays[0].from_offset: must be a non-negative"),
        ("replays.0.to_offset", 999, "replays[0].to_offset: 999 is before the start"),
        ("replays.0.from_time", "2026-11-01T00:00:00Z", "replays[0]: give an offset range or"),
        ("replays.1.from_time", "2026-11-01 00:00", "replays[1].from_time: must be an ISO 8601"),
        ("replays.1.to_time", "yesterday", "replays[1].to_time: must be an ISO 8601"),
        ("replays.1.to_time", "2026-10-31T00:00:00Z",
         "replays[1].to_time: 1793404800000 is before"),
        ("ttl_s", 0, "ttl_s: must be > 0"),
        ("ttl_s", 8 * 24 * 3600, "ttl_s: must be > 0 and at most 604800"),
        ("ttl_s", "2h", "ttl_s: must be a number"),
        ("ttl_s", 10**400, "ttl_s: must be a number of seconds, got 10000000000000000000... "
         "(401 characters)"),
        ("warm_rate", "fast", "warm_rate: not a rate"),
        ("warm_rate", "100MiB", "warm_rate: not a rate"),
        ("warm_rate", {"broker-3": "1MiB/s"}, "warm_rate.broker-3: not one of the sidecars"),
        ("warm_rate", {"broker-1": "0MiB/s"}, "warm_rate.broker-1: a rate must be positive"),
        ("block_size", "huge", "block_size: not a size"),
        ("block_size", 0, "block_size: must be the sidecars' block size, a multiple of 4KiB "
         "from 64KiB to 256MiB, got 0"),
        # What no sidecar runs with: a warm-up counted in blocks of it says nothing.
        ("block_size", 1, "block_size: must be the sidecars' block size"),
        ("block_size", "1MB", "block_size: must be the sidecars' block size"),
        ("block_size", "1GiB", "block_size: must be the sidecars' block size"),
        ("block_size", 10**400, "block_size: must be the sidecars' block size, a multiple of "
         "4KiB from 64KiB to 256MiB, got 10000000000000000000... (401 characters)"),
        ("block_size", "9" * 400, "block_size: too large: '999"),
        ("warm_rate", "9" * 400 + "/s", "warm_rate: too large: '999"),
        ("concurrency", 0, "concurrency: must be an integer from 1 to 64"),
        ("retries", 11, "retries: must be an integer from 0 to 10"),
        ("admin_token", "", "admin_token: must be a non-empty string"),
    ],
)
def test_bad_plans_name_the_field(path: str, value: object, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(with_change(path, value), env={})
    assert str(caught.value).startswith(message.split(":")[0])
    assert message in str(caught.value)


def test_the_plan_must_be_an_object() -> None:
    with pytest.raises(PlanError, match="plan: must be a JSON object"):
        parse_plan([DESIGN_EXAMPLE], env={})


def test_load_plan_reports_unreadable_and_non_json_files(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read the plan"):
        load_plan(tmp_path / "missing.json", env={})
    broken = tmp_path / "broken.json"
    broken.write_text('{"origin": ')
    with pytest.raises(PlanError, match="not JSON"):
        load_plan(broken, env={})
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(DESIGN_EXAMPLE))
    assert load_plan(good, env={}).ttl_s == 7200.0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"replays": [{"topic": "a"}], "replays": [{"topic": "b"}]}', "replays"),
        ('{"sidecars": {"n1": "http://10.0.0.1:9331", "n1": "http://10.0.0.2:9331"}}', "n1"),
        ('{"replays": [{"topic": "a", "topic": "b"}]}', "topic"),
    ],
)
def test_a_key_given_twice_is_refused_not_dropped(tmp_path: Path, text: str, key: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(text)
    with pytest.raises(PlanError) as caught:
        load_plan(plan, env={})
    assert str(caught.value) == f"{key}: given twice in the same JSON object; give each key once"


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_plan_that_is_not_utf8_is_refused(tmp_path: Path, encoding: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(json.dumps({**DESIGN_EXAMPLE, "admin_token": "clé"},
                                ensure_ascii=False).encode(encoding))
    with pytest.raises(PlanError, match=r"^not UTF-8 text: byte \d+ is 0x[0-9a-f]{2} "):
        load_plan(plan, env={})


def test_a_plan_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PlanError, match=r"^not JSON this job reads: nested too deeply$"):
        load_plan(plan, env={})
