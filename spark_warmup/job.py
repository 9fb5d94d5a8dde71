"""The warm-up job: list on the executors, select and route on the driver, warm on the executors.

Stages:
0. on the driver, before anything else, the plan's Kafka cluster (if it names
   one) is read once (`cluster`): brokers, partition replicas, and the committed
   and end offsets of the groups it names; the groups become offset ranges
   (`groups`);
then each a small Spark job:
1. one task per topic discovers its partition directories (ListObjectsV2 with a
   delimiter), of the topic's id in the cluster where the plan names one;
2. one task per partition lists its segments and, where a replay gives a time
   range, reads each segment's first record batch header;
3. the driver picks the overlapping segments (`selection`) and the node(s) of
   each partition (`routing`: assignment, else the cluster's serving broker,
   else hashing);
4. one task per sidecar sends its warm calls (`warming`), unless it is a dry run.

Every cluster and listing problem is reported as a PlanError naming the field before
anything is warmed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TextIO

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from spark_warmup.cluster import read_cluster
from spark_warmup.groups import GroupLag, resolve_groups
from spark_warmup.listing import (
    PartitionListing,
    PartitionWork,
    TopicListing,
    discover_topic,
    list_partition,
)
from spark_warmup.metadata import ClusterFacts
from spark_warmup.outcome import (
    Summary,
    WarmRow,
    format_groups,
    format_summary,
    hashing_warning,
    summarize,
    unlisted_replicas_warning,
)
from spark_warmup.plan import Plan, PlanError, Replay
from spark_warmup.progress import WarmProgress, stats_reader
from spark_warmup.report import spark_failure, write_report
from spark_warmup.routing import Routes, route_partitions
from spark_warmup.selection import Segment, needs_timestamps, select_segments
from spark_warmup.shipping import ship_package
from spark_warmup.warming import NodeBatch, PlannedSegment, unanswered, warm_node

# Listing tasks at most: more only adds scheduling overhead for tiny listings.
_MAX_LISTING_TASKS = 64


@dataclass(frozen=True)
class RunResult:
    rows: tuple[WarmRow, ...]
    summary: Summary
    # A dry run's findings that a real run would fail on (a sidecar not answering).
    problems: tuple[str, ...] = ()
    groups: tuple[GroupLag, ...] = ()  # each group replay's lag and what it warms
    hashed: tuple[str, ...] = ()  # partitions routed by hashing (no cluster, no assignment)
    # Why the report could not be written (the summary was printed all the same).
    report_error: str | None = None

    @property
    def exit_code(self) -> int:
        """0 when every segment was warmed (or planned, for a dry run, with every
        sidecar answering) and the report written, 1 otherwise."""
        ok = all(row.ok for row in self.rows) and not self.problems
        return 0 if ok and self.report_error is None else 1


@dataclass(frozen=True)
class Planned:
    """The segments to warm, each with its node, and how they were chosen."""

    segments: tuple[PlannedSegment, ...]
    routes: Routes
    groups: tuple[GroupLag, ...] = ()

    @property
    def sidecars(self) -> dict[str, str]:
        """Node -> admin URL of every node the plan names or a partition goes to."""
        return dict(sorted(self.routes.nodes.items()))


def run(spark: SparkSession, plan: Plan, *, report_dir: Path | None = None,
        dry_run: bool = False, out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.monotonic, progress_s: float = 0.0,
        cluster: ClusterFacts | None = None,
        read: Callable[[Plan], ClusterFacts | None] = read_cluster) -> RunResult:
    """Plan the segments, warm them (unless `dry_run`), write the report, print the
    summary; while warming, a progress line every `progress_s` (0: none).

    `cluster`: the plan's cluster as already read (by `__main__`, before Spark
    started); else `read` reads it here, before any Spark job."""
    if cluster is None:
        cluster = read(plan)
    ship_package(spark)
    chosen = plan_run(spark, plan, cluster)
    planned = list(chosen.segments)
    sidecars = chosen.sidecars
    rates = {node: plan.warm_rate(node) for node in sidecars}
    if chosen.groups:
        print(format_groups(chosen.groups, dry_run), file=out, flush=True)
    if dry_run:
        rows = [
            WarmRow(s.topic, s.partition, s.key, s.node, s.bytes,
                    blocks=s.blocks(plan.block_size), seconds=s.bytes / rates[s.node])
            for s in planned
        ]
        summary = summarize(rows, 0.0, dry_run=True, rates=rates)
    else:
        started = clock()
        planned_blocks = sum(s.blocks(plan.block_size) for s in planned)
        with WarmProgress(sidecars, planned_blocks, plan.block_size, out, progress_s,
                          read=stats_reader(plan.admin_token, plan.ca_file)):
            rows = warm(spark, plan, planned, sidecars)
        summary = summarize(rows, clock() - started, rates=rates)
    summary = replace(summary, hashed_partitions=len(chosen.routes.hashed),
                      unlisted_replicas=len(chosen.routes.unlisted_replicas))
    print(format_summary(summary, rates, [row for row in rows if not row.ok]), file=out,
          flush=True)
    if chosen.routes.hashed:
        print(hashing_warning(chosen.routes.hashed, len(plan.sidecars)), file=out, flush=True)
    if chosen.routes.unlisted_replicas:
        print(unlisted_replicas_warning(chosen.routes.unlisted_replicas), file=out, flush=True)
    problems: tuple[str, ...] = ()
    if dry_run:
        # What the real run would meet first: every sidecar of the plan answers.
        problems = tuple(problem for node, url in sidecars.items()
                         if (problem := unanswered(node, url, ca_file=plan.ca_file))
                         is not None)
        for problem in problems:
            print(f"dry run: {problem}", file=out, flush=True)
    # Last, after the summary is out: a report that cannot be written (its directory
    # was checked before Spark started, but a disk fills up) loses only itself.
    report_error = None
    if report_dir is not None:
        try:
            write_report(spark, rows, summary, report_dir)
        except OSError as exc:
            report_error = (f"cannot write the report under {report_dir}: "
                            f"{exc.filename or report_dir}: {exc.strerror or exc}")
        except Py4JJavaError as exc:  # the Parquet copy, written by Spark
            report_error = (f"cannot write the report under {report_dir}: report.parquet: "
                            f"{spark_failure(exc)}")
    return RunResult(tuple(rows), summary, problems, chosen.groups, chosen.routes.hashed,
                     report_error)


def plan_segments(spark: SparkSession, plan: Plan,
                  cluster: ClusterFacts | None = None) -> list[PlannedSegment]:
    """The segments to warm, each with its node, in topic/partition/offset order."""
    return list(plan_run(spark, plan, cluster).segments)


def plan_run(spark: SparkSession, plan: Plan, cluster: ClusterFacts | None) -> Planned:
    """The segments to warm with their nodes (topic/partition/offset order), the
    routes, and each group replay's lag with what it selects."""
    replays, lags = resolve_groups(plan.replays, cluster.groups if cluster else {})
    listed = _list(spark, plan, replays, cluster)
    chosen: dict[str, Segment] = {}
    selected: dict[str, dict[str, Segment]] = {}  # group replay field -> its segments
    for listing in listed:
        for replay in replays:
            if replay.topic == listing.topic and (
                    replay.partitions is None or listing.partition in replay.partitions):
                for segment in select_segments(listing.segments, replay):
                    chosen[segment.key] = segment  # replays may overlap: warm once
                    if replay.group is not None:
                        selected.setdefault(replay.where, {})[segment.key] = segment
    lags = tuple(replace(lag, segments=len(selected.get(lag.where, {})),
                         bytes=sum(s.warm_bytes for s in selected.get(lag.where, {}).values()))
                 for lag in lags)
    where: dict[str, str] = {}
    for replay in replays:
        where.setdefault(replay.topic, replay.where)
    routes = route_partitions(
        ((s.topic, s.partition, where[s.topic]) for s in chosen.values()), plan, cluster)
    segments = tuple(
        PlannedSegment(s.topic, s.partition, s.key, s.size, node, s.companions)
        for s in sorted(chosen.values(), key=lambda s: (s.topic, s.partition, s.start_offset))
        for node in routes.targets[(s.topic, s.partition)]
    )
    return Planned(segments, routes, lags)


