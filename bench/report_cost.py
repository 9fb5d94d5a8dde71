"""The report's sections of cost-4p and wide-48p (bench/cost.py): what a replay
costs the server with the light client, and where the sidecar's CPU goes by
kind of thread. Each figure is the median (min-max) of the rounds."""

from __future__ import annotations

from collections.abc import Callable

from bench.report_format import (
    MiB,
    Results,
    Run,
    Shown,
    cpu_per_gib,
    fetch_latency,
    find_run,
    mbps,
    md_table,
    num,
    paragraph,
    pct,
    prefetch_line,
    rounds_of,
    spread,
    times,
)

_HEADER = ["server", "MB/s", "CPU-s/GiB", "user", "system", "minor faults/GiB",
           "fetch p50 ms", "fetch p99 ms", "peak RSS MiB", "byte hit ratio",
           "origin bytes / replayed", "sent past the fetches"]


def cost_sections(results: Results) -> list[str]:
    scenarios = results.get("scenarios") or {}
    out: list[str] = []
    if "cost-4p" in scenarios:
        info = scenarios["cost-4p"]
        out += [
            "## What a replay costs the server (light client)\n",
            paragraph("cost-4p", mib=num(info.get("bytes", 0) / MiB, 0),
                      rounds=info.get("rounds", "?"), rss_of=_rss_of(results)) + "\n",
            md_table(_HEADER, _cost_rows(results, "cost-4p")),
            "",
            prefetch_line(results, "cost-4p", "sidecar_cold_1") + "\n",
            *page_cache_section(results),
        ]
    if "wide-48p" in scenarios:
        info = scenarios["wide-48p"]
        out += [
            "## Many partitions at once, cold (light client)\n",
            paragraph("wide-48p", partitions=info.get("partitions", "?"),
                      segment_mib=num((info.get("segment_bytes") or 0) / MiB, 0),
                      rounds=info.get("rounds", "?")) + "\n",
            md_table([*_HEADER, "first fetch p50 ms", "first / last done s"],
                     _cost_rows(results, "wide-48p")),
            "",
            prefetch_line(results, "wide-48p", "sidecar_cold_1") + "\n",
        ]
    return out + thread_section(results)


def _rss_of(results: Results) -> str:
    """Whose VmHWM the peak RSS column holds: a results file from before
    bench/cpu.py summed a server's processes has its first process's alone."""
    runs = ((results.get("scenarios") or {}).get("cost-4p") or {}).get("runs") or {}
    if any((run or {}).get("server_peak_rss_of") == "processes" for run in runs.values()):
        return ("summed over its processes (nginx's master and workers; shared pages "
                "count in each)")
    return "of its first process alone (nginx's master, not its workers)"


_COST_ROWS = {
    "cost-4p": [("origin", "origin direct"),
                ("nginx_slice_cold", "nginx slice 8m + proxy_cache, cold"),
                ("nginx_slice_warm", "nginx slice 8m + proxy_cache, warm (same replay again)"),
                ("sidecar_cold", "**sidecar, cold**"),
                ("sidecar_warm", "**sidecar, warm** (same replay again)"),
                ("sidecar_tier_off_cold", "sidecar, cold, memory_tier = 0 (off)"),
                ("sidecar_tier_off_warm", "sidecar, warm, memory_tier = 0 (off)"),
                # Results from before the tier was on by default (the rows above
                # were then the tier off).
                ("sidecar_tier_auto_cold", "sidecar, cold, memory_tier = auto"),
                ("sidecar_tier_auto_warm", "sidecar, warm, memory_tier = auto"),
                ("sidecar_tier_whole_cold",
                 "sidecar, cold, a memory tier that holds the data set"),
                ("sidecar_tier_whole_warm",
                 "sidecar, warm, a memory tier that holds the data set"),
                ("floor_aiohttp", "floor: aiohttp serving the files (preads, 128 KiB writes)"),
                ("floor_protocol", "floor: bare asyncio protocol (preads, 128 KiB writes)"),
                ("floor_sendfile", "floor: bare asyncio protocol, sendfile"),
                ("floor_protocol-verified",
                 "floor: bare protocol, each chunk read whole and hashed, then written"),
                ("floor_sendfile-verified",
                 "floor: bare protocol, each chunk read whole and hashed, then sendfile"),
                ("floor_direct-verified",
                 "floor: bare protocol, each chunk read with O_DIRECT and hashed in a "
                 "thread, then written"),
                ("floor_aiohttp-direct-verified",
                 "floor: aiohttp, each chunk read with O_DIRECT and hashed in a thread, "
                 "then written 128 KiB at a time (the data port's way with a hit)"),
                ("floor_aiohttp-sendfile",
                 "floor: aiohttp, each chunk's slice sent with sendfile (the data port's way "
                 "with a hit in the memory tier)"),
                ("floor_origin",
                 "floor: the origin side alone, 8 connections (each chunk received, hashed "
                 "and written with O_DIRECT)"),
                ("floor_origin-tier",
                 "floor: the origin side alone, each chunk also kept in a memory tier that "
                 "holds the data set (its pages taken at start, as memory_tier_reserve does)"),
                ("floor_origin-tier-fresh",
                 "floor: the same, into pages not yet taken (memory_tier_reserve = false)")],
    "wide-48p": [("nginx_slice_cold", "nginx slice 8m + proxy_cache, cold"),
                 ("sidecar_cold", "**sidecar, cold**")],
}


