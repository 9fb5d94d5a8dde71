"""The capacity analysis on Spark: read the logs, break them down, replay each
node's trace at each cache size, write the report.

Executors parse the lines (spark_warmup.capacity.trace) into one DataFrame,
kept for the breakdowns (Spark SQL aggregates); the (node, size) replays
(spark_warmup.capacity.simulate) are spread one per Spark partition, each
replaying its node's sampled reads in time order.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_warmup.capacity.accuracy import load_cells, nearest
from spark_warmup.capacity.curve import (
    Point,
    best_size,
    default_sizes,
    recommend,
    sample_rate,
    unbounded_size,
    unit_hash,
)
from spark_warmup.capacity.landing import BIN_S, FetchTimes, OriginLoad
from spark_warmup.capacity.pacing import EVEN, BlockCosts, tally_read
from spark_warmup.capacity.report import render_html
from spark_warmup.capacity.shipping import ship_capacity
from spark_warmup.capacity.simulate import Outcome, Read, Settings, origin_load, replay
from spark_warmup.capacity.sources import Split, Unreadable, expand, read_split
from spark_warmup.capacity.trace import (
    Fetch,
    Malformed,
    Request,
    parse_line,
    partition_prefix,
)
from spark_warmup.report import spark_reason

# Reads replayed per node at most; a larger trace is sampled down to this.
MAX_TRACE_REQUESTS = 500_000
# The hit-ratio-over-time charts and tables use windows that cut the log's span
# into about this many.
WINDOWS = 48
_NICE_WINDOWS_S = (1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600,
                   12 * 3600, 86400)
TOP_TOPICS = 10

LINE_SCHEMA = StructType([
    StructField("kind", StringType(), False),  # read | fetch | other | malformed | unreadable
    StructField("reason", StringType(), True),
    StructField("node", StringType(), True),
    StructField("time_s", DoubleType(), True),
    StructField("bucket", StringType(), True),
    StructField("key", StringType(), True),
    StructField("etag", StringType(), True),
    StructField("object_size", LongType(), True),
    StructField("first_byte", LongType(), True),
    StructField("bytes", LongType(), True),
    StructField("lazy", BooleanType(), True),
    StructField("block_size", LongType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", LongType(), True),
    StructField("cache_bytes", LongType(), True),
    StructField("duration_s", DoubleType(), True),
    StructField("blocks", LongType(), True),
    StructField("hit_blocks", LongType(), True),
    StructField("hit_bytes", LongType(), True),
    StructField("origin_foreground", LongType(), True),
    StructField("origin_prefetch", LongType(), True),
    StructField("origin_warm", LongType(), True),
    StructField("unit", StringType(), True),
    StructField("unit_hash", DoubleType(), True),  # spatial sampling: keep when < rate
    StructField("warm_bytes", LongType(), True),  # a warm-up's fetch: the bytes it fetched
    StructField("found", StringType(), True),  # a read's blocks, how each was found
])
_EMPTY = (None,) * (len(LINE_SCHEMA.fields) - 2)


class InputError(Exception):
    """The logs cannot be analysed at all (no readable line); the message says why."""


@dataclass(frozen=True)
class Options:
    logs: Sequence[str]
    report_dir: Path
    target_hit_ratio: float = 0.99
    sizes: Sequence[int] | None = None
    max_trace_requests: int = MAX_TRACE_REQUESTS
    settings: Settings = field(default_factory=lambda: Settings(block_size=4 * 1024 * 1024))


def line_rows(split: Split, layout_prefix: str) -> Iterator[tuple[Any, ...]]:
    """Executor side: one row per line of `split` (LINE_SCHEMA)."""
    for line in read_split(split):
        if isinstance(line, Unreadable):
            yield ("unreadable", f"{line.source}: {line.reason}", *_EMPTY)
            continue
        if isinstance(line, Malformed):  # too long to be read as a line
            yield ("malformed", line.reason, *_EMPTY)
            continue
        if not line.strip():
            continue
        parsed = parse_line(line, layout_prefix)
        if isinstance(parsed, Malformed):
            yield ("malformed", parsed.reason, *_EMPTY)
        elif isinstance(parsed, Request):
            tally = parsed.tallies()
            unit = partition_prefix(parsed, layout_prefix)
            yield ("read", None, parsed.node, parsed.time_s, parsed.bucket, parsed.key,
                   parsed.etag, parsed.object_size, parsed.first_byte, parsed.bytes,
                   parsed.lazy, parsed.block_size, parsed.topic, parsed.partition,
                   parsed.cache_bytes, parsed.duration_s, tally.blocks, tally.hit_blocks,
                   tally.hit_bytes, tally.origin_foreground, tally.origin_prefetch,
                   tally.origin_warm, unit, unit_hash(unit), None, parsed.found)
        elif isinstance(parsed, Fetch):
            # Origin bytes of the background lanes: no request, nothing served;
            # a warm-up's fetch is replayed as one.
            warm = parsed.lane == "warm"
            unit = partition_prefix(parsed, layout_prefix)
            yield ("fetch", None, parsed.node, parsed.time_s, parsed.bucket, parsed.key,
                   parsed.etag, parsed.object_size, parsed.first_byte, 0, False, None,
                   parsed.topic, parsed.partition, None, parsed.duration_s, 0, 0, 0, 0,
                   0 if warm else parsed.origin_bytes, parsed.origin_bytes if warm else 0,
                   unit, unit_hash(unit), parsed.length if warm else None, None)
        else:
            yield ("other", None, parsed.node, *_EMPTY[1:])


def window_seconds(span_s: float) -> int:
    """A round window length that cuts `span_s` into about WINDOWS windows."""
    wanted = span_s / WINDOWS
    return next((w for w in _NICE_WINDOWS_S if w >= wanted), _NICE_WINDOWS_S[-1])


def ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


@dataclass(frozen=True)
class Analysis:
    """summary.json's document, and why the report could not be written (None:
    written). The report is written last: its failure loses only itself."""

    summary: dict[str, Any]
    report_error: str | None = None


def run(spark: SparkSession, options: Options) -> Analysis:
    """Analyse the logs, write the report directory; the summary, and whether
    the report was written."""
    ship_capacity(spark)
    splits, unreadable_inputs = expand(options.logs)
    if not splits:
        raise InputError("nothing to read: " + "; ".join(
            f"{u.source}: {u.reason}" for u in unreadable_inputs))
    prefix = options.settings.layout_prefix
    context = spark.sparkContext
    rows = context.parallelize(splits, max(1, len(splits))).flatMap(
        lambda split: line_rows(split, prefix))
    lines = spark.createDataFrame(rows, LINE_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _analyse(spark, lines, options, unreadable_inputs)
    finally:
        lines.unpersist()


def _analyse(spark: SparkSession, lines: DataFrame, options: Options,
             unreadable_inputs: list[Unreadable]) -> Analysis:
    kinds, problems = _line_kinds(lines, unreadable_inputs)
    reads = lines.where(F.col("kind") == "read")
    span = reads.agg(F.min("time_s").alias("lo"), F.max("time_s").alias("hi")).first()
    assert span is not None
    window = window_seconds(float(span["hi"] - span["lo"]))
    traffic = _Traffic.of(lines, window)
    footprints = {row["node"]: int(row["footprint"]) for row in
                  reads.groupBy("node", "bucket", "key", "etag")
                  .agg(F.max("object_size").alias("size"))
                  .groupBy("node").agg(F.sum("size").alias("footprint")).collect()}
    plans, curve_plans = _replay_plans(traffic.node_rows, footprints, options)
    outcomes = simulate(lines.where((F.col("kind") == "read") | (F.col("warm_bytes") > 0)),
                        plans, _fetch_times(lines),
                        {node: int(row["current_cache_bytes"] or 0)
                         for node, row in traffic.node_rows.items()},
                        _block_costs(lines))
    bounds = {plan[0]: outcome.byte_hit_ratio
              for plan, outcome in zip(plans[curve_plans:], outcomes[curve_plans:],
                                       strict=True)}
    curves, curve_rows = _curves(plans[:curve_plans], outcomes[:curve_plans])
    summary = _summary(options, traffic.node_rows, traffic.topic_rows, curves, plans, kinds,
                       problems, window)
    _add_bounds_and_trust(summary, bounds, traffic.breakdown, footprints)
    report = options.report_dir
    # The directory was checked before Spark started, but a disk fills up, or a
    # file of a former run is in the way: Spark's work is not lost for it.
    try:
        report.mkdir(parents=True, exist_ok=True)
        _write_tables(spark, report, curve_rows, traffic)
        (report / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (report / "report.html").write_text(
            render_html(summary, traffic.over_time, traffic.topic_rows, window),
            encoding="utf-8")
    except (OSError, Py4JJavaError) as exc:
        return Analysis(summary, f"cannot write the report under {report}: {_why(exc, report)}")
    return Analysis(summary)


def _why(exc: OSError | Py4JJavaError, report: Path) -> str:
    """One line: the file and the OS's reason, or the first line of Spark's."""
    if isinstance(exc, OSError):
        return f"{exc.filename or report}: {exc.strerror or exc}"
    return spark_reason(str(exc.java_exception))


def _line_kinds(lines: DataFrame, unreadable_inputs: list[Unreadable]
                ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Lines per kind, and the problems met (malformed lines, unreadable inputs);
    InputError if no line is an object read."""
    kinds = {row["kind"]: row["count"] for row in lines.groupBy("kind").count().collect()}
    problems = [
        {"kind": row["kind"], "reason": row["reason"], "lines": row["count"]}
        for row in lines.where(F.col("kind").isin("malformed", "unreadable"))
        .groupBy("kind", "reason").count().orderBy(F.desc("count")).limit(50).collect()
    ]
    problems += [{"kind": "unreadable", "reason": f"{u.source}: {u.reason}", "lines": 0}
                 for u in unreadable_inputs]
    if not kinds.get("read"):
        raise InputError(no_reads_message(kinds, problems))
    return kinds, problems


