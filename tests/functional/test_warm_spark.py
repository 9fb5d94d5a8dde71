"""The Spark warm-up job against moto, two sidecar processes and Spark (local[2] and standalone).

Plans that name a Kafka cluster: a real two-broker cluster (sidecar/tools/broker.py)
with a real lagging group shows the whole path, leaders and committed offsets read
from it, each leader's sidecar warmed, the group's catch-up then served from the
cache. The other cluster cases read a Kafka-protocol stand-in
(tests/support/kafka_broker.py), for what a small real cluster here cannot show
cheaply: partitions with replicas on two racks and rack-aware follower choice,
exact lag arithmetic over the segments built for this module, and a cluster that
cannot be reached.

One bucket of genuine Kafka segments for the module (1.5 MiB segments, two 1 MiB
blocks each) and one local[2] session; every test gets two fresh sidecars.
"""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from sidecar.layout import parse_aiven_key
from sidecar.tools.broker import TIERED_TOPIC, KafkaCluster, RemoteStorage
from sidecar.tools.catch_up import catch_up, commit_group, produce
from sidecar.tools.kafka_segments import (
    SegmentObject,
    generate_topic_segments,
    iter_segment_batches,
)
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from sidecar.tools.ports import free_port
from spark_warmup.cluster import read_cluster
from spark_warmup.job import RunResult, run
from spark_warmup.metadata import GroupPosition
from spark_warmup.outcome import WarmRow, summarize
from spark_warmup.plan import PlanError, parse_plan
from spark_warmup.report import REPORT_SCHEMA, write_report
from spark_warmup.routing import rendezvous_node
from spark_warmup.units import format_bytes
from tests.support.kafka_broker import (
    FakeKafkaCluster,
    FixtureBroker,
    FixtureCluster,
    FixturePartition,
    running_cluster,
)
from tests.support.loopback_http import admin_call
from tests.support.processes import SidecarProcess, start_together, stop_together
from tests.support.replay_cli import replay_json
from tests.support.s3_clients import s3_client
from tests.support.spark_cluster import StandaloneCluster

MIB = 1024 * 1024
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
SEGMENT_BYTES = 1536 * 1024
START_TIME_MS = 1_790_000_000_000  # generate_topic_segments' default; a record's ts = this + offset
TOPICS = {"orders": (2, 4), "clicks": (2, 3), "audit": (1, 2)}  # partitions, segments each
NODES = ("a", "b")
INDEXES = b"idx"  # each segment's .indexes object, one block


@dataclass(frozen=True)
class Data:
    bucket: str
    segments: tuple[SegmentObject, ...]

    def of(self, topic: str, partition: int) -> list[SegmentObject]:
        return sorted((s for s in self.segments if s.topic == topic and s.partition == partition),
                      key=lambda s: s.start_offset)


@pytest.fixture(scope="module")
def data(origin_s3: Any) -> Data:
    bucket = "warm-" + secrets.token_hex(6)
    origin_s3.create_bucket(Bucket=bucket)
    segments = []
    for seed, (topic, (partitions, count)) in enumerate(TOPICS.items()):
        for segment in generate_topic_segments(
            topic=topic, partitions=partitions, segments_per_partition=count,
            segment_bytes=SEGMENT_BYTES, value_size=2048, seed=100 + seed,
        ):
            origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
            # The indexes the plugin also writes, which the job warms with their segment.
            origin_s3.put_object(Bucket=bucket, Key=segment.key[:-3] + "indexes", Body=INDEXES)
            segments.append(segment)
    return Data(bucket, tuple(segments))


# The sidecars' admin token (mutating calls always need one), as a fleet shares it
# through a Secret; the job reads it from the environment.
WARM_ENV = {"SIDECAR_ADMIN_TOKEN": "warm-test-" + secrets.token_hex(8)}


@pytest.fixture(scope="module")
def spark(local_s3: LocalS3) -> Iterator[SparkSession]:
    # Python workers of local[2] are children of this process's JVM: they get
    # this interpreter and the AWS_* credentials the session fixture set.
    saved = {name: os.environ.get(name) for name in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    os.environ.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]").appName("test-spark-warmup")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture()