# Rows of runs older results files do not have: left out rather than shown failed.
_OPTIONAL_ROWS = frozenset({"sidecar_tier_off_cold", "sidecar_tier_off_warm",
                            "sidecar_tier_auto_cold", "sidecar_tier_auto_warm",
                            "sidecar_tier_whole_cold", "sidecar_tier_whole_warm",
                            "floor_aiohttp-sendfile", "floor_origin-tier",
                            "floor_origin-tier-fresh"})


def _cost_rows(results: Results, scenario: str) -> list[list[str]]:
    rows = []
    for run, label in _COST_ROWS[scenario]:
        runs = rounds_of(results, scenario, run) if run != "origin" else \
            [find_run(results, scenario, "origin_1")]
        if not any(runs) and run in _OPTIONAL_ROWS:
            continue
        if not any(runs):
            blanks = 12 if scenario == "wide-48p" else 10  # the table's other columns
            rows.append([label, "failed / not run", *["" for _ in range(blanks)]])
            continue

        def fixed(digits: int) -> Shown:
            return lambda value: f"{value:,.{digits}f}"

        hit = [((r or {}).get("sidecar") or {}).get("byte_hit_ratio") for r in runs]
        rss = [(r or {}).get("server_peak_rss_bytes") for r in runs]
        rows.append([
            label,
            spread([mbps(r) for r in runs], fixed(0), False),
            spread([cpu_per_gib(r) for r in runs], fixed(2), False),
            spread([cpu_per_gib(r, "user") for r in runs], fixed(2), False),
            spread([cpu_per_gib(r, "system") for r in runs], fixed(2), False),
            spread([cpu_per_gib(r, "minor_faults") for r in runs], fixed(0), False),
            spread([fetch_latency(r, "p50") for r in runs], fixed(1), False),
            spread([fetch_latency(r, "p99") for r in runs], fixed(1), False),
            spread([None if not v else v / MiB for v in rss], fixed(0), False),
            "-" if not any(v is not None for v in hit) else spread(hit, pct, False),
            spread([(r or {}).get("origin_body_bytes_per_replayed_byte") for r in runs],
                   times, False),
            spread([_overshoot(r) for r in runs], pct, False),
        ])
        if scenario == "wide-48p":
            rows[-1].append(spread([((r or {}).get("first_fetch_latency_ms") or {}).get("p50")
                                    for r in runs], fixed(1), False))
            rows[-1].append(
                spread([(r or {}).get("first_done_s") for r in runs], fixed(2), False) + " / "
                + spread([(r or {}).get("last_done_s") for r in runs], fixed(2), False))
    return rows


def _overshoot(run: Run | None) -> float | None:
    """Body bytes the client got past what its fetches used, over those used."""
    sent, used = (run or {}).get("overshoot_bytes"), (run or {}).get("bytes")
    return sent / used if isinstance(sent, int) and isinstance(used, int) and used else None


# The sidecar's kinds of thread (sidecar.telemetry.thread_cpu.thread_kind, as
# its metric sidecar_thread_cpu_seconds_total names them), each a column; the
# rest is "other".
_THREAD_COLUMNS = (("event-loop", "event loop"), ("origin", "origin GETs"),
                   ("io", "cache disk I/O"))
_NAMED_KINDS = frozenset(kind for kind, _ in _THREAD_COLUMNS)
# Which kinds each CPU column adds up: one named kind each, then the rest.
_COUNTED: tuple[Callable[[str], bool], ...] = (
    *((lambda kind, column=column: kind == column) for column, _ in _THREAD_COLUMNS),
    lambda kind: kind not in _NAMED_KINDS)
