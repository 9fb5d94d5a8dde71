"""The warm-up job: list on the executors, select and route on the driver, warm on the executors.

Stages, each a small Spark job:
1. one task per topic discovers its partition directories (ListObjectsV2 with a
   delimiter);
2. one task per partition lists its segments and, where a replay gives a time
   range, reads each segment's first record batch header;
3. the driver picks the overlapping segments (`selection`) and the node of each
   partition (`routing`);
4. one task per sidecar sends its warm calls (`warming`), unless it is a dry run.

Every listing problem is reported as a PlanError naming the field before
anything is warmed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TextIO

from pyspark.sql import SparkSession

from sidecar.blocks import block_count
from spark_warmup.listing import (
    PartitionListing,
    PartitionWork,
    TopicListing,
    discover_topic,
    list_partition,
)
from spark_warmup.outcome import Summary, WarmRow, format_summary, summarize
from spark_warmup.plan import Plan, PlanError
from spark_warmup.progress import WarmProgress
from spark_warmup.report import write_report
from spark_warmup.routing import route
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

    @property
    def exit_code(self) -> int:
        """0 when every segment was warmed (or planned, for a dry run, with every
        sidecar answering), 1 when any failed."""
        return 0 if all(row.ok for row in self.rows) and not self.problems else 1


def run(spark: SparkSession, plan: Plan, *, report_dir: Path | None = None,
        dry_run: bool = False, out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.monotonic, progress_s: float = 0.0) -> RunResult:
    """Plan the segments, warm them (unless `dry_run`), write the report, print the
    summary; while warming, a progress line every `progress_s` (0: none)."""
    ship_package(spark)
    planned = plan_segments(spark, plan)
    rates = {node: plan.warm_rate(node) for node in plan.sidecars}
    if dry_run:
        rows = [
            WarmRow(s.topic, s.partition, s.key, s.node, s.size,
                    blocks=block_count(s.size, plan.block_size), seconds=s.size / rates[s.node])
            for s in planned
        ]
        summary = summarize(rows, 0.0, dry_run=True, rates=rates)
    else:
        started = clock()
        planned_blocks = sum(block_count(s.size, plan.block_size) for s in planned)
        with WarmProgress(plan.sidecars, planned_blocks, plan.block_size, out, progress_s):
            rows = warm(spark, plan, planned)
        summary = summarize(rows, clock() - started, rates=rates)
    if report_dir is not None:
        write_report(spark, rows, summary, report_dir)
    print(format_summary(summary, rates, [row for row in rows if not row.ok]), file=out,
          flush=True)
    problems: tuple[str, ...] = ()
    if dry_run:
        # What the real run would meet first: every sidecar of the plan answers.
        problems = tuple(problem for node, url in sorted(plan.sidecars.items())
                         if (problem := unanswered(node, url)) is not None)
        for problem in problems:
            print(f"dry run: {problem}", file=out, flush=True)
    return RunResult(tuple(rows), summary, problems)


def plan_segments(spark: SparkSession, plan: Plan) -> list[PlannedSegment]:
    """The segments to warm, each with its node, in topic/partition/offset order."""
    context = spark.sparkContext
    topics = sorted({replay.topic for replay in plan.replays})
    context.setJobDescription("spark_warmup: discover partitions")
    found: list[TopicListing] = (
        context.parallelize(topics, len(topics)).map(partial(discover_topic, plan.origin)).collect()
    )
    _raise_listing_errors(listing.error for listing in found)
    works = _partition_work(plan, {listing.topic: listing for listing in found})
    context.setJobDescription("spark_warmup: list segments")
    listed: list[PartitionListing] = (
        context.parallelize(works, max(1, min(len(works), _MAX_LISTING_TASKS)))
        .map(partial(list_partition, plan.origin)).collect()
    )
    _raise_listing_errors(listing.error for listing in listed)
    chosen: dict[str, Segment] = {}
    for listing in listed:
        for replay in plan.replays:
            if replay.topic == listing.topic and (
                    replay.partitions is None or listing.partition in replay.partitions):
                for segment in select_segments(listing.segments, replay):
                    chosen[segment.key] = segment  # replays may overlap: warm once
    nodes = sorted(plan.sidecars)
    return [
        PlannedSegment(s.topic, s.partition, s.key, s.size,
                       route(s.topic, s.partition, nodes, plan.assignment))
        for s in sorted(chosen.values(), key=lambda s: (s.topic, s.partition, s.start_offset))
    ]


def warm(spark: SparkSession, plan: Plan, planned: Sequence[PlannedSegment]) -> list[WarmRow]:
    """One task per sidecar; each sends its node's warm calls."""
    batches = [
        NodeBatch(
            node=node, url=plan.sidecars[node], bucket=plan.origin.bucket,
            segments=tuple(s for s in planned if s.node == node), ttl_s=plan.ttl_s,
            token=plan.admin_token, concurrency=plan.concurrency, retries=plan.retries,
            block_size=plan.block_size,
        )
        for node in sorted({s.node for s in planned})
    ]
    if not batches:
        return []
    context = spark.sparkContext
    context.setJobDescription("spark_warmup: warm")
    rows: list[WarmRow] = context.parallelize(batches, len(batches)).flatMap(warm_node).collect()
    order = {s.key: i for i, s in enumerate(planned)}
    return sorted(rows, key=lambda row: order[row.key])


def _partition_work(plan: Plan, found: dict[str, TopicListing]) -> list[PartitionWork]:
    where = f"s3://{plan.origin.bucket}/{plan.origin.prefix}"
    works: dict[str, PartitionWork] = {}
    for replay in plan.replays:
        directories = found[replay.topic].partitions
        if not directories:
            raise PlanError(f"{replay.where}.topic: no segments of topic {replay.topic!r} "
                            f"under {where}")
        present = {partition for partition, _ in directories}
        missing = sorted(set(replay.partitions or ()) - present)
        if missing:
            raise PlanError(
                f"{replay.where}.partitions: topic {replay.topic!r} has no partition "
                f"{missing[0]} under {where} (it has {', '.join(map(str, sorted(present)))})"
            )
        for partition, directory in directories:
            if replay.partitions is None or partition in replay.partitions:
                works[directory] = PartitionWork(
                    replay.topic, partition, directory,
                    needs_timestamps(plan.replays, replay.topic, partition),
                )
    return list(works.values())


def _raise_listing_errors(errors: Iterable[str | None]) -> None:
    unique = sorted({error for error in errors if error is not None})
    if unique:
        raise PlanError("; ".join(unique))