def sidecars(local_s3: LocalS3, tmp_path: Path) -> Iterator[dict[str, SidecarProcess]]:
    for node in NODES:
        (tmp_path / f"cache-{node}").mkdir()
    started = dict(zip(NODES, start_together(
        SidecarProcess(local_s3.endpoint, tmp_path / f"cache-{node}", "--block-size", "1MiB",
                       "--cache-size", "64MiB", env=WARM_ENV)
        for node in NODES), strict=True))
    try:
        yield started
    finally:
        stop_together(started.values())


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def plan_document(local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
                  **extra: object) -> dict[str, Any]:
    """orders by an offset range, clicks by a time range, audit whole (for the replay)."""
    orders = data.of("orders", 0)
    clicks = data.of("clicks", 0)
    return {
        "origin": {"endpoint": local_s3.endpoint, "bucket": data.bucket, "prefix": "",
                   "region": "us-east-1"},
        "layout": "aiven",
        "sidecars": {node: process.admin_url for node, process in sidecars.items()},
        "assignment": {"orders-0": "a", "orders-1": "b", "audit-0": "a"},
        "replays": [
            # Both partitions have the same offsets: from inside segment 1 to inside
            # segment 2 selects exactly those two.
            {"topic": "orders", "partitions": [0, 1],
             "from_offset": orders[1].start_offset + 5, "to_offset": orders[2].start_offset + 5},
            # From just after segment 1's first timestamp: segments 1 and 2 (the last,
            # open-ended) of each partition.
            {"topic": "clicks", "partitions": "all",
             "from_time": iso(START_TIME_MS + clicks[1].start_offset + 10),
             "to_time": "2100-01-01T00:00:00Z"},
            {"topic": "audit", "partitions": [0], "from_offset": 0},
        ],
        "ttl_s": 3600,
        "block_size": "1MiB",
        **extra,
    }


def expected_nodes(data: Data) -> dict[str, str]:
    """Key -> node of every segment the plan must warm, worked out independently."""
    chosen: dict[str, str] = {}
    for partition, node in ((0, "a"), (1, "b")):
        for segment in data.of("orders", partition)[1:3]:
            chosen[segment.key] = node
    for partition in (0, 1):
        node = rendezvous_node(f"clicks-{partition}", NODES)
        for segment in data.of("clicks", partition)[1:]:
            chosen[segment.key] = node
    for segment in data.of("audit", 0):
        chosen[segment.key] = "a"
    return chosen