def _list(spark: SparkSession, plan: Plan, replays: tuple[Replay, ...],
          cluster: ClusterFacts | None = None) -> list[PartitionListing]:
    """The listed segments of every partition the replays touch (two Spark jobs)."""
    context = spark.sparkContext
    topics = sorted({replay.topic for replay in plan.replays})
    context.setJobDescription("spark_warmup: discover partitions")
    found: list[TopicListing] = (
        context.parallelize(topics, len(topics)).map(partial(discover_topic, plan.origin)).collect()
    )
    _raise_listing_errors(listing.error for listing in found)
    works = _partition_work(replays, plan, {listing.topic: listing for listing in found},
                            cluster.topic_ids if cluster is not None else {})
    context.setJobDescription("spark_warmup: list segments")
    listed: list[PartitionListing] = (
        context.parallelize(works, max(1, min(len(works), _MAX_LISTING_TASKS)))
        .map(partial(list_partition, plan.origin)).collect()
    )
    _raise_listing_errors(listing.error for listing in listed)
    return listed


def warm(spark: SparkSession, plan: Plan, planned: Sequence[PlannedSegment],
         sidecars: Mapping[str, str] | None = None) -> list[WarmRow]:
    """One task per sidecar; each sends its node's warm calls. `sidecars`: node ->
    admin URL (default: the plan's)."""
    urls = plan.sidecars if sidecars is None else sidecars
    batches = [
        NodeBatch(
            node=node, url=urls[node], bucket=plan.origin.bucket,
            segments=tuple(s for s in planned if s.node == node), ttl_s=plan.ttl_s,
            token=plan.admin_token, concurrency=plan.concurrency, retries=plan.retries,
            block_size=plan.block_size, ca_file=plan.ca_file,
        )
        for node in sorted({s.node for s in planned})
    ]
    if not batches:
        return []
    context = spark.sparkContext
    context.setJobDescription("spark_warmup: warm")
    rows: list[WarmRow] = context.parallelize(batches, len(batches)).flatMap(warm_node).collect()
    order = {(s.key, s.node): i for i, s in enumerate(planned)}
    return sorted(rows, key=lambda row: order[(row.key, row.node)])