def no_reads_message(kinds: Mapping[str, int], problems: Sequence[Mapping[str, Any]]) -> str:
    """Why there is nothing to analyse: the lines by kind, and the most common
    problem (which file could not be read, which field lines lack)."""
    message = (f"no object read in the logs ({kinds.get('other', 0)} other lines, "
               f"{kinds.get('malformed', 0)} malformed, {kinds.get('unreadable', 0)} unreadable)")
    if problems:
        first = problems[0]
        message += f"; {first['kind']}: {first['reason']}"
        if first["lines"] > 1:
            message += f" ({first['lines']} lines)"
    return message


@dataclass(frozen=True)
class _Traffic:
    """What the log says was served and fetched: per (node, topic, partition,
    window) (written as breakdown.parquet), per node and window, per node and
    topic, per node."""

    breakdown: DataFrame
    over_time: list[dict[str, Any]]
    topic_rows: list[dict[str, Any]]
    node_rows: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, lines: DataFrame, window: int) -> _Traffic:
        # The reads and the background fetches' lines: every origin byte the log
        # records, so the figures agree with the sidecar's counters.
        traffic = lines.where(F.col("kind").isin("read", "fetch"))
        origin = F.col("origin_foreground") + F.col("origin_prefetch") + F.col("origin_warm")
        sums = [F.sum(F.when(F.col("kind") == "read", 1).otherwise(0)).alias("requests"),
                F.sum("bytes").alias("served_bytes"),
                F.sum("hit_bytes").alias("hit_bytes"), F.sum("blocks").alias("blocks"),
                F.sum("hit_blocks").alias("hit_blocks"),
                F.sum("origin_foreground").alias("origin_foreground_bytes"),
                F.sum("origin_prefetch").alias("origin_prefetch_bytes"),
                F.sum("origin_warm").alias("origin_warm_bytes"),
                F.sum(origin).alias("origin_bytes")]
        # Spark SQL's ANSI mode refuses x / 0: a ratio of nothing is 0.
        ratios = [F.when(F.col("served_bytes") > 0, F.col("hit_bytes") / F.col("served_bytes"))
                  .otherwise(0.0).alias("byte_hit_ratio"),
                  F.when(F.col("blocks") > 0, F.col("hit_blocks") / F.col("blocks"))
                  .otherwise(0.0).alias("block_hit_ratio")]
        breakdown = (traffic.withColumn("window_start",
                                      (F.floor(F.col("time_s") / window) * window).cast("long"))
                     .groupBy("node", "topic", "partition", "window_start").agg(*sums)
                     .select("*", *ratios))
        # Small enough to collect: per node and window, per node and topic.
        over_time = [row.asDict() for row in breakdown.groupBy("node", "window_start").agg(
            F.sum("served_bytes").alias("served_bytes"), F.sum("hit_bytes").alias("hit_bytes"),
            F.sum("blocks").alias("blocks"), F.sum("hit_blocks").alias("hit_blocks"),
            F.sum("origin_bytes").alias("origin_bytes"),
        ).orderBy("node", "window_start").collect()]
        topic_rows = [row.asDict() for row in traffic.groupBy("node", "topic").agg(*sums)
                      .collect()]
        # Every node, those whose log has only background fetches (a node being
        # warmed before it serves) too: their origin bytes are the fleet's.
        node_rows = {row["node"]: row.asDict() for row in traffic.groupBy("node").agg(
            *sums, F.max("cache_bytes").alias("current_cache_bytes"),
            F.max("block_size").alias("block_size")).collect()}
        return cls(breakdown, over_time, topic_rows, node_rows)