def blocks(size: int) -> int:
    return -(-size // MIB)


def warm_sizes(data: Data) -> dict[str, int]:
    """Key -> the bytes a warm-up of the segment fetches: its log and its indexes."""
    return {s.key: len(s.data) + len(INDEXES) for s in data.segments}


def warm_blocks(data: Data) -> dict[str, int]:
    """Key -> the blocks of the segment's log and of its indexes (one block)."""
    return {s.key: blocks(len(s.data)) + 1 for s in data.segments}


def warm_plan(spark: SparkSession, document: dict[str, Any], **options: Any) -> RunResult:
    out = io.StringIO()
    result = run(spark, parse_plan(document, env=WARM_ENV), out=out, **options)
    print(out.getvalue())
    return result


def assert_warmed_exactly(data: Data, sidecars: dict[str, SidecarProcess],
                          expected: dict[str, str], nodes: tuple[str, ...] = NODES) -> None:
    sizes, counts = warm_sizes(data), warm_blocks(data)
    for node in nodes:
        mine = [key for key, owner in expected.items() if owner == node]
        process = sidecars[node]
        assert process.metric("sidecar_origin_bytes_total", lane="warm") == \
            sum(sizes[key] for key in mine), node
        assert process.metric("sidecar_cache_blocks") == sum(counts[k] for k in mine), node
        assert process.metric("sidecar_origin_bytes_total", lane="foreground") == 0


def test_plan_warms_the_overlapping_segments_on_their_nodes_then_replay_hits(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    tmp_path: Path,
) -> None:
    expected = expected_nodes(data)
    assert {node for node in expected.values()} == set(NODES)
    result = warm_plan(spark, plan_document(local_s3, data, sidecars),
                       report_dir=tmp_path / "report")
    assert result.exit_code == 0
    assert {row.key: row.node for row in result.rows} == expected
    sizes, counts = warm_sizes(data), warm_blocks(data)
    for row in result.rows:
        assert row.ok and row.bytes == sizes[row.key]
        assert row.blocks == row.fetched == counts[row.key] and row.already_cached == 0
        assert row.bytes_fetched == row.bytes
    assert_warmed_exactly(data, sidecars, expected)
    summary = result.summary
    assert summary.planned_bytes == summary.warmed_bytes == summary.fetched_bytes \
        == sum(sizes[key] for key in expected)
    assert summary.failed_bytes == 0 and summary.mb_per_s > 0

    # The report: JSON lines from the driver, Parquet from Spark, the summary.
    report = tmp_path / "report"
    lines = [json.loads(line) for line in (report / "report.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == [row.key for row in result.rows]
    assert set(lines[0]) >= {"topic", "partition", "key", "node", "bytes", "blocks",
                             "already_cached", "fetched", "failed", "seconds"}
    frame = spark.read.parquet(str(report / "report.parquet"))
    assert frame.count() == len(expected)
    assert {r["key"]: r["node"] for r in frame.select("key", "node").collect()} == expected
    written = json.loads((report / "summary.json").read_text())
    assert written["warmed_bytes"] == summary.warmed_bytes
    # A real run keeps the plan's estimate beside the time it took.
    assert written["estimated_seconds"] > 0 and written["seconds"] > 0

    # Replaying the whole warmed partition through its node: every block a hit,
    # no origin bytes on the read lanes.
    a = sidecars["a"]
    replay = replay_json("--endpoint", a.data_url, "--list-endpoint", local_s3.endpoint,
                         "--bucket", data.bucket, "--admin", a.admin_url,
                         "--topic", "audit", "--partitions", "0")
    audit = data.of("audit", 0)
    assert replay["crc_errors"] == 0 and replay["segments"] == len(audit)
    assert replay["records"] == sum(h.record_count for s in audit
                                    for h in iter_segment_batches(s.data))
    assert replay["block_hit_ratio"] == 1.0
    for lane in ("foreground", "prefetch"):
        assert a.metric("sidecar_origin_bytes_total", lane=lane) == 0, lane


def test_a_rerun_fetches_nothing(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess]
) -> None:
    document = plan_document(local_s3, data, sidecars)
    first = warm_plan(spark, document)
    second = warm_plan(spark, document)
    assert first.exit_code == second.exit_code == 0
    assert [row.key for row in second.rows] == [row.key for row in first.rows]
    for row in second.rows:
        assert row.ok and row.fetched == 0 and row.bytes_fetched == 0
        assert row.already_cached == row.blocks == warm_blocks(data)[row.key]
    assert second.summary.warmed_bytes == first.summary.warmed_bytes
    assert second.summary.fetched_bytes == 0
    assert_warmed_exactly(data, sidecars, expected_nodes(data))


def test_dry_run_estimates_and_warms_nothing(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess]
) -> None:
    document = plan_document(local_s3, data, sidecars,
                             warm_rate={"a": "10MiB/s", "b": "20MiB/s"})
    result = warm_plan(spark, document, dry_run=True)
    assert result.exit_code == 0
    expected = expected_nodes(data)
    assert {row.key: row.node for row in result.rows} == expected
    nodes = result.summary.nodes
    assert nodes["a"].estimated_seconds == pytest.approx(nodes["a"].bytes / (10 * MIB))
    assert nodes["b"].estimated_seconds == pytest.approx(nodes["b"].bytes / (20 * MIB))
    assert result.summary.seconds == max(n.estimated_seconds for n in nodes.values())
    counts = warm_blocks(data)
    assert all(row.blocks == counts[row.key] and row.fetched == 0 for row in result.rows)
    assert result.problems == ()
    # clicks has no assignment and the plan no cluster: hashed, and said so.
    assert result.hashed == ("clicks-0", "clicks-1")
    assert result.summary.hashed_partitions == 2
    for process in sidecars.values():
        assert process.metric("sidecar_origin_bytes_total", lane="warm") == 0
        assert process.metric("sidecar_cache_blocks") == 0


def test_a_dry_run_against_a_sidecar_that_is_down_says_so_and_fails(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess]
) -> None:
    document = plan_document(local_s3, data, sidecars)
    sidecars["b"].stop()
    out = io.StringIO()
    result = run(spark, parse_plan(document, env=WARM_ENV), out=out, dry_run=True)
    assert result.exit_code == 1
    assert len(result.problems) == 1 and result.problems[0].startswith("sidecar b at http://")
    assert "dry run: sidecar b at " in out.getvalue() and "unreachable" in out.getvalue()
    assert "warning: 2 partitions (clicks-0, clicks-1) placed by hashing topic-partition " \
        "over 2 sidecars" in out.getvalue()
    assert sidecars["a"].metric("sidecar_cache_blocks") == 0  # a dry run warms nothing


def test_a_sidecar_that_is_down_fails_its_rows_only(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess]
) -> None:
    document = plan_document(local_s3, data, sidecars, retries=1)
    sidecars["b"].stop()
    out = io.StringIO()
    result = run(spark, parse_plan(document, env=WARM_ENV), out=out)
    # The console says why, without --report.
    assert "on b: " in out.getvalue() and "sidecar b unreachable" in out.getvalue()
    assert result.exit_code == 1
    expected = expected_nodes(data)
    failed = [row for row in result.rows if not row.ok]
    assert {row.key for row in failed} == {k for k, node in expected.items() if node == "b"}
    # Two blocks of log and one of indexes each.
    assert all("sidecar b unreachable" in (row.error or "") and row.failed == row.blocks == 3
               for row in failed)
    assert result.summary.failed_bytes == sum(row.bytes for row in failed)
    assert_warmed_exactly(data, sidecars, expected, nodes=("a",))


