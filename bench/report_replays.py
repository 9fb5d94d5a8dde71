"""The replay sections of the report: one partition and four partitions cold,
the warm replay, and the warm 1 MiB range reads (bench/cold_1p.py,
bench/four_partitions.py, bench/warm_ranges.py)."""

from __future__ import annotations

from typing import Any

from bench.report_format import (
    MiB,
    Results,
    find_run,
    mbps,
    md_table,
    num,
    paragraph,
    pct,
    prefetch_line,
    ratio_of,
    times,
)

_LABELS = {
    "origin": "origin direct",
    "nginx_slice_cold": "nginx slice 8m + proxy_cache, cold",
    "nginx_slice_warm": "nginx slice 8m + proxy_cache, warm (2nd replay)",
    "nginx_slice_lock_cold": "nginx slice 8m + proxy_cache + proxy_cache_lock, cold (extra)",
    "sidecar_cold": "**sidecar, cold**",
    "sidecar_warm": "**sidecar, warm**",
    "sidecar_tier_warm": "sidecar, warm, a memory tier that holds the data set",
    "nginx_local": "nginx, local file (no delay, no rate limit)",
}


# The warm-ranges floor runs (bench/warm_ranges.py's RANGE_FLOORS) and their rows' names.
_RANGE_FLOORS = {
    "floor_aiohttp": "floor: aiohttp serving the files from the page cache",
    "floor_aiohttp-direct-verified":
        "floor: aiohttp, each chunk read with O_DIRECT and hashed in a thread, then written",
    "floor_aiohttp-sendfile":
        "floor: aiohttp, each chunk's slice sent with sendfile (the memory tier's way)",
}


def _replay_rows(
    results: Results, scenario: str, runs: list[str], bases: list[tuple[str, str]]
) -> list[list[str]]:
    rows = []
    for run in runs:
        data = find_run(results, scenario, run)
        label = _LABELS.get(run, run)
        if data is None:
            rows.append([label, "failed / not run", *["" for _ in bases], "", "", "", "", ""])
            continue
        latency = data.get("fetch_latency_ms") or {}
        ratios = [times(ratio_of(mbps(data), mbps(find_run(results, base_scenario, base))))
                  for base_scenario, base in bases]
        origin_ratio = data.get("origin_body_bytes_per_replayed_byte")
        sidecar = data.get("sidecar") if isinstance(data.get("sidecar"), dict) else None
        hit = pct(sidecar.get("byte_hit_ratio")) if sidecar else "-"
        rows.append([
            label, num(mbps(data)), *ratios, num(latency.get("p50")), num(latency.get("p99")),
            hit, times(origin_ratio), str(data.get("crc_errors", "n/a")),
        ])
    return rows


def _replay_header(bases: list[tuple[str, str]]) -> list[str]:
    names = {"origin": "origin", "nginx_slice_cold": "slice cold",
             "nginx_slice_warm": "slice warm", "sidecar_cold": "sidecar cold"}
    return ["path", "MB/s", *[f"x {names.get(base, base)}" for _, base in bases],
            "fetch p50 ms", "fetch p99 ms", "byte hit ratio", "origin bytes / replayed",
            "CRC errors"]


def _scenario_line(results: Results, scenario: str) -> str:
    info = (results.get("scenarios") or {}).get(scenario) or {}
    size = info.get("bytes")
    return (f"partitions `{info.get('partitions', '?')}`, "
            f"concurrency {info.get('concurrency', '?')}, "
            f"{num(size / MiB if size else None, 0)} MiB per replay, 1 MiB fetches "
            "(open-ended range, connection dropped after each fetch)")


def replay_sections(results: Results) -> list[str]:
    return [*_cold_1p(results), *_cold_4p(results), *_warm_replay(results),
            *_warm_ranges(results)]