def _partition_work(replays: Sequence[Replay], plan: Plan, found: dict[str, TopicListing],
                    topic_ids: Mapping[str, str] | None = None) -> list[PartitionWork]:
    """The partition directories to list. `topic_ids`: each topic's id in the
    plan's cluster; a topic deleted and created again under the same name left
    its former remote segments under another id, which no broker reads."""
    where = f"s3://{plan.origin.bucket}/{plan.origin.prefix}"
    works: dict[str, PartitionWork] = {}
    for replay in replays:
        directories = found[replay.topic].partitions
        live = (topic_ids or {}).get(replay.topic)
        if live is not None and directories:
            former = sorted({topic_id for _, _, topic_id in directories if topic_id != live})
            directories = tuple(d for d in directories if d[2] == live)
            if not directories:
                raise PlanError(
                    f"{replay.where}.topic: no segments of topic {replay.topic!r} (id {live}) "
                    f"under {where}, only of a former topic of that name "
                    f"(id {', '.join(former)})")
        if not directories:
            raise PlanError(f"{replay.where}.topic: no segments of topic {replay.topic!r} "
                            f"under {where}")
        present = {partition for partition, _, _ in directories}
        missing = sorted(set(replay.partitions or ()) - present)
        # A group's partition with nothing in remote storage yet (its whole lag
        # still on the brokers' disks) has nothing to warm; a partition the plan
        # names itself must be there.
        if missing and replay.group is None:
            raise PlanError(
                f"{replay.where}.partitions: topic {replay.topic!r} has no partition "
                f"{missing[0]} under {where} (it has {', '.join(map(str, sorted(present)))})"
            )
        for partition, directory, _ in directories:
            if replay.partitions is None or partition in replay.partitions:
                works[directory] = PartitionWork(
                    replay.topic, partition, directory,
                    needs_timestamps(replays, replay.topic, partition),
                )
    return list(works.values())


def _raise_listing_errors(errors: Iterable[str | None]) -> None:
    unique = sorted({error for error in errors if error is not None})
    if unique:
        raise PlanError("; ".join(unique))