def _replay_plans(node_rows: Mapping[str, dict[str, Any]], footprints: Mapping[str, int],
                  options: Options) -> tuple[list[tuple[str, int, float, Settings]], int]:
    """The replays: one Spark partition per (node, size), the curves' first
    (how many of them is the second value), then each node's bound."""
    plans: list[tuple[str, int, float, Settings]] = []
    bound_plans: list[tuple[str, int, float, Settings]] = []
    for node, row in sorted(node_rows.items()):
        if not row["requests"]:
            continue  # only background fetches: no reads to replay
        block_size = int(row["block_size"])
        current = row["current_cache_bytes"]
        sizes = list(options.sizes) if options.sizes else default_sizes(
            footprints[node], block_size, current)
        rate = sample_rate(int(row["requests"]), options.max_trace_requests)
        settings = replace(options.settings, block_size=block_size)
        plans.extend((node, size, rate, settings) for size in sizes)
        # And the node's compulsory misses: a cache that holds everything still
        # misses the first read of each block that read-ahead did not bring, so
        # no size passes this replay's ratio.
        bound_plans.append((node, unbounded_size(footprints[node], block_size), rate,
                            settings))
    return plans + bound_plans, len(plans)


def _fetch_times(lines: DataFrame) -> dict[str, FetchTimes]:
    """Read-ahead lands when its fetch completes: each node's FETCH lines'
    mean duration per bin of their start time, and over the log
    (spark_warmup.capacity.landing; none in older logs: at once)."""
    fetches = lines.where(F.col("kind") == "fetch").withColumn(
        "bin", F.floor((F.col("time_s") - F.coalesce(F.col("duration_s"), F.lit(0.0)))
                       / F.lit(BIN_S)))
    sums: dict[str, dict[int, tuple[float, int]]] = {}
    for row in fetches.groupBy("node", "bin").agg(
            F.sum("duration_s").alias("total"), F.count("duration_s").alias("count")).collect():
        sums.setdefault(row["node"], {})[int(row["bin"])] = (
            float(row["total"] or 0.0), int(row["count"]))
    return {node: FetchTimes.of_bins(bins) for node, bins in sums.items()}


