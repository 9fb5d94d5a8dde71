"""Report rows and the run's summary: plain data and arithmetic, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from spark_warmup.groups import GroupLag
from spark_warmup.units import format_bytes


@dataclass(frozen=True)
class WarmRow:
    """One segment of the report (docs/ARCHITECTURE.md: one row per segment)."""

    topic: str
    partition: int
    key: str
    node: str
    bytes: int
    blocks: int = 0
    already_cached: int = 0
    fetched: int = 0
    failed: int = 0
    bytes_fetched: int = 0
    seconds: float = 0.0
    error: str | None = None  # why the warm call itself failed, if it did

    @property
    def ok(self) -> bool:
        return self.error is None and self.failed == 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class NodeTotals:
    segments: int = 0
    bytes: int = 0
    warmed_bytes: int = 0
    failed_bytes: int = 0
    failed_segments: int = 0
    estimated_seconds: float = 0.0


@dataclass(frozen=True)
class Summary:
    dry_run: bool
    segments: int
    planned_bytes: int
    warmed_bytes: int  # bytes of segments whose every block is now cached
    failed_bytes: int
    failed_segments: int
    fetched_bytes: int
    already_cached_blocks: int
    fetched_blocks: int
    seconds: float  # wall time of the warm stage (the estimate, for a dry run)
    nodes: Mapping[str, NodeTotals] = field(default_factory=dict)
    # What the plan's warm-lane rates predicted (the slowest node's bytes over
    # its rate); 0.0 when no rates were given. Beside `seconds` after a real run.
    estimated_seconds: float = 0.0
    # Partitions placed by hashing (no cluster, no assignment entry): their sidecar
    # is probably not the broker that serves them.
    hashed_partitions: int = 0
    # Replicas (replica "all") not warmed: their broker is not in the cluster now.
    unlisted_replicas: int = 0

    @property
    def mb_per_s(self) -> float:
        """Effective warm rate: warmed bytes over the warm stage's wall time (MB = 10^6)."""
        return self.warmed_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        result = asdict(self)
        result["mb_per_s"] = round(self.mb_per_s, 3)
        return result


def summarize(rows: Iterable[WarmRow], seconds: float, dry_run: bool = False,
              rates: Mapping[str, float] | None = None) -> Summary:
    """Totals over the rows; `rates` (node -> bytes/s) give each node's estimate,
    which is the run's duration for a dry run."""
    rows = list(rows)
    nodes: dict[str, NodeTotals] = {}
    for row in rows:
        totals = nodes.get(row.node, NodeTotals())
        nodes[row.node] = NodeTotals(
            segments=totals.segments + 1,
            bytes=totals.bytes + row.bytes,
            warmed_bytes=totals.warmed_bytes + (row.bytes if row.ok and not dry_run else 0),
            failed_bytes=totals.failed_bytes + (0 if row.ok else row.bytes),
            failed_segments=totals.failed_segments + (0 if row.ok else 1),
        )
    if rates:
        nodes = {
            node: NodeTotals(**{**asdict(t), "estimated_seconds": t.bytes / rates[node]})
            for node, t in nodes.items()
        }
    # Sidecars warm side by side: the run takes as long as the busiest one.
    estimated = max((t.estimated_seconds for t in nodes.values()), default=0.0)
    if dry_run:
        seconds = estimated
    return Summary(
        dry_run=dry_run,
        segments=len(rows),
        planned_bytes=sum(r.bytes for r in rows),
        warmed_bytes=sum(t.warmed_bytes for t in nodes.values()),
        failed_bytes=sum(t.failed_bytes for t in nodes.values()),
        failed_segments=sum(t.failed_segments for t in nodes.values()),
        fetched_bytes=sum(r.bytes_fetched for r in rows),
        already_cached_blocks=sum(r.already_cached for r in rows),
        fetched_blocks=sum(r.fetched for r in rows),
        seconds=seconds,
        nodes=dict(sorted(nodes.items())),
        estimated_seconds=estimated,
    )


# Failed segments named on the console; report.jsonl (--report) has them all.
SHOWN_FAILURES = 5


