"""Results -> BENCHMARKS.md and the console summary. Pure: a results dict in, text out.

The targets are judged in bench/report_targets.py; each scenario family's
sections are rendered by bench/report_replays.py, report_cost.py,
report_isolation.py, report_warmup.py and report_broker.py; their prose and
the methods are bench/report_methods.md.
"""

from __future__ import annotations

from pathlib import Path

from bench.report_broker import broker_section
from bench.report_cost import cost_sections
from bench.report_format import (
    MiB,
    Results,
    foreign_cores,
    md_table,
    num,
    paragraph,
    pct,
    sidecar_stat,
    status_text,
    verbatim,
)
from bench.report_isolation import isolation_sections
from bench.report_replays import replay_sections
from bench.report_targets import evaluate_targets
from bench.report_warmup import warmup_section


def render_markdown(results: Results) -> str:
    return "\n".join([
        *_header(results), *_targets(results), *replay_sections(results),
        *cost_sections(results), *isolation_sections(results), *warmup_section(results),
        *broker_section(results), *_fragments(), *_failures(results), verbatim("methods"),
    ]).rstrip() + "\n"


def _header(results: Results) -> list[str]:
    machine = results.get("machine") or {}
    dataset = results.get("dataset") or {}
    quick = results.get("quick")
    out = ["# Benchmarks\n", paragraph("header") + "\n"]
    if quick:
        out.append(paragraph("header-quick") + "\n")
    out.append(md_table(["", ""], [
        ["command", f"`{results.get('command', 'make bench')}`"],
        ["date (UTC)", f"{results.get('started_at', '?')} .. {results.get('finished_at', '?')} "
                       f"({num(results.get('seconds'), 0)} s)"],
        ["machine", f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, "
                    f"{machine.get('ram_gib', '?')} GiB RAM"],
        ["uname -a", f"`{machine.get('uname_a') or machine.get('uname', '?')}`"],
        ["software", f"Python {machine.get('python', '?')}, {machine.get('nginx', '?')}, "
                     f"{machine.get('wrk', '?')}, Debian {machine.get('debian', '?')}"],
        ["commit", f"`{machine.get('git_commit', '?')}`"
                   f"{' (with uncommitted changes)' if machine.get('git_dirty') else ''}"],
        ["data set", f"{dataset.get('objects', '?')} genuine Kafka segments of topic "
                     f"`{dataset.get('topic', '?')}`: "
                     f"{dataset.get('partitions', '?')} partitions x "
                     f"{dataset.get('segments_per_partition', '?')} segments x "
                     f"{num((dataset.get('segment_bytes') or 0) / MiB, 0)} MiB = "
                     f"{num((dataset.get('bytes') or 0) / MiB, 1)} MiB, record values "
                     f"{dataset.get('value_size', '?')} B"],
        ["raw results", "`bench/results/latest.json` (and the timestamped file beside it)"
         if not quick else "`bench/results/*-quick.json`"],
        *[[f"scenarios {', '.join(m.get('scenarios') or [])}",
           f"measured in a later run, `{m.get('command')}`, {m.get('started_at', '?')} .. "
           f"{m.get('finished_at', '?')} (`bench/results/{m.get('file')}`)"
           + (" (**quick**)" if m.get("quick") else "")]
          for m in results.get("merged") or []],
    ]))
    out.append("")
    return out


def _targets(results: Results) -> list[str]:
    out = ["## Targets\n"]
    rows = [[t["target"], t["required"], t["measured"], status_text(t["met"]),
             t.get("note", "")]
            for t in results.get("targets") or evaluate_targets(results)]
    out.append(md_table(["target", "required", "measured", "status", "note"], rows))
    out.append("")
    missed = [t for t in results.get("targets") or [] if t["met"] is False]
    if missed:
        out.append(f"{len(missed)} of {len(rows)} targets are **not met** in this run.\n")
        analysis = Path(__file__).with_name("ANALYSIS.md")
        if analysis.exists():
            out.append(analysis.read_text().rstrip() + "\n")
    return out


def _failures(results: Results) -> list[str]:
    errors = results.get("errors") or []
    if not errors:
        return []
    out = ["## Failures in this run\n"]
    for error in errors:
        text = " ".join(str(error.get("error", "")).split())[:600]
        out.append(f"- `{error.get('scenario')}/{error.get('run')}`: {text}")
    out.append("")
    return out