def _block_costs(lines: DataFrame) -> dict[str, BlockCosts]:
    """How each node's reads share out their time over their blocks
    (spark_warmup.capacity.pacing): the sums of every read, added up per node."""
    reads = lines.where(F.col("kind") == "read").select(
        "node", "found", "first_byte", "block_size", "duration_s")
    sums = reads.rdd.map(lambda row: (row["node"], tally_read(
        row["found"] or "", row["first_byte"] or 0, row["block_size"] or 1,
        row["duration_s"] or 0.0))).reduceByKey(operator.add).collect()
    return {node: tally.costs() for node, tally in sums}


def _curves(plans: Sequence[tuple[str, int, float, Settings]], outcomes: Sequence[Outcome]
            ) -> tuple[dict[str, list[Point]], list[dict[str, Any]]]:
    """Each node's curve, and its rows for curves.parquet."""
    curves: dict[str, list[Point]] = {}
    curve_rows = []
    for (node, size, rate, _), outcome in zip(plans, outcomes, strict=True):
        point = Point(size, outcome.byte_hit_ratio, outcome.origin_per_served,
                      outcome.wasted_per_served)
        curves.setdefault(node, []).append(point)
        curve_rows.append({
            "node": node, "cache_bytes": size, "byte_hit_ratio": point.byte_hit_ratio,
            "origin_bytes_per_served_byte": point.origin_bytes_per_served_byte,
            "sample_rate": rate, "replayed_requests_share": rate,
            "predicted_origin_bytes": int(outcome.origin_bytes / rate),
            "predicted_origin_prefetch_bytes": int(outcome.origin_prefetch / rate),
            "predicted_read_ahead_wasted_bytes": int(outcome.prefetch_wasted / rate),
            "block_hit_ratio": ratio(outcome.hit_blocks, outcome.blocks)})
    return curves, curve_rows


