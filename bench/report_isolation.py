"""The report's isolation sections (bench/isolation.py): a latency probe on the
other core while the sidecar replays, and foreground misses under a warm-up."""

from __future__ import annotations

from typing import Any

from bench.report_format import (
    MiB,
    Results,
    Run,
    find_run,
    mbps,
    md_table,
    num,
    paragraph,
    pct,
    probe_p99,
    ratio_of,
    times,
)

_PROBE_ROWS = (("idle", "idle"), ("pinned", "**cold replay, load pinned to CPU {load_cpu}**"),
               ("unpinned", "cold replay, nothing pinned (contrast)"),
               ("idle_after", "idle again, afterwards"))
_MISS_ROWS = (("origin_direct", "origin direct, same ranges as idle (reference)"),
              ("idle", "sidecar, idle"), ("loaded", "**sidecar, under warm-up**"))


def isolation_sections(results: Results) -> list[str]:
    info = (results.get("scenarios") or {}).get("isolation")
    if not info:
        return []
    return [*_probe_section(results, info), *_misses_section(results)]


def _us(value: Any) -> str:
    return num(value, 0)


def _cpus(run: Run) -> str:
    affinity = run.get("affinity") or {}
    if run.get("pinned"):
        return (f"sidecar `--cpus {run.get('load_cpus')}` (threads on "
                f"{affinity.get('sidecar')}), nginx + replay `taskset -c {run.get('load_cpus')}`")
    return f"not pinned (sidecar on {affinity.get('sidecar')}, nginx on {affinity.get('origin')})"


def _probe_row(run: Run, label: str, idle: Run | None, probe_cpu: int, load_cpu: int
               ) -> list[str]:
    probe = run.get("probe") or {}
    lateness = probe.get("lateness_us") or {}
    usage = probe.get("cpu_usage") or {}
    replay = run.get("replay") or {}
    foreign = probe.get("foreign_cpu") or {}
    return [
        label, _cpus(run) if "pinned" in run else "-",
        _us(lateness.get("p50")), _us(lateness.get("p99")), _us(lateness.get("p999")),
        _us(lateness.get("max")), times(ratio_of(probe_p99(run), probe_p99(idle))),
        num(mbps(replay)) if replay else "-",
        pct((usage.get(str(probe_cpu)) or {}).get("busy"), 0),
        pct((usage.get(str(load_cpu)) or {}).get("busy"), 0),
        f"{num(foreign.get('cores'), 2)}"
        + (f" ({run.get('attempts')} attempts)" if (run.get("attempts") or 1) > 1 else ""),
    ]


def _probe_section(results: Results, info: dict[str, Any]) -> list[str]:
    probe_cpu, load_cpu = info.get("probe_cpu", 0), info.get("load_cpu", 1)
    idle = find_run(results, "isolation", "idle")
    rows = []
    for run_name, label in _PROBE_ROWS:
        label = label.format(load_cpu=load_cpu)
        data = find_run(results, "isolation", run_name)
        if data is None:
            rows.append([label, "failed / not run", *[""] * 9])
        else:
            rows.append(_probe_row(data, label, idle, probe_cpu, load_cpu))
    return [
        "## Isolation: a latency-sensitive process on the other core\n",
        paragraph("isolation", probe_cpu=probe_cpu,
                  idle_seconds=num(info.get("probe_idle_seconds"), 0),
                  mib=num((info.get("bytes") or 0) / MiB, 0), partitions=info.get("partitions"),
                  concurrency=info.get("concurrency")) + "\n",
        md_table(["condition", "CPUs of sidecar, nginx, replay", "p50 µs", "p99 µs",
                  "p99.9 µs", "max µs", "p99 vs idle", "replay MB/s",
                  f"CPU {probe_cpu} busy", f"CPU {load_cpu} busy", "other processes"], rows),
        "",
        paragraph("isolation-busy", probe_cpu=probe_cpu) + "\n",
    ]


def _misses_section(results: Results) -> list[str]:
    misses = find_run(results, "isolation", "misses")
    out = ["## Isolation: foreground misses under warm-up\n"]
    if misses is None:
        return [*out, "Failed / not run.\n"]
    warm = misses.get("warm") or {}
    lane = warm.get("lane") or {}
    answer = warm.get("answer") or {}
    rows = []
    idle_ms = (misses.get("idle") or {}).get("total_ms") or {}
    for phase, label in _MISS_ROWS:
        data = misses.get(phase)
        if data is None:
            continue
        total = data.get("total_ms") or {}
        first = data.get("first_byte_ms") or {}
        rows.append([
            label, f"{data.get('counted')} of {data.get('requests')}", num(total.get("p50")),
            num(total.get("p90")), num(total.get("p99")), num(total.get("max")),
            num(first.get("p50")), times(ratio_of(total.get("p50"), idle_ms.get("p50"))),
            num((data.get("foreign_cpu") or {}).get("cores"), 2),
        ])
    by_lane = warm.get("origin_bytes_by_lane") or {}
    return [
        *out,
        paragraph("misses", bandwidth=misses.get("origin_bandwidth"),
                  warm_share=misses.get("warm_share"),
                  range_mib=(misses.get("range_bytes") or MiB) // MiB,
                  segments=warm.get("segments"),
                  mib=num((warm.get("bytes") or 0) / MiB, 0)) + "\n",
        md_table(["phase", "misses counted", "p50 ms", "p90 ms", "p99 ms", "max ms",
                  "first byte p50 ms", "p50 vs sidecar idle", "other processes"], rows),
        "",
        paragraph("misses-warm-up", seconds=num(warm.get("seconds"), 2),
                  fetched=answer.get("fetched", "?"), failed=answer.get("failed", "?"),
                  mib=num((answer.get("bytes_fetched") or 0) / MiB, 0),
                  lane_mib_per_s=num((lane.get("bytes_per_s") or 0) / MiB),
                  by_lane=", ".join(f"{lane_name} {num(value / MiB)} MiB"
                                    for lane_name, value in sorted(by_lane.items()))) + "\n",
    ]