_THREAD_ROWS = (("cost-4p", "sidecar_cold", "4 partitions, cold"),
                ("cost-4p", "sidecar_warm", "4 partitions, warm"),
                ("wide-48p", "sidecar_cold", "48 partitions at once, cold"))


def _thread_figure(run: Run | None, field: str,
                   counted: Callable[[str], bool]) -> float | None:
    """A run's per-GiB `field` summed over the kinds of thread `counted` keeps."""
    split = (run or {}).get("server_threads_per_gib")
    if not isinstance(split, dict) or not split:
        return None
    return float(sum(figures.get(field, 0) for kind, figures in split.items()
                     if counted(kind)))


def thread_section(results: Results) -> list[str]:
    rows = []
    for scenario, run, label in _THREAD_ROWS:
        runs = rounds_of(results, scenario, run)
        if not any(_thread_figure(r, "cpu_s", lambda kind: True) is not None for r in runs):
            continue
        cells = [label]
        for counted in _COUNTED:
            cells.append(spread([_thread_figure(r, "cpu_s", counted) for r in runs],
                                lambda value: f"{value:.2f}", False))
        for field in ("voluntary_switches", "involuntary_switches"):
            cells.append(spread([_thread_figure(r, field, lambda kind: True) for r in runs],
                                lambda value: f"{value:,.0f}", False))
        rows.append(cells)
    if not rows:
        return []
    header = ["replay", *(name for _, name in _THREAD_COLUMNS), "other threads",
              "switches/GiB: waited", "preempted"]
    return [
        "## Where the sidecar's CPU goes, by thread (light client)\n",
        paragraph("cost-threads") + "\n",
        md_table(header, rows),
        "",
    ]


_PAGE_CACHE_ROWS = [("sidecar_cold", "sidecar, cold (its default memory tier)"),
                    ("sidecar_warm", "sidecar, warm (its default memory tier)"),
                    ("sidecar_tier_off_cold", "sidecar, cold, memory_tier = 0 (off)"),
                    ("sidecar_tier_off_warm", "sidecar, warm, memory_tier = 0 (off)"),
                    ("sidecar_tier_auto_cold", "sidecar, cold, memory_tier = auto"),
                    ("sidecar_tier_auto_warm", "sidecar, warm, memory_tier = auto"),
                    ("sidecar_tier_whole_cold", "sidecar, cold, a tier that holds the data set"),
                    ("sidecar_tier_whole_warm", "sidecar, warm, a tier that holds the data set"),
                    ("nginx_slice_cold", "nginx slice 8m + proxy_cache, cold"),
                    ("nginx_slice_warm", "nginx slice 8m + proxy_cache, warm")]
#: What a replay may add to the page cache beyond its memory tier: logs, the
#: access log, the interpreter's own files.
PAGE_CACHE_ALLOWANCE = 64 * MiB


def page_cache_section(results: Results) -> list[str]:
    """How much the machine's page cache grew during each replay (its peak),
    against the memory tier's size: the sidecar's slab stays out of it."""
    rows = []
    for run, label in _PAGE_CACHE_ROWS:
        runs = [r for r in rounds_of(results, "cost-4p", run) if r and r.get("page_cache")]
        if not runs:
            continue
        growth = [r["page_cache"]["cached_peak_growth_bytes"] / MiB for r in runs]
        shmem = [r["page_cache"]["shmem_peak_growth_bytes"] / MiB for r in runs]
        tier = [(r.get("memory_tier_size_bytes") or 0) / MiB for r in runs]
        within = "-" if run.startswith("nginx") else (
            "yes" if all(g <= t + PAGE_CACHE_ALLOWANCE / MiB for g, t in zip(growth, tier,
                                                                             strict=True))
            else "**no**")
        rows.append([label, spread([(r.get("bytes") or 0) / MiB for r in runs],
                                   lambda v: f"{v:,.0f}", False),
                     spread(tier, lambda v: f"{v:,.0f}", False),
                     spread(growth, lambda v: f"{v:,.0f}", False),
                     spread(shmem, lambda v: f"{v:,.0f}", False), within])
    if not rows:
        return []
    header = ["replay", "replayed MiB", "memory tier MiB", "page cache growth MiB (peak)",
              "of it shared memory MiB", f"within tier + {PAGE_CACHE_ALLOWANCE // MiB} MiB"]
    return ["### The page cache during a replay\n", paragraph("page-cache") + "\n",
            md_table(header, rows), ""]