def _add_bounds_and_trust(summary: dict[str, Any], bounds: Mapping[str, float],
                          breakdown: DataFrame, footprints: Mapping[str, int]) -> None:
    """Each node's hit ratio bound, its regime (partitions read in the same
    window, on average; the cache's share of the footprint) and the
    benchmark's error nearest to it."""
    streams = {row["node"]: float(row["streams"]) for row in
               breakdown.where(F.col("served_bytes") > 0).groupBy("node", "window_start")
               .count().groupBy("node").agg(F.avg("count").alias("streams")).collect()}
    cells = load_cells()
    for node, bound in bounds.items():
        facts = summary["nodes"][node]
        facts["hit_ratio_bound"] = round(bound, 6)
        share = (facts["current_cache_bytes"] or 0) / footprints[node] if footprints[node] \
            else 0.0
        facts["regime"] = {"streams": round(streams.get(node, 1.0), 2),
                           "cache_share": round(share, 4)}
        facts["accuracy"] = nearest(cells, streams.get(node, 1.0), share)


def _write_tables(spark: SparkSession, report: Path, curve_rows: list[dict[str, Any]],
                  traffic: _Traffic) -> None:
    """breakdown.parquet, curves.parquet, nodes.parquet and topics.parquet."""
    traffic.breakdown.orderBy("node", "topic", "partition", "window_start").write.mode(
        "overwrite").parquet(str(report / "breakdown.parquet"))
    spark.createDataFrame(_table_rows(curve_rows)).write.mode("overwrite").parquet(
        str(report / "curves.parquet"))
    # 0: the log does not say (a column of nulls alone has no type to infer).
    spark.createDataFrame(_table_rows(
        [{**r, "current_cache_bytes": r["current_cache_bytes"] or 0}
         for r in traffic.node_rows.values()])).write.mode("overwrite").parquet(
        str(report / "nodes.parquet"))
    spark.createDataFrame(_table_rows(
        [{**r, "byte_hit_ratio": ratio(r["hit_bytes"], r["served_bytes"])}
         for r in traffic.topic_rows])).write.mode("overwrite").parquet(
        str(report / "topics.parquet"))