def test_a_sidecar_in_cache_only_mode_fails_its_rows_naming_the_mode(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    tmp_path: Path,
) -> None:
    b = sidecars["b"]
    status, _ = admin_call(b.admin_url, "PUT", "/api/v1/mode", {"mode": "cache-only"},
                           WARM_ENV["SIDECAR_ADMIN_TOKEN"])
    assert status == 200
    out = io.StringIO()
    # One call at a time, so that exactly one reaches b before its answer is known.
    document = plan_document(local_s3, data, sidecars, concurrency=1)
    result = run(spark, parse_plan(document, env=WARM_ENV), out=out,
                 report_dir=tmp_path / "report")
    assert result.exit_code == 1
    # The node answered: its mode is named, on the console too, and nothing says it is down.
    assert "on b: sidecar b is in cache-only mode, which pauses warm-up" in out.getvalue()
    assert "unreachable" not in out.getvalue() and "taken as down" not in out.getvalue()
    expected = expected_nodes(data)
    failed = [row for row in result.rows if not row.ok]
    assert {row.key for row in failed} == {k for k, node in expected.items() if node == "b"}
    assert all("sidecar b is in cache-only mode" in (row.error or "")
               and row.failed == row.blocks == 3 for row in failed)
    # One call reached b (not retried, and none after its answer).
    warm_calls = b.stats()["warm_calls"]
    assert isinstance(warm_calls, list) and len(warm_calls) == 1
    # The summary adds up, in summary.json as on the console.
    summary = result.summary
    assert summary.failed_segments == len(failed) == summary.nodes["b"].failed_segments
    assert summary.failed_bytes == sum(row.bytes for row in failed)
    assert summary.warmed_bytes + summary.failed_bytes == summary.planned_bytes
    written = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert written["failed_bytes"] == summary.failed_bytes
    assert_warmed_exactly(data, sidecars, expected, nodes=("a",))
    assert b.metric("sidecar_origin_bytes_total", lane="warm") == 0
    # A dry run says so beforehand, and fails as it does for a sidecar that is down.
    out = io.StringIO()
    dry = run(spark, parse_plan(document, env=WARM_ENV), out=out, dry_run=True)
    assert dry.exit_code == 1
    assert len(dry.problems) == 1 and dry.problems[0].startswith("sidecar b at http://")
    assert "is in cache-only mode, which pauses warm-up: a real run would fail its " \
        "segments" in out.getvalue()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"replays": [{"topic": "payments", "partitions": "all"}]},
         "replays[0].topic: no segments of topic 'payments'"),
        ({"replays": [{"topic": "orders", "partitions": [0, 7]}]},
         "replays[0].partitions: topic 'orders' has no partition 7"),
        ({"origin": {"bucket": "no-such-bucket-here"}}, "origin.bucket: no such bucket"),
        ({"origin": {"endpoint": "http://127.0.0.1:9"},  # nothing listens on the discard port
          "replays": [{"topic": "audit"}]}, "origin.endpoint: cannot reach http://127.0.0.1:9"),
    ],
)
def test_plans_that_cannot_run_are_refused_before_warming(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    change: dict[str, Any], message: str,
) -> None:
    document = plan_document(local_s3, data, sidecars)
    for key, value in change.items():
        document[key] = {**document[key], **value} if key == "origin" else value
    with pytest.raises(PlanError) as caught:
        warm_plan(spark, document)
    assert str(caught.value).startswith(message)
    for process in sidecars.values():
        assert process.metric("sidecar_origin_bytes_total", lane="warm") == 0


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_warmup", *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd, env={**os.environ, **CREDENTIALS, **WARM_ENV, **(env or {})},
    )


def test_a_bad_plan_exits_2_before_spark_starts(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "origin": {"bucket": "tiered"}, "sidecars": {"a": "http://127.0.0.1:1"},
        "replays": [{"topic": "orders", "from_offset": 10, "to_offset": 5}],
    }))
    started = time.monotonic()
    result = run_cli(str(plan), "--master", "local[1]")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"spark_warmup: error: {plan}: replays[0].to_offset: 5 is before the start of the "
        "range (10)"
    )
    assert time.monotonic() - started < 15  # no JVM was started for it


def test_a_report_directory_that_cannot_be_written_exits_2_before_spark_starts(
    tmp_path: Path,
) -> None:
    taken = tmp_path / "report"
    taken.write_text("a file, not a directory")
    started = time.monotonic()
    result = run_cli(str(tmp_path / "plan.json"), "--master", "local[1]", "--report", str(taken))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == f"spark_warmup: error: --report {taken}: is not a directory"
    assert time.monotonic() - started < 15  # no JVM was started for it


def dry_run_reporting_to(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    report_dir: Path,
) -> tuple[Any, str]:
    """A dry run whose report cannot be written under `report_dir`: its result
    and what it printed, checked to be a one-line error after the summary."""
    out = io.StringIO()
    result = run(spark, parse_plan(plan_document(local_s3, data, sidecars), env=WARM_ENV),
                 out=out, dry_run=True, report_dir=report_dir)
    assert result.exit_code == 1
    assert result.report_error is not None
    assert result.report_error.startswith(f"cannot write the report under {report_dir}: ")
    assert "\n" not in result.report_error
    assert "dry run: " in out.getvalue()  # the summary was printed first
    return result, out.getvalue()


def test_a_report_that_fails_at_the_end_still_leaves_the_summary(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    tmp_path: Path,
) -> None:
    taken = tmp_path / "report"
    taken.write_text("a file, not a directory")  # where the report would go: now a file
    _, out = dry_run_reporting_to(spark, local_s3, data, sidecars, taken)
    assert "; estimated " in out  # the summary


