"""`python -m bench [--quick] [--only NAME[,NAME]] [--report-only RESULTS.json ...]`.

Scenarios (in this order; each starts its own servers, with fresh caches):

  cold-1p      one partition, one stream, cold: origin direct, nginx slice
               cold, sidecar cold
  cold-4p      four partitions at once, cold: origin direct, nginx slice cold,
               nginx slice warm (the same replay again), sidecar cold
  warm-replay  the four-partition replay again against the sidecar of cold-4p
  warm-ranges  wrk: random 1 MiB ranges against that warm sidecar, one whose
               memory tier holds the data set, nginx serving the same files
               from local disk, and three floor servers (bench/floor_server.py,
               aiohttp): from the page cache, each chunk read with O_DIRECT
               and hashed first, each chunk's slice sent with sendfile; all
               up at once, rounds taking them in turn; each server's CPU per
               GiB from /proc
  isolation    a latency probe pinned to CPU 0 (1 ms sleeps, wake-up lateness)
               idle, then while the sidecar (--cpus 1), nginx and the replay
               (taskset -c 1) run a cold four-partition replay, and once with
               nothing pinned; then foreground miss latency through a sidecar
               with --origin-bandwidth, idle and while a big warm-up runs
  cost-4p      the light client (no CRC work), four partitions at once: the
               sidecar cold then warm (also with its memory tier off, and with
               one that holds the data set), nginx slice cold then warm, the origin
               direct, with each server's CPU-seconds per GiB from /proc;
               several rounds (bench/cost.py)
  wide-48p     48 partitions x one 24 MiB segment at once, light client:
               sidecar cold vs nginx slice cold, fetch p99, first and last
               partition done, the sidecar's peak RSS
  warmup       warm the whole data set (the Spark job, else direct warm calls)
               into a fresh sidecar whose warm lane has a 160 MiB/s budget, then
               replay everything through it: warm-lane rate and hit ratio
  restart      restart after a kill -9 over 100k slots, 3 times (bench/recovery.py)
  capacity-accuracy
               the capacity curve's predictions against real sidecars over a grid:
               1, 4, 16 and 48 streams, one group, several groups, a lagging
               consumer, caches of 10-100% of the working set
               (bench/capacity_accuracy.py; its table is spliced in as a fragment)
  broker       a real Kafka broker (tests/kafka, `make kafka`): consumers catch up on
               512 MiB tiered over 4 partitions (64 MiB with --quick) through its
               remote storage manager straight to the origin, with the manager's own
               disk chunk cache, through a cold and a warmed sidecar, and from the
               broker's local log; MB/s, CPU per GiB of the broker and the sidecar,
               origin traffic, the manager's request pattern (bench/broker.py)

warm-replay and warm-ranges reuse the sidecar cold-4p warmed; run alone (with
--only) they warm a fresh sidecar with one replay first, recorded as a warm-up.
isolation, warmup and broker start their own servers (bench/isolation.py,
bench/warmup.py, bench/broker.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.broker import run_broker
from bench.capacity_accuracy import run_capacity_accuracy
from bench.cold_1p import run_cold_1p
from bench.cost import run_cost_4p, run_wide
from bench.dataset import Dataset, ensure_dataset
from bench.four_partitions import NAMES as FOUR_PARTITIONS
from bench.four_partitions import run_four_partitions
from bench.harness import BENCH_DIR, DATA, FULL_SETTINGS, QUICK_SETTINGS, REPO, Bench, Settings
from bench.isolation import run_isolation
from bench.machine import machine_info
from bench.nginx import FIRST_BYTE_S, ORIGIN_RATE, ORIGIN_SEND_CHUNK, SLICE
from bench.report import console_summary, merge_results, render_markdown
from bench.report_targets import evaluate_targets
from bench.restart import run_restart
from bench.stopping import unwind_on_signals
from bench.warmup import run_warmup

RESULTS = BENCH_DIR / "results"
RESULTS_VERSION = 1


@dataclass(frozen=True)
class Scenario:
    """A step of the run: the scenario names it measures, and how."""

    names: tuple[str, ...]
    run: Callable[[Bench, set[str]], None]
    needs_dataset: bool = True  # the 1 GiB data set (bench/dataset.py)


# In the order they run. cold-4p, warm-replay and warm-ranges are one step: the
# latter two read the sidecar cold-4p warmed.
STEPS = (
    Scenario(("cold-1p",), lambda bench, _: run_cold_1p(bench)),
    Scenario(FOUR_PARTITIONS, run_four_partitions),
    Scenario(("cost-4p",), lambda bench, _: run_cost_4p(bench)),
    Scenario(("wide-48p",), lambda bench, _: run_wide(bench)),
    Scenario(("isolation",), lambda bench, _: run_isolation(bench)),
    Scenario(("warmup",), lambda bench, _: run_warmup(bench)),
    Scenario(("restart",), lambda bench, _: run_restart(bench)),
    Scenario(("capacity-accuracy",), lambda bench, _: run_capacity_accuracy(bench),
             needs_dataset=False),
    Scenario(("broker",), lambda bench, _: run_broker(bench)),
)
SCENARIOS = tuple(name for step in STEPS for name in step.names)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="256 MiB data set and 5 s wrk runs: checks the harness in minutes")
    parser.add_argument("--only", default=None, metavar="NAME[,NAME]",
                        help=f"run only these scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--report-only", type=Path, nargs="+", default=None,
                        metavar="RESULTS.json",
                        help="regenerate BENCHMARKS.md from a results file and exit (its "
                             "targets read again from its scenarios); with more files, the "
                             "scenarios of each later one replace the earlier")
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="rounds of cost-4p and wide-48p, and warm-ranges' turns "
                             "(default 3; 1 with --quick)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep bench/results/tmp/<run> (configs, logs) after the run")
    args = parser.parse_args(argv)
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(names) - set(SCENARIOS))
        if unknown:
            parser.error(f"--only: unknown scenario(s) {', '.join(unknown)}; "
                         f"known: {', '.join(SCENARIOS)}")
        args.only = names
    return args


def write_report(results: dict[str, Any], markdown: Path) -> None:
    markdown.write_text(render_markdown(results))


def _report_only(paths: list[Path]) -> int:
    base, *more = paths
    merged: dict[str, Any] = json.loads(base.read_text())
    for path in more:
        merged = merge_results(merged, json.loads(path.read_text()), path.name)
    # Read again by the harness's current rules (and notes), from the scenarios.
    merged["targets"] = evaluate_targets(merged)
    write_report(merged, REPO / "BENCHMARKS.md")
    print(f"wrote {REPO / 'BENCHMARKS.md'} from {', '.join(map(str, paths))}")
    return 0


def _header(settings: Settings, selected: set[str], command: str, dataset: Dataset,
            built: bool, build_seconds: float) -> dict[str, Any]:
    """What the results say about the run before its scenarios."""
    return {
        "version": RESULTS_VERSION,
        "started_at": _now(),
        "command": command,
        "quick": settings.quick,
        "scenarios_selected": [name for name in SCENARIOS if name in selected],
        "settings": asdict(settings),
        "machine": machine_info(REPO),
        "dataset": {
            "name": dataset.spec.name, "bucket": dataset.spec.bucket, "topic": dataset.spec.topic,
            "topic_id": dataset.topic_id, "partitions": dataset.spec.partitions,
            "segments_per_partition": dataset.spec.segments_per_partition,
            "segment_bytes": dataset.spec.segment_bytes, "value_size": dataset.spec.value_size,
            "objects": len(dataset.objects), "bytes": dataset.total_bytes,
            "built_this_run": built, "build_seconds": round(build_seconds, 2),
        },
        "origin_model": {
            "first_byte_ms": FIRST_BYTE_S * 1000, "limit_rate": ORIGIN_RATE,
            "sendfile_max_chunk": ORIGIN_SEND_CHUNK,
        },
        "baselines": {"nginx_slice": SLICE},
    }


def _run_steps(bench: Bench, selected: set[str]) -> None:
    """Each selected step in turn; one that fails outside its runs is recorded
    as failed and the next steps still run."""
    try:
        for step in STEPS:
            names = [name for name in step.names if name in selected]
            if not names:
                continue
            try:
                step.run(bench, selected)
            except Exception as exc:
                # Under each scenario of the step: any of them may be short of
                # runs, and a later partial run that measures one again
                # replaces its failure with it (merge_results).
                for name in names:
                    bench.failed(name, "*", exc)
    except KeyboardInterrupt:
        bench.errors.append({"scenario": "*", "run": "*", "error": "interrupted"})
        print("bench: interrupted; writing what was measured", file=sys.stderr)


def _finish(results: dict[str, Any], bench: Bench, started: float, stamp: str, suffix: str,
            keep_work: bool) -> None:
    """Write the results and their report; drop the work directory unless kept."""
    results["scenarios"] = bench.scenarios
    results["errors"] = bench.errors
    results["finished_at"] = _now()
    results["seconds"] = round(time.monotonic() - started, 1)
    results["targets"] = evaluate_targets(results)

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{stamp}{suffix}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"bench: results in {out}", file=sys.stderr)
    if suffix:
        markdown = RESULTS / f"{stamp}{suffix}.md"
    else:
        (RESULTS / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
        markdown = REPO / "BENCHMARKS.md"
    write_report(results, markdown)
    print(f"bench: report in {markdown}", file=sys.stderr)
    print(console_summary(results))
    if bench.errors or keep_work:
        print(f"bench: configs and logs kept in {bench.work}", file=sys.stderr)
    else:
        shutil.rmtree(bench.work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unwind_on_signals()
    if args.report_only:
        return _report_only(args.report_only)

    settings = QUICK_SETTINGS if args.quick else FULL_SETTINGS
    if args.rounds is not None:
        if args.rounds < 1:
            print("python -m bench: --rounds must be at least 1", file=sys.stderr)
            return 2
        settings = replace(settings, cost_rounds=args.rounds)
    selected = set(args.only or SCENARIOS)
    partial = bool(args.only) and set(args.only) != set(SCENARIOS)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = "-quick" if settings.quick else ("-partial" if partial else "")
    work = RESULTS / "tmp" / f"{stamp}{suffix}"
    work.mkdir(parents=True)
    (work / "logs").mkdir()
    started = time.monotonic()
    command = "make bench" if not settings.quick and not partial else (
        "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])).strip()

    print(f"bench: data set {settings.dataset.name} "
          f"({settings.dataset.nominal_bytes / 2**20:.0f} MiB) in {DATA}", file=sys.stderr)
    built_at = time.monotonic()
    if any(step.needs_dataset for step in STEPS if selected & set(step.names)):
        dataset, built = ensure_dataset(settings.dataset, DATA)
    else:  # nothing selected reads it: not written for nothing
        dataset, built = Dataset(DATA, settings.dataset, "", ()), False
    build_seconds = time.monotonic() - built_at
    print(f"bench: data set {'written' if built else 'reused'}: {len(dataset.objects)} segments, "
          f"{dataset.total_bytes / 2**20:.1f} MiB ({build_seconds:.1f} s)", file=sys.stderr)

    bench = Bench(settings, dataset, work)
    results = _header(settings, selected, command, dataset, built, build_seconds)
    try:
        _run_steps(bench, selected)
    finally:
        _finish(results, bench, started, stamp, suffix, args.keep_work)
    return 1 if bench.errors else 0