# Sections measured by scripts of their own (python -m bench.recovery --record,
# bench.disk_io, bench.capacity_accuracy, bench.capacity_scale), each written as a markdown
# fragment beside the results; spliced in as they are.
FRAGMENTS = ("recovery.md", "disk-io.md", "capacity-accuracy.md", "capacity-scale.md")


def _fragments() -> list[str]:
    results = Path(__file__).with_name("results")
    return [(results / name).read_text().rstrip() + "\n" for name in FRAGMENTS
            if (results / name).exists()]


def console_summary(results: Results) -> str:
    lines = ["", "targets:"]
    for target in results.get("targets") or []:
        lines.append(f"  {status_text(target['met']).replace('**', ''):13} {target['target']}: "
                     f"{target['measured']} (required {target['required']})"
                     + (f"  [{target['note']}]" if target.get("note") else ""))
    for scenario, info in (results.get("scenarios") or {}).items():
        for run, data in (info.get("runs") or {}).items():
            if data is None:
                lines.append(f"  {scenario:12} {run:22} FAILED")
            elif data.get("kind") == "probe":
                lateness = (data.get("probe") or {}).get("lateness_us") or {}
                replay = data.get("replay") or {}
                lines.append(f"  {scenario:12} {run:22} probe p50 {lateness.get('p50')} us  "
                             f"p99 {lateness.get('p99')} us  max {lateness.get('max')} us"
                             + (f"  replay {replay.get('mb_per_s')} MB/s" if replay else "")
                             + f"  other processes {foreign_cores(data):.2f} cores")
            elif data.get("kind") == "misses":
                for phase in ("idle", "loaded"):
                    total = (data.get(phase) or {}).get("total_ms") or {}
                    lines.append(f"  {scenario:12} {'misses ' + phase:22} p50 {total.get('p50')} "
                                 f"ms  p99 {total.get('p99')} ms  "
                                 f"({(data.get(phase) or {}).get('counted')} counted)")
            elif data.get("kind") == "capacity-accuracy":
                lines.append(f"  {scenario:12} {run:22} {data.get('within')} of "
                             f"{data.get('cells')} cells within the target; worst: "
                             f"{data.get('worst')}")
            elif "median_seconds" in data:
                lines.append(f"  {scenario:12} {run:22} indexed in {data.get('seconds')} s "
                             f"(recovered {data.get('recovered')})")
            elif "warm_lane" in data:
                lane = data.get("warm_lane") or {}
                lines.append(f"  {scenario:12} {run:22} via {data.get('via')}: "
                             f"{(data.get('bytes_fetched') or 0) / MiB:.0f} MiB, warm lane "
                             f"{(lane.get('bytes_per_s') or 0) / MiB:.1f} MiB/s "
                             f"({pct(data.get('warm_lane_vs_budget'), 1)} of budget)")
            elif "requests_per_s" in data:
                lines.append(f"  {scenario:12} {run:22} {data['requests_per_s']:>9} req/s "
                             f"{data['mb_per_s']:>9} MB/s  p50 {data['latency_ms']['p50']} ms  "
                             f"p99 {data['latency_ms']['p99']} ms")
            else:
                latency = data.get("fetch_latency_ms") or {}
                lines.append(f"  {scenario:12} {run:22} {data.get('mb_per_s')!s:>9} MB/s  "
                             f"fetch p50 {latency.get('p50')} ms  p99 {latency.get('p99')} ms  "
                             f"byte hit {pct(sidecar_stat(data, 'byte_hit_ratio'))}")
    return "\n".join(lines)


def merge_results(base: Results, extra: Results, name: str) -> Results:
    """`base` with the scenarios measured in `extra` (another run) taking their place.

    Used to regenerate BENCHMARKS.md from a full run plus a later partial one
    (`--report-only latest.json partial.json`); where each scenario came from is
    kept under "merged" and shown in the report.
    """
    merged = dict(base)
    scenarios = dict(base.get("scenarios") or {})
    taken = sorted((extra.get("scenarios") or {}).keys())
    for scenario in taken:
        scenarios[scenario] = extra["scenarios"][scenario]
    merged["scenarios"] = scenarios
    merged["errors"] = [e for e in base.get("errors") or [] if e.get("scenario") not in taken]
    merged["errors"] += list(extra.get("errors") or [])
    merged["merged"] = [*(base.get("merged") or []), {
        "file": name, "command": extra.get("command"), "started_at": extra.get("started_at"),
        "finished_at": extra.get("finished_at"), "quick": extra.get("quick"),
        "scenarios": taken,
    }]
    merged["targets"] = evaluate_targets(merged)
    return merged