def _table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spark infers a column's type from its values: ints as floats where any is."""
    return [{k: (float(v) if isinstance(v, int) and not isinstance(v, bool)
                 and k.endswith("ratio") else v) for k, v in row.items()} for row in rows]


def simulate(reads: DataFrame, plans: Sequence[tuple[str, int, float, Settings]],
             fetch_s: Mapping[str, FetchTimes] | None = None,
             own_sizes: Mapping[str, int] | None = None,
             costs: Mapping[str, BlockCosts] | None = None) -> list[Outcome]:
    """Replay each plan's (node, size) on its own Spark partition (`fetch_s`: how
    long each node's read-ahead takes to land). First, for each node whose log
    says its cache size (`own_sizes`), the replay at that size on a partition
    of its own: the origin's load its fetch times went with, which every size's
    replay scales them by (`origin_load`)."""
    landing = dict(fetch_s or {})
    paces = dict(costs or {})
    if not plans:
        return []
    by_node: dict[str, list[int]] = {}
    for index, (node, *_) in enumerate(plans):
        by_node.setdefault(node, []).append(index)
    rates = {node: plans[indices[0]][2] for node, indices in by_node.items()}
    plan_list = list(plans)
    own = {node: size for node, size in (own_sizes or {}).items()
           if size > 0 and node in by_node}
    own_list = sorted(own)
    own_index = {node: index for index, node in enumerate(own_list)}
    settings_of = {node: plans[indices[0]][3] for node, indices in by_node.items()}

    def read_of(row: Any) -> Read:
        warm = row["warm_bytes"] is not None
        return Read(row["time_s"], row["bucket"], row["key"], row["etag"],
                    row["object_size"], row["first_byte"],
                    row["warm_bytes"] if warm else row["bytes"], bool(row["lazy"]),
                    row["duration_s"] or 0.0, warm, row["found"] or "")

    def keyed_own(row: Any) -> Iterable[tuple[int, Read]]:
        node = row["node"]
        return ((own_index[node], read_of(row)),) if node in own_index else ()

    def loaded(items: Iterable[tuple[int, Read]]) -> Iterator[tuple[str, OriginLoad]]:
        grouped: dict[int, list[Read]] = {}
        for index, read in items:
            grouped.setdefault(index, []).append(read)
        for index, node_reads in grouped.items():
            node = own_list[index]
            node_reads.sort(key=lambda r: r.time_s)
            yield node, origin_load(settings_of[node], own[node], node_reads, rates[node],
                                    landing.get(node, FetchTimes()), paces.get(node, EVEN))

    def keyed(row: Any) -> Iterable[tuple[int, Read]]:
        read = read_of(row)
        return ((index, read) for index in by_node[row["node"]])

    def replayed(items: Iterable[tuple[int, Read]]) -> Iterator[tuple[int, Outcome]]:
        grouped: dict[int, list[Read]] = {}
        for index, read in items:
            grouped.setdefault(index, []).append(read)
        for index, node_reads in grouped.items():
            node, size, rate, settings = plan_list[index]
            node_reads.sort(key=lambda r: r.time_s)
            yield index, replay(settings, size, node_reads, rate,
                                landing.get(node, FetchTimes()), loads.get(node),
                                paces.get(node, EVEN))

    # Only the sampled reads leave the JVM for the replays.
    kept = None
    for node, rate in rates.items():
        condition = (F.col("node") == node) & (F.col("unit_hash") < rate)
        kept = condition if kept is None else kept | condition
    assert kept is not None
    columns = reads.where(kept).select("node", "time_s", "bucket", "key", "etag", "object_size",
                           "first_byte", "bytes", "lazy", "duration_s", "warm_bytes", "found")
    loads: dict[str, OriginLoad] = dict(
        columns.rdd.flatMap(keyed_own).partitionBy(len(own_list), lambda index: index)
        .mapPartitions(loaded).collect()) if own_list else {}
    results = dict(columns.rdd.flatMap(keyed)
                   .partitionBy(len(plans), lambda index: index)
                   .mapPartitions(replayed).collect())
    empty = Outcome(0, 0, 0, 0, 0, 0, 0, 0)
    return [replace(results[i], cache_bytes=plans[i][1]) if i in results
            else replace(empty, cache_bytes=plans[i][1]) for i in range(len(plans))]