def format_summary(summary: Summary, rates: Mapping[str, float] | None = None,
                   failures: Sequence[WarmRow] = ()) -> str:
    """The console summary; `failures` (rows that did not warm) are named with
    their reason, the first SHOWN_FAILURES of them. Sizes and rates in MiB."""
    rates = rates or {}
    if summary.dry_run:
        lines = [
            f"dry run: {_count(summary.segments, 'segment')}, "
            f"{format_bytes(summary.planned_bytes)} planned on "
            f"{_count(len(summary.nodes), 'sidecar')}; estimated {summary.seconds:.1f} s "
            f"at the warm-lane rates (nothing warmed)"
        ]
        lines += [
            f"  {node}: {_count(t.segments, 'segment')}, {format_bytes(t.bytes)}, "
            f"~{t.estimated_seconds:.1f} s at {format_bytes(rates.get(node, 0))}/s"
            for node, t in summary.nodes.items()
        ]
        return "\n".join(lines)
    rate = summary.warmed_bytes / summary.seconds if summary.seconds > 0 else 0.0
    lines = [
        f"warm-up: {_count(summary.segments, 'segment')} on "
        f"{_count(len(summary.nodes), 'sidecar')}: "
        f"planned {format_bytes(summary.planned_bytes)}, "
        f"warmed {format_bytes(summary.warmed_bytes)} "
        f"(fetched {format_bytes(summary.fetched_bytes)}, "
        f"{_count(summary.already_cached_blocks, 'block')} already cached), "
        f"failed {format_bytes(summary.failed_bytes)} in "
        f"{_count(summary.failed_segments, 'segment')}, "
        f"{summary.seconds:.1f} s"
        + (f" (estimated {summary.estimated_seconds:.1f} s)" if summary.estimated_seconds else "")
        + f", {format_bytes(rate)}/s effective"
    ]
    lines += [
        f"  {node}: {_count(t.segments, 'segment')}, warmed {format_bytes(t.warmed_bytes)}, "
        f"failed {format_bytes(t.failed_bytes)}"
        for node, t in summary.nodes.items()
    ]
    for row in failures[:SHOWN_FAILURES]:
        why = row.error or f"{row.failed} of {row.blocks} blocks failed"
        lines.append(f"  failed: {row.topic}-{row.partition} {row.key} on {row.node}: {why}")
    if len(failures) > SHOWN_FAILURES:
        lines.append(f"  ... and {len(failures) - SHOWN_FAILURES} more failed segments "
                     "(--report DIR lists every one in report.jsonl)")
    return "\n".join(lines)


# Partitions named in the hashing warning; the count says how many there are.
SHOWN_HASHED = 5


def hashing_warning(hashed: Sequence[str], sidecars: int) -> str:
    """The warning for partitions routed by hashing their names over the plan's sidecars."""
    names = ", ".join(hashed[:SHOWN_HASHED]) + (", ..." if len(hashed) > SHOWN_HASHED else "")
    return (f"warning: {_count(len(hashed), 'partition')} ({names}) placed by hashing "
            f"topic-partition over {_count(sidecars, 'sidecar')}: neither the plan's "
            "\"kafka\" cluster nor its assignment says which broker serves them, so the "
            "warmed bytes may sit on a node that never reads them")


def unlisted_replicas_warning(unlisted: Sequence[str]) -> str:
    """The warning for replicas (replica "all") whose broker the cluster does not
    list: not warmed, and said so rather than left out of the report unseen."""
    names = ", ".join(unlisted[:SHOWN_HASHED]) + (", ..." if len(unlisted) > SHOWN_HASHED
                                                  else "")
    one = len(unlisted) == 1
    its, it, back = (("its broker is", "it", "it is") if one
                     else ("their brokers are", "them", "they are"))
    return (f"warning: {_count(len(unlisted), 'replica')} not warmed ({names}): {its} not "
            f"in the cluster now (down?), so no sidecar could be found for {it}; warm again "
            f"once {back} back")


def format_groups(lags: Iterable[GroupLag], dry_run: bool = False) -> str:
    """One line per group replay: its lag in records, and in bytes as far as it is in
    remote storage (the segments of its next reads, which the run warms)."""
    lines = []
    for lag in lags:
        partitions = len(lag.behind) + len(lag.caught_up)
        line = (f"group {lag.group} on {lag.topic} ({lag.where}): lag "
                f"{lag.lag_records:,} records on {_count(len(lag.behind), 'partition')}"
                f" of {partitions}")
        if lag.uncommitted:
            shown = ", ".join(map(str, lag.uncommitted[:SHOWN_HASHED]))
            more = ", ..." if len(lag.uncommitted) > SHOWN_HASHED else ""
            line += f"; no committed offset in partition(s) {shown}{more} (not warmed)"
        # The bytes of lag are known only where they are remote: the selected
        # segments, whole (the first holds some records before the commit).
        line += (f"; in remote storage: {_count(lag.segments, 'segment')}, "
                 f"{format_bytes(lag.bytes)} ({'would warm' if dry_run else 'to warm'})")
        lines.append(line)
    return "\n".join(lines)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