def _cold_1p(results: Results) -> list[str]:
    bases = [("cold-1p", "origin"), ("cold-1p", "nginx_slice_cold")]
    return [
        "## One partition, cold\n",
        _scenario_line(results, "cold-1p") + ". Fresh servers and empty caches for each row.\n",
        md_table(_replay_header(bases), _replay_rows(
            results, "cold-1p", ["origin", "nginx_slice_cold", "nginx_slice_lock_cold",
                                 "sidecar_cold"], bases)),
        "",
        prefetch_line(results, "cold-1p", "sidecar_cold") + "\n",
    ]


def _cold_4p(results: Results) -> list[str]:
    bases = [("cold-4p", "origin"), ("cold-4p", "nginx_slice_cold"),
             ("cold-4p", "nginx_slice_warm")]
    return [
        "## Four partitions at once, cold\n",
        _scenario_line(results, "cold-4p") + ". The nginx slice cache is replayed twice: "
        "the second replay is the *warm* row.\n",
        md_table(_replay_header(bases), _replay_rows(
            results, "cold-4p", ["origin", "nginx_slice_cold", "nginx_slice_lock_cold",
                                 "nginx_slice_warm", "sidecar_cold"], bases)),
        "",
        prefetch_line(results, "cold-4p", "sidecar_cold") + "\n",
    ]


def _warm_replay(results: Results) -> list[str]:
    bases = [("cold-4p", "nginx_slice_warm"), ("cold-4p", "sidecar_cold")]
    return [
        "## Warm replay\n",
        "The four-partition replay again, against the sidecar the cold replay filled.\n",
        md_table(_replay_header(bases), _replay_rows(
            results, "warm-replay", ["sidecar_warm"], bases)),
        "",
    ]


def _warm_ranges(results: Results) -> list[str]:
    ranges = (results.get("scenarios") or {}).get("warm-ranges") or {}
    local = find_run(results, "warm-ranges", "nginx_local")
    rows = []
    for run in ("nginx_local", "sidecar_warm", "sidecar_tier_warm", *_RANGE_FLOORS):
        data = find_run(results, "warm-ranges", run)
        if data is None:
            if run in _RANGE_FLOORS or run == "sidecar_tier_warm":
                continue  # a results file from before the floors were measured
            rows.append([_LABELS[run], "failed / not run", "", "", "", "", "", "", "", ""])
            continue
        latency = data.get("latency_ms") or {}
        rows.append([
            _LABELS.get(run) or _RANGE_FLOORS[run], _with_rounds(data),
            num(data.get("mb_per_s")),
            pct(ratio_of(data.get("requests_per_s"), (local or {}).get("requests_per_s")), 1),
            num((data.get("server_cpu_per_gib") or {}).get("total"), 2),
            num(latency.get("p50"), 2), num(latency.get("p90"), 2), num(latency.get("p99"), 2),
            num(latency.get("max"), 1), str(sum((data.get("errors") or {}).values())),
        ])
    return [
        "## Warm 1 MiB range reads\n",
        paragraph("warm-ranges", connections=ranges.get("connections", "?"),
                  threads=ranges.get("threads", "?"), seconds=ranges.get("seconds", "?"),
                  rounds=_rounds_text(ranges.get("rounds")),
                  ranges=ranges.get("aligned_ranges", "?")) + "\n",
        md_table(["server", "req/s", "MB/s", "vs nginx local", "CPU-s/GiB", "p50 ms",
                  "p90 ms", "p99 ms", "max ms", "errors"], rows),
        "",
    ]


def _with_rounds(data: dict[str, Any]) -> str:
    """A run's requests a second, with the range of its rounds when it had several."""
    shown = num(data.get("requests_per_s"))
    rounds = [r.get("requests_per_s") for r in data.get("rounds") or []]
    if len(rounds) > 1 and None not in rounds:
        shown += f" ({num(min(rounds))}-{num(max(rounds))})"
    return shown


def _rounds_text(rounds: object) -> str:
    """How many rounds each server had (a results file from before rounds: one)."""
    count = rounds if isinstance(rounds, int) and rounds > 0 else 1
    return "one round" if count == 1 else f"{count} rounds"