def test_a_parquet_report_spark_cannot_write_is_a_line_not_a_stack_trace(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    tmp_path: Path,
) -> None:
    # A directory this process can write report.jsonl into, whose Parquet files
    # Spark cannot create: their paths (report.parquet/_temporary/0/...) pass
    # the system's limit of 4096 bytes, as a full disk would fail them too.
    deep = tmp_path
    while len(str(deep)) < 3900:
        deep /= "d" * 200
    result, _ = dry_run_reporting_to(spark, local_s3, data, sidecars, deep)
    assert result.report_error is not None and "Spark: " in result.report_error
    assert (deep / "report.jsonl").read_text().count("\n") == len(result.rows)


def test_the_whole_report_goes_into_a_directory_whose_name_needs_quoting_in_a_uri(
    spark: SparkSession, tmp_path: Path,
) -> None:
    # A space and a '%' are written %20 and %25 in a file: URI; Spark took
    # such a URI's path as it stood and put report.parquet in "a%20b%25".
    directory = tmp_path / "warm report 100%"
    rows = [WarmRow("orders", 0, "orders-x/0/seg.log", "a", 10, blocks=1, fetched=1)]
    write_report(spark, rows, summarize(rows, 1.0), directory)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["warm report 100%"]
    assert {path.name for path in directory.iterdir()} == {
        "report.jsonl", "summary.json", "report.parquet"}
    written = spark.read.schema(REPORT_SCHEMA).parquet(
        "file://" + str(directory / "report.parquet")).collect()
    assert [(row.key, row.fetched) for row in written] == [("orders-x/0/seg.log", 1)]


# -- plans that name the Kafka cluster ------------------------------------------
# A Kafka-protocol stand-in (tests/support/kafka_broker.py) answers for brokers 1
# and 2; the sidecars "a" and "b" are theirs. orders-0 is led by broker 2 and
# orders-1 by broker 1, so a leader's sidecar is never the one hashing picks
# for both. Each partition's log goes on 500 records past its last remote
# segment: the local tail, which no warm-up can fetch. orders-2 has nothing in
# remote storage yet.
LOCAL_TAIL = 500
ORDERS_2_END = 300
BROKER_OF = {"a": 1, "b": 2}


def kafka_fixture(data: Data, groups: dict[str, dict[tuple[str, int], int]]) -> FixtureCluster:
    def partition(topic: str, number: int, leader: int) -> FixturePartition:
        local_start = data.of(topic, number)[-1].end_offset + 1
        return FixturePartition(
            leader=leader, replicas=(leader, 3 - leader), end_offset=local_start + LOCAL_TAIL,
            first_timestamp_ms=START_TIME_MS, local_start_offset=local_start)

    return FixtureCluster(
        brokers=(FixtureBroker(1, "rack-1"), FixtureBroker(2, "rack-2")),
        topics={"orders": (partition("orders", 0, 2), partition("orders", 1, 1),
                           FixturePartition(leader=2, replicas=(2, 1), end_offset=ORDERS_2_END)),
                "clicks": (partition("clicks", 0, 1), partition("clicks", 1, 2))},
        groups=groups,
        # The ids the bucket's keys carry: those of the topics the cluster has now.
        topic_ids={topic: topic_uuid(data.of(topic, 0)[0].key) for topic in ("orders", "clicks")},
    )


def topic_uuid(key: str) -> uuid.UUID:
    """The topic id in a segment's key, as a UUID (the key spells it in base64)."""
    parsed = parse_aiven_key(key)
    assert parsed is not None
    return uuid.UUID(bytes=base64.urlsafe_b64decode(parsed.topic_id + "=="))


def billing_commits(data: Data) -> dict[tuple[str, int], int]:
    """Group billing is inside segment 2 of orders-0, inside segment 1 of orders-1, and
    behind in orders-2, which has no remote segments."""
    return {("orders", 0): data.of("orders", 0)[2].start_offset + 7,
            ("orders", 1): data.of("orders", 1)[1].start_offset + 3,
            ("orders", 2): 100}


@pytest.fixture()
def kafka(data: Data) -> Iterator[FakeKafkaCluster]:
    with running_cluster(kafka_fixture(data, {"billing": billing_commits(data)})) as cluster:
        yield cluster


def cluster_plan(local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
                 kafka: FakeKafkaCluster, replays: list[dict[str, Any]],
                 **extra: object) -> dict[str, Any]:
    return {
        "origin": {"endpoint": local_s3.endpoint, "bucket": data.bucket},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "timeout_s": 10,
                  "sidecars": {str(BROKER_OF[node]): process.admin_url
                               for node, process in sidecars.items()}},
        "replays": replays,
        "block_size": "1MiB",
        **extra,
    }