def _summary(options: Options, node_rows: Mapping[str, dict[str, Any]],
             topic_rows: list[dict[str, Any]], curves: Mapping[str, list[Point]],
             plans: Sequence[tuple[str, int, float, Settings]], kinds: Mapping[str, int],
             problems: list[dict[str, Any]], window: int) -> dict[str, Any]:
    rates = {node: rate for node, _, rate, _ in plans}
    nodes: dict[str, Any] = {}
    for node, row in sorted(node_rows.items()):
        # Rounded as summary.json writes them before anything is read off them: a
        # point written as reaching the target is the one recommended.
        curve = sorted((replace(p, byte_hit_ratio=round(p.byte_hit_ratio, 6),
                                origin_bytes_per_served_byte=round(
                                    p.origin_bytes_per_served_byte, 6),
                                wasted_per_served_byte=round(p.wasted_per_served_byte, 6))
                        for p in curves.get(node, [])), key=lambda p: p.cache_bytes)
        best = best_size(curve)
        nodes[node] = {
            "requests": int(row["requests"]), "served_bytes": int(row["served_bytes"]),
            "byte_hit_ratio": ratio(row["hit_bytes"], row["served_bytes"]),
            "block_hit_ratio": ratio(row["hit_blocks"], row["blocks"]),
            "origin_bytes": int(row["origin_bytes"]),
            "origin_bytes_by_lane": {
                "foreground": int(row["origin_foreground_bytes"]),
                "prefetch": int(row["origin_prefetch_bytes"]),
                "warm": int(row["origin_warm_bytes"])},
            "current_cache_bytes": row["current_cache_bytes"],
            # None: only background fetches, whose lines this job does not size by.
            "block_size": None if row["block_size"] is None else int(row["block_size"]),
            "curve": [{"cache_bytes": p.cache_bytes,
                       "byte_hit_ratio": p.byte_hit_ratio,
                       "origin_bytes_per_served_byte": p.origin_bytes_per_served_byte,
                       "read_ahead_wasted_per_served_byte": p.wasted_per_served_byte}
                      for p in curve],
            "recommended_cache_bytes": recommend(curve, options.target_hit_ratio),
            "best_predicted_byte_hit_ratio": best.byte_hit_ratio if best else None,
            # The smallest size on the curve that reaches the best ratio.
            "best_predicted_cache_bytes": best.cache_bytes if best else None,
            "hit_ratio_bound": None,  # filled from the replays (first reads)
            "sample_rate": rates.get(node, 1.0),
        }
    topic_totals: dict[str, dict[str, int]] = {}
    for row in topic_rows:
        total = topic_totals.setdefault(row["topic"], {"served_bytes": 0, "hit_bytes": 0,
                                                       "origin_bytes": 0})
        for name in total:
            total[name] += int(row[name])
    topics = {
        topic: {"served_bytes": t["served_bytes"],
                "byte_hit_ratio": ratio(t["hit_bytes"], t["served_bytes"]),
                "origin_bytes": t["origin_bytes"],
                "miss_bytes": t["served_bytes"] - t["hit_bytes"]}
        # Most origin bytes first: the order of the page's "topics that miss most".
        for topic, t in sorted(topic_totals.items(),
                               key=lambda item: (-item[1]["origin_bytes"], item[0]))
    }
    return {
        "target_hit_ratio": options.target_hit_ratio,
        "nodes": nodes,
        "topics": topics,
        "window_s": window,
        "lines": {"reads": kinds.get("read", 0), "other": kinds.get("other", 0),
                  "malformed": kinds.get("malformed", 0),
                  "unreadable": kinds.get("unreadable", 0)},
        "problems": problems,
    }