def test_a_real_groups_next_reads_are_warmed_on_the_leaders_sidecar_and_then_hit(
    spark: SparkSession, local_s3: LocalS3, tmp_path: Path,
) -> None:
    """A real two-broker cluster, each broker reading remote storage through its own
    sidecar; a real group that lags. The plan names only the group: the job finds the
    leaders and the group's committed offsets in the cluster, warms each partition's
    next remote segments on its leader's sidecar, and the group's catch-up then
    fetches nothing from the origin in the foreground."""
    bucket = "warm-real-" + secrets.token_hex(4)
    s3_client(local_s3.endpoint).create_bucket(Bucket=bucket)
    topic, per_partition, record = "billing-events", 26_000, 1000
    sidecars: dict[int, SidecarProcess] = {}
    # Each sidecar's access log, kept with the brokers' logs: which object a
    # foreground fetch read, should one happen.
    kept = ARTIFACTS / "broker-warm"
    kept.mkdir(parents=True, exist_ok=True)
    access_logs = {broker: kept / f"sidecar-{broker}.access.log" for broker in (1, 2)}
    try:
        listen = {broker: f"127.0.0.1:{free_port()}" for broker in (1, 2)}
        for broker, address in listen.items():
            cache = tmp_path / f"cache-{broker}"
            cache.mkdir()
            access_logs[broker].unlink(missing_ok=True)
            sidecars[broker] = SidecarProcess(local_s3.endpoint, cache, listen=address,
                                              env={"SIDECAR_PREFETCH": "false",
                                                   "SIDECAR_ACCESS_LOG": str(access_logs[broker]),
                                                   **WARM_ENV}).__enter__()
        # Each broker's remote storage manager reads through the sidecar on its node.
        storage = RemoteStorage(f"http://{listen[1]}", bucket, CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        with KafkaCluster(tmp_path / "kafka", storage, brokers=2, extra_by_node={
                2: {"rsm.config.storage.s3.endpoint.url": f"http://{listen[2]}"}},
                artifacts=ARTIFACTS / "broker-warm") as cluster:
            admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
            try:
                # Partition 0 led by broker 2, partition 1 by broker 1.
                admin.create_topics([NewTopic(topic, replica_assignments={0: [2], 1: [1]},
                                              topic_configs={**TIERED_TOPIC,
                                                             "segment.bytes": str(4 * MIB)})])
            finally:
                admin.close()
            produce(cluster.bootstrap, topic, (0, 1), per_partition, record)
            # Every record in the bucket before the plan is made: the active segment
            # left behind would be rolled and tiered later (KAFKA-15047), and read
            # from the origin by the catch-up, never having been planned.
            tiered = cluster.await_tiered(s3_client(local_s3.endpoint), bucket, topic, (0, 1),
                                          end_offset=per_partition)
            remote = {p: tiered[p].remote for p in (0, 1)}
            assert all(len(remote[p]) >= 4 for p in (0, 1)), remote
            # Group billing stopped inside each partition's second remote segment.
            committed = {p: remote[p][1] + 11 for p in (0, 1)}
            commit_group(cluster.bootstrap, "billing", topic, committed)

            document = {
                "origin": {"endpoint": local_s3.endpoint, "bucket": bucket},
                "kafka": {"bootstrap_servers": cluster.bootstrap, "timeout_s": 20,
                          "sidecars": {str(b): p.admin_url for b, p in sidecars.items()}},
                "replays": [{"group": "billing", "topic": topic}],
            }
            out = io.StringIO()
            result = run(spark, parse_plan(document, env=WARM_ENV), out=out)
            print(out.getvalue())
            assert result.exit_code == 0
            leader = {0: "broker-2", 1: "broker-1"}
            assert result.rows and all(row.ok for row in result.rows)
            warmed: dict[int, list[int]] = {0: [], 1: []}
            for row in result.rows:
                key = parse_aiven_key(row.key)
                assert key is not None and row.node == leader[key.partition], row
                warmed[key.partition].append(key.start_offset)
            for p in (0, 1):
                # From the segment holding the committed offset to the last remote one.
                assert sorted(warmed[p]) == [o for o in remote[p] if o >= remote[p][1]], p
            (lag,) = result.groups
            assert lag.lag_records == sum(per_partition - committed[p] for p in (0, 1))

            done = catch_up(cluster.bootstrap, topic, (0, 1), per_partition, record,
                            group="billing", start=committed)
            assert done.records == sum(per_partition - committed[p] for p in (0, 1))
            for broker, process in sidecars.items():
                assert process.metric("sidecar_origin_bytes_total", lane="warm") > 0, broker
                assert process.metric("sidecar_origin_bytes_total", lane="foreground") == 0, \
                    f"broker {broker}: see {access_logs[broker]}"
    finally:
        for process in sidecars.values():
            process.stop()


def test_a_dry_run_of_a_cluster_plan_gives_each_groups_lag_and_warms_nothing(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    kafka: FakeKafkaCluster,
) -> None:
    orders1 = data.of("orders", 1)
    # to_time inside segment 2 of orders-1: the cluster turns it into an end offset.
    to_time = START_TIME_MS + orders1[2].start_offset + 20
    document = cluster_plan(local_s3, data, sidecars, kafka, [
        {"group": "billing", "topic": "orders", "partitions": [1], "to_time": to_time},
        {"topic": "clicks", "partitions": [1], "from_offset": 0},
    ], warm_rate="10MiB/s")
    out = io.StringIO()
    result = run(spark, parse_plan(document, env=WARM_ENV), out=out, dry_run=True)
    print(out.getvalue())
    assert result.exit_code == 0
    expected = {**{s.key: "broker-1" for s in orders1[1:3]},
                **{s.key: "broker-2" for s in data.of("clicks", 1)}}
    assert {row.key: row.node for row in result.rows} == expected
    (lag,) = result.groups
    warmed = sum(warm_sizes(data)[s.key] for s in orders1[1:3])
    assert lag.behind == (1,) and lag.segments == 2 and lag.bytes == warmed
    assert lag.lag_records == orders1[-1].end_offset + 1 + LOCAL_TAIL \
        - billing_commits(data)[("orders", 1)]
    assert (f"group billing on orders (replays[0]): lag {lag.lag_records:,} records on "
            f"1 partition of 1; in remote storage: 2 segments, {format_bytes(warmed)} "
            "(would warm)") \
        in out.getvalue()
    assert result.summary.nodes["broker-1"].estimated_seconds == pytest.approx(
        warmed / (10 * MIB))
    for process in sidecars.values():
        assert process.metric("sidecar_origin_bytes_total", lane="warm") == 0
        assert process.metric("sidecar_cache_blocks") == 0


def test_a_group_whose_lag_is_all_on_the_brokers_disks_warms_nothing(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
) -> None:
    # Committed inside the local tail of orders-0: the next reads are all served
    # from the leader's disk. The last remote segment, listed open-ended, holds
    # none of them.
    local_start = data.of("orders", 0)[-1].end_offset + 1
    commits = {"tailing": {("orders", 0): local_start + 10}}
    with running_cluster(kafka_fixture(data, commits)) as kafka:
        document = cluster_plan(local_s3, data, sidecars, kafka,
                                [{"group": "tailing", "topic": "orders", "partitions": [0]}])
        out = io.StringIO()
        result = run(spark, parse_plan(document, env=WARM_ENV), out=out, dry_run=True)
    assert result.exit_code == 0 and result.rows == ()
    (lag,) = result.groups
    assert (lag.behind, lag.lag_records, lag.segments, lag.bytes) == ((0,), LOCAL_TAIL - 10, 0, 0)
    assert (f"lag {LOCAL_TAIL - 10:,} records on 1 partition of 1; in remote storage: "
            "0 segments, 0 B (would warm)") in out.getvalue()


@pytest.mark.parametrize(("version", "local_start"), [(None, 600), (7, None)])
def test_a_broker_too_old_to_say_where_its_local_log_starts_still_plans(
    version: int | None, local_start: int | None,
) -> None:
    # Before ListOffsets v8 (KIP-405) a broker cannot give its earliest local
    # offset: the whole lag is then taken as possibly remote, as it used to be.
    fixture = FixtureCluster(
        brokers=(FixtureBroker(1, "rack-1"),),
        topics={"orders": (FixturePartition(leader=1, replicas=(1,), end_offset=1000,
                                            local_start_offset=600),)},
        groups={"billing": {("orders", 0): 100}}, list_offsets_version=version)
    with running_cluster(fixture) as kafka:
        plan = parse_plan({"origin": {"bucket": "tiered"},
                           "kafka": {"bootstrap_servers": kafka.bootstrap_servers,
                                     "sidecar_url": "http://{host}:9331", "timeout_s": 10},
                           "replays": [{"group": "billing", "topic": "orders"}]}, env={})
        cluster = read_cluster(plan)
    assert cluster is not None
    assert cluster.groups[0][0] == GroupPosition(100, 1000, None, local_start)


def test_the_remote_segments_of_a_former_topic_of_that_name_are_not_warmed(
    spark: SparkSession, local_s3: LocalS3, origin_s3: Any, data: Data,
    sidecars: dict[str, SidecarProcess], kafka: FakeKafkaCluster,
) -> None:
    # orders was deleted and created again: the former topic's segments, under
    # its own id, are still in the bucket beside the new topic's. No broker
    # reads them; the cluster says which id is the topic's now.
    bucket = "warm-former-" + secrets.token_hex(4)
    origin_s3.create_bucket(Bucket=bucket)
    live = data.of("orders", 0)
    former_id = "AAAAAAAAAAAAAAAAAAAAAQ"  # 22 characters, as a Kafka Uuid is written
    parsed = parse_aiven_key(live[0].key)
    assert parsed is not None
    former = [s.key.replace(parsed.topic_id, former_id) for s in live]
    for segment, former_key in zip(live, former, strict=True):
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
        origin_s3.put_object(Bucket=bucket, Key=former_key, Body=segment.data)
    document = cluster_plan(local_s3, data, sidecars, kafka,
                            [{"topic": "orders", "partitions": [0], "from_offset": 0}])
    document["origin"]["bucket"] = bucket
    result = run(spark, parse_plan(document, env=WARM_ENV), out=io.StringIO(), dry_run=True)
    assert result.exit_code == 0
    assert sorted(row.key for row in result.rows) == sorted(s.key for s in live)


@pytest.mark.parametrize(
    ("replica", "nodes"),
    [
        # clicks-0 is led by broker 1, clicks-1 by broker 2 (kafka_fixture).
        ("leader", {0: ("broker-1",), 1: ("broker-2",)}),
        # Consumers in rack-1 fetch from broker 1, the in-sync replica there.
        ("rack:rack-1", {0: ("broker-1",), 1: ("broker-1",)}),
        ("all", {0: ("broker-1", "broker-2"), 1: ("broker-1", "broker-2")}),
    ],
)
def test_the_replica_choice_picks_whose_sidecar_warms(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    kafka: FakeKafkaCluster, replica: str, nodes: dict[int, tuple[str, ...]],
) -> None:
    document = cluster_plan(local_s3, data, sidecars, kafka,
                            [{"topic": "clicks", "partitions": "all", "from_offset": 0}])
    document["kafka"]["replica"] = replica
    result = run(spark, parse_plan(document, env=WARM_ENV), out=io.StringIO(), dry_run=True)
    assert result.exit_code == 0
    expected = sorted((s.key, node) for partition, owners in nodes.items()
                      for s in data.of("clicks", partition) for node in owners)
    assert sorted((row.key, row.node) for row in result.rows) == expected


def test_a_broker_without_a_sidecar_is_refused_before_warming(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    kafka: FakeKafkaCluster,
) -> None:
    document = cluster_plan(local_s3, data, sidecars, kafka,
                            [{"group": "billing", "topic": "orders"}])
    del document["kafka"]["sidecars"]["2"]  # broker 2 leads orders-0
    with pytest.raises(PlanError) as caught:
        run(spark, parse_plan(document, env=WARM_ENV), out=io.StringIO())
    assert str(caught.value).startswith(
        "kafka.sidecars: broker 2 (127.0.0.1:") and "which serves orders-0" in str(caught.value)
    for process in sidecars.values():
        assert process.metric("sidecar_origin_bytes_total", lane="warm") == 0


@pytest.mark.parametrize(
    ("replays", "bootstrap", "message"),
    [
        ([{"group": "billing", "topic": "orders"}], "127.0.0.1:9",  # nothing on the discard port
         "kafka.bootstrap_servers: cannot reach the cluster at 127.0.0.1:9 within 3 s"),
        ([{"group": "payroll", "topic": "orders"}], None,
         "replays[0].group: group 'payroll' has no committed offsets for topic 'orders'"),
        ([{"topic": "orders"}, {"group": "billing", "topic": "payments"}], None,
         "replays[1].topic: no topic 'payments' in the cluster at "),
        ([{"topic": "clicks", "partitions": [0, 5]}], None,
         "replays[0].partitions: topic 'clicks' has no partition 5 in the cluster"),
    ],
)
def test_cluster_plans_that_cannot_run_exit_2_before_spark_starts(
    tmp_path: Path, data: Data, kafka: FakeKafkaCluster,
    replays: list[dict[str, Any]], bootstrap: str | None, message: str,
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "origin": {"bucket": data.bucket, "endpoint": "http://127.0.0.1:9"},
        "kafka": {"bootstrap_servers": bootstrap or kafka.bootstrap_servers, "timeout_s": 3,
                  "sidecar_url": "http://{host}:9331"},
        "replays": replays,
    }))
    result = run_cli(str(plan), "--master", "local[1]", timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().startswith(f"spark_warmup: error: {plan}: {message}"), \
        result.stderr
    assert "Spark" not in result.stderr  # no JVM was started for it


def test_the_same_plan_on_a_standalone_cluster(
    spark: SparkSession, local_s3: LocalS3, data: Data, sidecars: dict[str, SidecarProcess],
    spark_standalone: StandaloneCluster, executor_venv: Path, tmp_path: Path,
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(local_s3, data, sidecars)))
    result = run_cli(
        str(plan), "--master", spark_standalone.url, "--report", str(tmp_path / "report"),
        "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
        "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
        env={"PYSPARK_PYTHON": str(executor_venv), "SPARK_LOCAL_IP": "127.0.0.1"}, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "warm-up: " in result.stdout and "MiB/s effective" in result.stdout
    expected = expected_nodes(data)
    lines = [json.loads(line)
             for line in (tmp_path / "report" / "report.jsonl").read_text().splitlines()]
    assert {line["key"]: line["node"] for line in lines} == expected
    assert all(line["error"] is None and line["fetched"] == line["blocks"] for line in lines)
    assert spark.read.parquet(str(tmp_path / "report" / "report.parquet")).count() == len(expected)
    assert_warmed_exactly(data, sidecars, expected)
