"""Results -> targets and BENCHMARKS.md. Pure: a results dict in, text out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
HIT_RATIO_MIN_REPLAY = 512 * MiB
#: The broker scenario's targets are read over at least this much in remote storage.
BROKER_MIN_REMOTE = 512 * MiB


# --- reading the results ---------------------------------------------------------------


def _run(results: dict[str, Any], scenario: str, run: str) -> dict[str, Any] | None:
    found = ((results.get("scenarios") or {}).get(scenario) or {}).get("runs", {}).get(run)
    return found if isinstance(found, dict) else None


def _mbps(run: dict[str, Any] | None) -> float | None:
    value = run.get("mb_per_s") if run else None
    return float(value) if isinstance(value, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _sidecar_stat(run: dict[str, Any] | None, name: str) -> Any:
    if not run:
        return None
    stats = run.get("sidecar")
    if isinstance(stats, dict) and stats.get(name) is not None:
        return stats[name]
    return run.get(name)


def _integrity_problem(*runs: dict[str, Any] | None) -> str | None:
    for run in runs:
        if run is None:
            continue
        if run.get("crc_errors"):
            return f"{run['crc_errors']} batch check failures"
        if run.get("exit_code") not in (None, 0):
            return f"replay exited {run['exit_code']}"
        errors = run.get("errors")
        if isinstance(errors, dict) and any(errors.values()):
            return f"wrk errors {errors}"
    return None


def _target(
    name: str, required: str, value: float | None, shown: str, met: bool | None,
    note: str = "",
) -> dict[str, Any]:
    return {"target": name, "required": required, "value": value, "measured": shown,
            "met": met, "note": note}


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _pct(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each met / not met / not measured (None)."""
    targets = []

    def ratio_target(name: str, required: str, scenario: str, run: str, base: str,
                     minimum: float) -> None:
        ours, theirs = _run(results, scenario, run), _run(results, scenario, base)
        value = _ratio(_mbps(ours), _mbps(theirs))
        problem = _integrity_problem(ours, theirs)
        met = None if value is None else (value >= minimum and problem is None)
        targets.append(_target(name, required, value, _times(value), met, problem or ""))

    ratio_target("1 partition cold: sidecar vs origin direct", ">= 8x",
                 "cold-1p", "sidecar_cold", "origin", 8.0)
    ratio_target("1 partition cold: sidecar vs nginx slice cold", ">= 4x",
                 "cold-1p", "sidecar_cold", "nginx_slice_cold", 4.0)
    ratio_target("4 partitions cold: sidecar vs nginx slice WARM", ">= 0.60x",
                 "cold-4p", "sidecar_cold", "nginx_slice_warm", 0.6)
    ratio_target("4 partitions cold: sidecar vs nginx slice cold", ">= 3x",
                 "cold-4p", "sidecar_cold", "nginx_slice_cold", 3.0)

    cold = _run(results, "cold-4p", "sidecar_cold")
    replayed = cold.get("bytes") if cold else None
    hit = _sidecar_stat(cold, "byte_hit_ratio")
    note = ""
    met: bool | None = None
    if hit is not None and replayed is not None:
        met = hit >= 0.99 and replayed >= HIT_RATIO_MIN_REPLAY
        if replayed < HIT_RATIO_MIN_REPLAY:
            met = None
            note = (f"replay was {replayed / MiB:.0f} MiB, the target needs >= 512 MiB "
                    "(quick run: indicative only)")
    problem = _integrity_problem(cold)
    if problem and met is not None:
        met, note = False, problem
    targets.append(_target("byte hit ratio, cold replay, no warm-up", ">= 99% over >= 512 MiB",
                           hit, _pct(hit), met, note))

    origin_bytes = _sidecar_stat(cold, "origin_bytes")
    value = _ratio(origin_bytes, replayed)
    met = None if value is None else value <= 1.05
    targets.append(_target("origin bytes / bytes replayed (4 partitions cold)", "<= 1.05x",
                           value, _times(value), met))

    sidecar = _run(results, "warm-ranges", "sidecar_warm")
    local = _run(results, "warm-ranges", "nginx_local")
    rps = _ratio(sidecar.get("requests_per_s") if sidecar else None,
                 local.get("requests_per_s") if local else None)
    problem = _integrity_problem(sidecar, local)
    met = None if rps is None else (rps >= 0.7 and problem is None)
    floors = [(label, _ratio((_run(results, "warm-ranges", run) or {}).get("requests_per_s"),
                             (local or {}).get("requests_per_s")))
              for run, label in (("floor_aiohttp", "aiohttp alone"),
                                 ("floor_aiohttp-direct-verified", "the data port's way alone"))]
    floor = ", ".join(f"{label} {_pct(value, 1)}" for label, value in floors if value is not None)
    targets.append(_target("warm 1 MiB ranges: sidecar vs nginx local file, throughput",
                           ">= 70%", rps, _pct(rps, 1), met,
                           problem or (f"floors: {floor}" if floor else "")))
    p99 = _ratio((sidecar or {}).get("latency_ms", {}).get("p99"),
                 (local or {}).get("latency_ms", {}).get("p99"))
    met = None if p99 is None else (p99 <= 2.0 and problem is None)
    targets.append(_target("warm 1 MiB ranges: sidecar p99 / nginx local file p99",
                           "<= 2x", p99, _times(p99), met, problem or ""))
    targets += _cost_targets(results)
    targets += _isolation_targets(results)
    targets += _warmup_targets(results)
    targets += _broker_targets(results)
    restart = _run(results, "restart", "index")
    seconds = (restart or {}).get("median_seconds")
    met = None if seconds is None else (seconds < 2.0 and bool(restart and restart.get("ok")))
    note = "" if restart is None or restart.get("ok") else "a run did not recover every block"
    scanned = (restart or {}).get("median_scan_seconds")
    if scanned is not None:
        note = "; ".join(filter(None, [note, f"every header scanned in {scanned:.2f} s"]))
    targets.append(_target("restart after a kill -9, 100k slots: ready to serve (median of 3, "
                           "cold page cache)",
                           "< 2 s", seconds, "n/a" if seconds is None else f"{seconds:.2f} s",
                           met, note))
    return targets


# --- cost-4p and wide-48p (bench/cost.py): rounds, each with fresh servers -------------


def _rounds(results: dict[str, Any], scenario: str, run: str) -> list[dict[str, Any] | None]:
    info = (results.get("scenarios") or {}).get(scenario) or {}
    count = int(info.get("rounds") or 0)
    return [_run(results, scenario, f"{run}_{number}") for number in range(1, count + 1)]


def _median(values: list[float | None]) -> float | None:
    known = sorted(value for value in values if value is not None)
    if not known:
        return None
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2


def _spread(values: list[float | None], shown: Any, rounds: bool = True) -> str:
    """`median (min-max, N rounds)`, each value formatted by `shown`."""
    known = [value for value in values if value is not None]
    if not known:
        return "n/a"
    if len(known) == 1:
        return str(shown(known[0]))
    count = f", {len(known)} rounds" if rounds else ""
    return f"{shown(_median(known))} ({shown(min(known))}-{shown(max(known))}{count})"


def _cpu_per_gib(run: dict[str, Any] | None, part: str = "total") -> float | None:
    value = ((run or {}).get("server_cpu_per_gib") or {}).get(part)
    return float(value) if isinstance(value, int | float) else None


def _latency(run: dict[str, Any] | None, name: str) -> float | None:
    value = ((run or {}).get("fetch_latency_ms") or {}).get(name)
    return float(value) if isinstance(value, int | float) else None


def _cost_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []

    def judge(name: str, required: str, values: list[float | None], met_if: Any,
              shown: Any, runs: list[dict[str, Any] | None], floor: str) -> None:
        value = _median(values)
        problem = _integrity_problem(*runs)
        met = None if value is None else (met_if(value) and problem is None)
        note = problem or "; ".join(filter(None, [
            "median of the rounds" if len(values) > 1 else "", floor]))
        targets.append(_target(name, required, value, _spread(values, shown), met, note))

    def at_most(name: str, required: str, values: list[float | None], limit: float,
                shown: Any, runs: list[dict[str, Any] | None], floor: str = "") -> None:
        judge(name, required, values, lambda value: value <= limit, shown, runs, floor)

    def at_least(name: str, required: str, values: list[float | None], limit: float,
                 runs: list[dict[str, Any] | None], floor: str = "") -> None:
        judge(name, required, values, lambda value: value >= limit, _times, runs, floor)

    cold = _rounds(results, "cost-4p", "sidecar_cold")
    warm = _rounds(results, "cost-4p", "sidecar_warm")
    # The light client's CPU is read against its floors (bench/floor_server.py,
    # bench/origin_floor.py): a Python server that verifies what it serves, doing the
    # same work and nothing else. The sidecar is to stay within 1.1x of them; the
    # absolute CPU goal stands on what a real broker sends (the broker scenario).
    serving = _median([_cpu_per_gib(run) for run in _rounds(
        results, "cost-4p", "floor_aiohttp-direct-verified")])
    origin_side = _median([_cpu_per_gib(run) for run in _rounds(
        results, "cost-4p", "floor_origin")])
    cold_floor = None if serving is None or origin_side is None else serving + origin_side

    def against(runs: list[dict[str, Any] | None], floor: float | None) -> list[float | None]:
        return [None if floor is None else _ratio(_cpu_per_gib(run), floor) for run in runs]

    def spent(runs: list[dict[str, Any] | None]) -> str:
        value = _median([_cpu_per_gib(run) for run in runs])
        return "" if value is None else f"{value:.2f} CPU-s/GiB"

    at_most("cold replay, light client: sidecar CPU per GiB vs its floor", "<= 1.1x",
            against(cold, cold_floor), 1.1, _times, cold,
            "no floor measured" if cold_floor is None or origin_side is None or serving is None
            else f"{spent(cold)} against the floor {cold_floor:.2f}: the origin side alone "
            f"{origin_side:.2f} + serving the data port's way alone {serving:.2f}")
    at_most("warm replay, light client: sidecar CPU per GiB vs its floor", "<= 1.1x",
            against(warm, serving), 1.1, _times, warm,
            "no floor measured" if serving is None else
            f"{spent(warm)} against the floor {serving:.2f}: serving the data port's way alone")
    # Where the CPU is the bound, as here, a cold replay runs at most about warm /
    # (warm + the origin side alone) of the warm one's speed, even if serving it
    # cost no more than serving a hit.
    warm_cpu = _median([_cpu_per_gib(run) for run in warm])
    at_least("4 partitions, light client: sidecar cold vs the same sidecar warm", ">= 0.8x",
             [_ratio(_mbps(c), _mbps(w)) for c, w in zip(cold, warm, strict=True)], 0.8,
             cold + warm,
             "" if warm_cpu is None or origin_side is None else
             f"at most about {_times(warm_cpu / (warm_cpu + origin_side))} where the CPU "
             f"bounds: warm {warm_cpu:.2f} / (warm + the origin side alone {origin_side:.2f})")

    wide = _rounds(results, "wide-48p", "sidecar_cold")
    wide_slice = _rounds(results, "wide-48p", "nginx_slice_cold")
    at_least("48 partitions at once, cold: sidecar vs nginx slice cold", ">= 2x",
             [_ratio(_mbps(ours), _mbps(theirs))
              for ours, theirs in zip(wide, wide_slice, strict=True)], 2.0, wide + wide_slice)
    at_most("48 partitions at once, cold: sidecar fetch p99", "<= 500 ms",
            [_latency(run, "p99") for run in wide], 500.0, lambda v: f"{v:,.0f} ms", wide)
    at_most("48 partitions at once, cold: last partition done / first", "<= 1.3x",
            [(run or {}).get("last_over_first") for run in wide], 1.3, _times, wide)
    at_most("48 partitions at once, cold: sidecar peak RSS", "<= 300 MiB",
            [None if not (run or {}).get("server_peak_rss_bytes")
             else run["server_peak_rss_bytes"] / MiB for run in wide],  # type: ignore[index]
            300.0, lambda v: f"{v:,.0f} MiB", wide)
    return targets


def _probe_p99(run: dict[str, Any] | None) -> float | None:
    value = (((run or {}).get("probe") or {}).get("lateness_us") or {}).get("p99")
    return float(value) if isinstance(value, int | float) else None


def _foreign_cores(run: dict[str, Any] | None) -> float:
    value = (((run or {}).get("probe") or {}).get("foreign_cpu") or {}).get("cores")
    return float(value) if isinstance(value, int | float) else 0.0


def _isolation_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    idle, pinned = _run(results, "isolation", "idle"), _run(results, "isolation", "pinned")
    value = _ratio(_probe_p99(pinned), _probe_p99(idle))
    problem = _integrity_problem((pinned or {}).get("replay"))
    met: bool | None = None if value is None else (value <= 1.2 and problem is None)
    note = problem or ""
    disturbed = [f"{name} {_foreign_cores(run):.2f}"
                 for name, run in (("idle", idle), ("pinned", pinned))
                 if run is not None and run.get("undisturbed") is False]
    if value is not None and disturbed and problem is None:
        met = None
        note = ("other processes on this machine used CPU during the measurement "
                f"(cores: {', '.join(disturbed)}): not a measurement of the sidecar alone")
    targets.append(_target("isolation: probe p99 on the other core, pinned cold replay / idle",
                           "<= 1.2x", value, _times(value), met, note))

    misses = _run(results, "isolation", "misses")
    idle_p50 = ((misses or {}).get("idle") or {}).get("total_ms", {}).get("p50")
    loaded = (misses or {}).get("loaded") or {}
    value = _ratio(loaded.get("total_ms", {}).get("p50"), idle_p50)
    met = None if value is None else value <= 1.5
    note = ""
    bad = ((misses or {}).get("idle") or {}).get("bad", 0) + loaded.get("bad", 0)
    if bad:
        met, note = False, f"{bad} responses were not 206 with the right bytes"
    elif value is not None and (loaded.get("counted") or 0) < 5:
        met = None
        note = (f"only {loaded.get('counted')} misses fell within the warm-up "
                "(quick run: indicative only)")
    targets.append(_target("isolation: foreground miss p50 under warm-up / idle", "<= 1.5x",
                           value, _times(value), met, note))
    return targets


def _warmup_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    info = (results.get("scenarios") or {}).get("warmup") or {}
    warm = _run(results, "warmup", "warm")
    value = (warm or {}).get("warm_lane_vs_budget")
    met: bool | None = None if value is None else value >= 0.9
    note = ""
    if warm is not None:
        note = f"via {warm.get('via', '?')}"
        if warm.get("failed_segments"):
            met, note = False, f"{warm['failed_segments']} segments failed to warm"
        elif value is not None and (info.get("bytes") or 0) < 0.99 * 1024 * MiB:
            met = None
            note += (f"; warmed {(info.get('bytes') or 0) / MiB:.0f} MiB, the target needs "
                     "1 GiB (quick run: indicative only)")
    targets.append(_target("warm-up of 1 GiB: warm-lane rate / warm-lane budget", ">= 90%",
                           value, _pct(value, 1), met, note))

    replay = _run(results, "warmup", "replay")
    stats = (replay or {}).get("sidecar") or {}
    block, byte = stats.get("block_hit_ratio"), stats.get("byte_hit_ratio")
    value = None if block is None or byte is None else min(block, byte)
    problem = _integrity_problem(replay)
    met = None if value is None else (value >= 1.0 and problem is None)
    shown = "n/a" if value is None else f"blocks {_pct(block)}, bytes {_pct(byte)}"
    targets.append(_target("replay after warm-up: hit ratio", "100%", value, shown, met,
                           problem or ""))
    foreground = ((replay or {}).get("origin_bytes_by_lane") or {}).get("foreground")
    met = None if foreground is None else foreground == 0
    targets.append(_target("replay after warm-up: foreground origin bytes", "0", foreground,
                           "n/a" if foreground is None else f"{int(foreground):,} B", met))
    return targets


# --- rendering -----------------------------------------------------------------------


def _num(value: Any, digits: int = 1) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:,.{digits}f}"


def _status(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


_LABELS = {
    "origin": "origin direct",
    "nginx_slice_cold": "nginx slice 8m + proxy_cache, cold",
    "nginx_slice_warm": "nginx slice 8m + proxy_cache, warm (2nd replay)",
    "nginx_slice_lock_cold": "nginx slice 8m + proxy_cache + proxy_cache_lock, cold (extra)",
    "sidecar_cold": "**sidecar, cold**",
    "sidecar_warm": "**sidecar, warm**",
    "nginx_local": "nginx, local file (no delay, no rate limit)",
}


# The warm-ranges floor runs (bench/run.py's RANGE_FLOORS) and their rows' names.
_RANGE_FLOORS = {
    "floor_aiohttp": "floor: aiohttp serving the files from the page cache",
    "floor_aiohttp-direct-verified":
        "floor: aiohttp, each chunk read with O_DIRECT and hashed in a thread, then written",
}


def _replay_rows(
    results: dict[str, Any], scenario: str, runs: list[str], bases: list[tuple[str, str]]
) -> list[list[str]]:
    rows = []
    for run in runs:
        data = _run(results, scenario, run)
        label = _LABELS.get(run, run)
        if data is None:
            rows.append([label, "failed / not run", *["" for _ in bases], "", "", "", "", ""])
            continue
        latency = data.get("fetch_latency_ms") or {}
        ratios = [_times(_ratio(_mbps(data), _mbps(_run(results, base_scenario, base))))
                  for base_scenario, base in bases]
        origin_ratio = data.get("origin_body_bytes_per_replayed_byte")
        sidecar = data.get("sidecar") if isinstance(data.get("sidecar"), dict) else None
        hit = _pct(sidecar.get("byte_hit_ratio")) if sidecar else "-"
        rows.append([
            label, _num(_mbps(data)), *ratios, _num(latency.get("p50")), _num(latency.get("p99")),
            hit, _times(origin_ratio), str(data.get("crc_errors", "n/a")),
        ])
    return rows


def _replay_header(bases: list[tuple[str, str]]) -> list[str]:
    names = {"origin": "origin", "nginx_slice_cold": "slice cold",
             "nginx_slice_warm": "slice warm", "sidecar_cold": "sidecar cold"}
    return ["path", "MB/s", *[f"x {names.get(base, base)}" for _, base in bases],
            "fetch p50 ms", "fetch p99 ms", "byte hit ratio", "origin bytes / replayed",
            "CRC errors"]


def _scenario_line(results: dict[str, Any], scenario: str) -> str:
    info = (results.get("scenarios") or {}).get(scenario) or {}
    size = info.get("bytes")
    return (f"partitions `{info.get('partitions', '?')}`, "
            f"concurrency {info.get('concurrency', '?')}, "
            f"{_num(size / MiB if size else None, 0)} MiB per replay, 1 MiB fetches "
            "(open-ended range, connection dropped after each fetch)")


def _prefetch_line(results: dict[str, Any], scenario: str, run: str) -> str:
    data = _run(results, scenario, run)
    if data is None:
        return ""
    samples = data.get("sidecar_prefetch_blocks_total")
    stats = data.get("sidecar") or {}
    shown = "absent (no read-ahead in this build)" if not samples else ", ".join(
        f"{key.removeprefix('outcome=')} {int(value)}" for key, value in sorted(samples.items()))
    listed = data.get("listed_via")
    return (f"Sidecar `sidecar_prefetch_blocks_total` after the run: {shown}; origin read "
            f"{_num((stats.get('origin_bytes') or 0) / 1e6)} MB for "
            f"{_num((data.get('bytes') or 0) / 1e6)} MB replayed"
            + (f"; listing via {listed}." if listed else "."))


def render_markdown(results: dict[str, Any]) -> str:
    machine = results.get("machine") or {}
    dataset = results.get("dataset") or {}
    quick = results.get("quick")
    out: list[str] = []
    out.append("# Benchmarks\n")
    out.append(
        "Generated by the benchmark harness (`bench/`); do not edit by hand, rerun it. "
        "Every number below was measured in one run, side by side, against one emulated "
        "object store.\n"
    )
    if quick:
        out.append("> **Quick run** (`--quick`): a 256 MiB data set and short wrk runs, to check "
                   "the harness. Not the benchmark: run `make bench` for that.\n")
    out.append(_table(["", ""], [
        ["command", f"`{results.get('command', 'make bench')}`"],
        ["date (UTC)", f"{results.get('started_at', '?')} .. {results.get('finished_at', '?')} "
                       f"({_num(results.get('seconds'), 0)} s)"],
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
                     f"{_num((dataset.get('segment_bytes') or 0) / MiB, 0)} MiB = "
                     f"{_num((dataset.get('bytes') or 0) / MiB, 1)} MiB, record values "
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

    out.append("## Targets\n")
    rows = [[t["target"], t["required"], t["measured"], _status(t["met"]), t.get("note", "")]
            for t in results.get("targets") or evaluate_targets(results)]
    out.append(_table(["target", "required", "measured", "status", "note"], rows))
    out.append("")
    missed = [t for t in results.get("targets") or [] if t["met"] is False]
    if missed:
        out.append(f"{len(missed)} of {len(rows)} targets are **not met** in this run.\n")
        analysis = Path(__file__).with_name("ANALYSIS.md")
        if analysis.exists():
            out.append(analysis.read_text().rstrip() + "\n")

    out.append("## One partition, cold\n")
    out.append(_scenario_line(results, "cold-1p") + ". Fresh servers and empty caches for each "
               "row.\n")
    bases = [("cold-1p", "origin"), ("cold-1p", "nginx_slice_cold")]
    out.append(_table(_replay_header(bases), _replay_rows(
        results, "cold-1p", ["origin", "nginx_slice_cold", "nginx_slice_lock_cold",
                             "sidecar_cold"], bases)))
    out.append("")
    out.append(_prefetch_line(results, "cold-1p", "sidecar_cold") + "\n")

    out.append("## Four partitions at once, cold\n")
    out.append(_scenario_line(results, "cold-4p") + ". The nginx slice cache is replayed twice: "
               "the second replay is the *warm* row.\n")
    bases = [("cold-4p", "origin"), ("cold-4p", "nginx_slice_cold"),
             ("cold-4p", "nginx_slice_warm")]
    out.append(_table(_replay_header(bases), _replay_rows(
        results, "cold-4p", ["origin", "nginx_slice_cold", "nginx_slice_lock_cold",
                             "nginx_slice_warm", "sidecar_cold"], bases)))
    out.append("")
    out.append(_prefetch_line(results, "cold-4p", "sidecar_cold") + "\n")

    out.append("## Warm replay\n")
    out.append("The four-partition replay again, against the sidecar the cold replay filled.\n")
    bases = [("cold-4p", "nginx_slice_warm"), ("cold-4p", "sidecar_cold")]
    out.append(_table(_replay_header(bases), _replay_rows(
        results, "warm-replay", ["sidecar_warm"], bases)))
    out.append("")

    ranges = (results.get("scenarios") or {}).get("warm-ranges") or {}
    out.append("## Warm 1 MiB range reads\n")
    out.append(f"wrk, {ranges.get('connections', '?')} keep-alive connections, "
               f"{ranges.get('threads', '?')} threads, {ranges.get('seconds', '?')} s each: "
               "`GET` with `Range` of a random 1 MiB-aligned 1 MiB range of a random segment "
               f"({ranges.get('aligned_ranges', '?')} ranges). The sidecar is the one warmed "
               "above; nginx serves the same files from local disk (page cache) with no delay "
               "and no rate limit. The floor rows answer the same ranges (unsigned) from a "
               "Python server that does nothing else (`bench/floor_server.py`, aiohttp, "
               "keep-alive): straight from the page cache, or with each 1 MiB chunk read past "
               "it (O_DIRECT) and hashed in a worker thread first, as a cache that checks "
               "every byte it serves against its checksum. *CPU-s/GiB*: the server's own, "
               "every thread and child process, from /proc around the run, per GiB of "
               "ranges answered.\n")
    local = _run(results, "warm-ranges", "nginx_local")
    rows = []
    for run in ("nginx_local", "sidecar_warm", *_RANGE_FLOORS):
        data = _run(results, "warm-ranges", run)
        if data is None:
            if run in _RANGE_FLOORS:
                continue  # a results file from before the floors were measured
            rows.append([_LABELS[run], "failed / not run", "", "", "", "", "", "", "", ""])
            continue
        latency = data.get("latency_ms") or {}
        rows.append([
            _LABELS.get(run) or _RANGE_FLOORS[run], _num(data.get("requests_per_s")),
            _num(data.get("mb_per_s")),
            _pct(_ratio(data.get("requests_per_s"), (local or {}).get("requests_per_s")), 1),
            _num((data.get("server_cpu_per_gib") or {}).get("total"), 2),
            _num(latency.get("p50"), 2), _num(latency.get("p90"), 2), _num(latency.get("p99"), 2),
            _num(latency.get("max"), 1), str(sum((data.get("errors") or {}).values())),
        ])
    out.append(_table(["server", "req/s", "MB/s", "vs nginx local", "CPU-s/GiB", "p50 ms",
                       "p90 ms", "p99 ms", "max ms", "errors"], rows))
    out.append("")

    out += _cost_sections(results)
    out += _isolation_sections(results)
    out += _warmup_section(results)
    out += _broker_section(results)
    out += _fragments()

    errors = results.get("errors") or []
    if errors:
        out.append("## Failures in this run\n")
        for error in errors:
            text = " ".join(str(error.get("error", "")).split())[:600]
            out.append(f"- `{error.get('scenario')}/{error.get('run')}`: {text}")
        out.append("")

    out.append(METHOD)
    return "\n".join(out).rstrip() + "\n"


_COST_ROWS = {
    "cost-4p": [("origin", "origin direct"),
                ("nginx_slice_cold", "nginx slice 8m + proxy_cache, cold"),
                ("nginx_slice_warm", "nginx slice 8m + proxy_cache, warm (same replay again)"),
                ("sidecar_cold", "**sidecar, cold**"),
                ("sidecar_warm", "**sidecar, warm** (same replay again)"),
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
                ("floor_origin",
                 "floor: the origin side alone, 8 connections (each chunk received, hashed "
                 "and written with O_DIRECT)")],
    "wide-48p": [("nginx_slice_cold", "nginx slice 8m + proxy_cache, cold"),
                 ("sidecar_cold", "**sidecar, cold**")],
}


def _cost_rows(results: dict[str, Any], scenario: str) -> list[list[str]]:
    rows = []
    for run, label in _COST_ROWS[scenario]:
        runs = _rounds(results, scenario, run) if run != "origin" else \
            [_run(results, scenario, "origin_1")]
        if not any(runs):
            blanks = 12 if scenario == "wide-48p" else 10  # the table's other columns
            rows.append([label, "failed / not run", *["" for _ in range(blanks)]])
            continue

        def fixed(digits: int) -> Any:
            return lambda value: f"{value:,.{digits}f}"

        hit = [((r or {}).get("sidecar") or {}).get("byte_hit_ratio") for r in runs]
        rss = [(r or {}).get("server_peak_rss_bytes") for r in runs]
        rows.append([
            label,
            _spread([_mbps(r) for r in runs], fixed(0), False),
            _spread([_cpu_per_gib(r) for r in runs], fixed(2), False),
            _spread([_cpu_per_gib(r, "user") for r in runs], fixed(2), False),
            _spread([_cpu_per_gib(r, "system") for r in runs], fixed(2), False),
            _spread([_cpu_per_gib(r, "minor_faults") for r in runs], fixed(0), False),
            _spread([_latency(r, "p50") for r in runs], fixed(1), False),
            _spread([_latency(r, "p99") for r in runs], fixed(1), False),
            _spread([None if not v else v / MiB for v in rss], fixed(0), False),
            "-" if not any(v is not None for v in hit) else _spread(hit, _pct, False),
            _spread([(r or {}).get("origin_body_bytes_per_replayed_byte") for r in runs],
                    _times, False),
            _spread([_overshoot(r) for r in runs], _pct, False),
        ])
        if scenario == "wide-48p":
            rows[-1].append(_spread([((r or {}).get("first_fetch_latency_ms") or {}).get("p50")
                                     for r in runs], fixed(1), False))
            rows[-1].append(
                _spread([(r or {}).get("first_done_s") for r in runs], fixed(2), False) + " / "
                + _spread([(r or {}).get("last_done_s") for r in runs], fixed(2), False))
    return rows


def _overshoot(run: dict[str, Any] | None) -> float | None:
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


def _thread_figure(run: dict[str, Any] | None, field: str,
                   counted: Callable[[str], bool]) -> float | None:
    """A run's per-GiB `field` summed over the kinds of thread `counted` keeps."""
    split = (run or {}).get("server_threads_per_gib")
    if not isinstance(split, dict) or not split:
        return None
    return float(sum(figures.get(field, 0) for kind, figures in split.items()
                     if counted(kind)))


def _thread_section(results: dict[str, Any]) -> list[str]:
    rows = []
    for scenario, run, label in _THREAD_ROWS:
        runs = _rounds(results, scenario, run)
        if not any(_thread_figure(r, "cpu_s", lambda kind: True) is not None for r in runs):
            continue
        cells = [label]
        for counted in _COUNTED:
            cells.append(_spread([_thread_figure(r, "cpu_s", counted) for r in runs],
                                 lambda value: f"{value:.2f}", False))
        for field in ("voluntary_switches", "involuntary_switches"):
            cells.append(_spread([_thread_figure(r, field, lambda kind: True) for r in runs],
                                 lambda value: f"{value:,.0f}", False))
        rows.append(cells)
    if not rows:
        return []
    header = ["replay", *(name for _, name in _THREAD_COLUMNS), "other threads",
              "switches/GiB: waited", "preempted"]
    return [
        "## Where the sidecar's CPU goes, by thread (light client)\n",
        "The sidecar rows of the two tables above, split by the kind of thread that took "
        "the CPU (CPU-s per GiB delivered; `bench/cpu.py` reads each thread's run time "
        "from /proc/PID/task/*/schedstat and its name, which the sidecar gives the kernel, "
        "as `top -H` shows it): the *event loop* (HTTP, the "
        "engine, every send to a client), the *origin GETs* (receiving each block from the "
        "object store, hashing it and writing it to its slot) and the *cache disk I/O* "
        "threads (reading chunks back past the page cache and verifying them). The "
        "columns add up to the CPU-s/GiB above. *Switches*: how often a thread "
        "stopped to wait (for the GIL, a lock, a queue or I/O) or was preempted, from each "
        "thread's /proc status. Median (min-max) over the rounds.\n",
        _table(header, rows),
        "",
    ]


def _cost_sections(results: dict[str, Any]) -> list[str]:
    scenarios = results.get("scenarios") or {}
    out: list[str] = []
    header = ["server", "MB/s", "CPU-s/GiB", "user", "system", "minor faults/GiB",
              "fetch p50 ms", "fetch p99 ms", "peak RSS MiB", "byte hit ratio",
              "origin bytes / replayed", "sent past the fetches"]
    if "cost-4p" in scenarios:
        info = scenarios["cost-4p"]
        out.append("## What a replay costs the server (light client)\n")
        out.append(
            f"Every partition of the data set at once ({_num(info.get('bytes', 0) / MiB, 0)} "
            "MiB), read by `bench/light_client.py` as Kafka's remote reader does (an open-ended "
            "`bytes=pos-` per 1 MiB fetch, the connection dropped after it) with no CRC work, "
            "so the client is not the bound. CPU is the server's own, every thread and child "
            "process, from /proc around each replay (`bench/cpu.py`), per GiB delivered; peak "
            "RSS is VmHWM since the server started. Fresh servers and caches each round; the "
            "warm rows replay again through the server the cold row filled. The floor rows "
            "replay (a second time, the files in the page cache) through a Python server that "
            "does nothing but answer the ranges from the data set's files "
            "(`bench/floor_server.py`): no cache, checksums, signatures, metrics or logs; what "
            "the HTTP layer and the copies alone cost. The last floor serves nothing: it "
            "reads the data set's blocks from a fresh origin as the sidecar's origin threads "
            "do (`bench/origin_floor.py`, the sidecar's own ranged GET reader) and only "
            "hashes each chunk and writes it past the page cache, what a cold replay pays on "
            "top of serving; its CPU is per GiB received. *Sent past the fetches*: body bytes "
            "that reached the client beyond the whole batches its fetches used (the "
            "connection is dropped with them queued). Each cell: median "
            f"(min-max) over {info.get('rounds', '?')} rounds.\n")
        out.append(_table(header, _cost_rows(results, "cost-4p")))
        out.append("")
        out.append(_prefetch_line(results, "cost-4p", "sidecar_cold_1") + "\n")
    if "wide-48p" in scenarios:
        info = scenarios["wide-48p"]
        out.append("## Many partitions at once, cold (light client)\n")
        out.append(
            f"{info.get('partitions', '?')} partitions, one "
            f"{_num((info.get('segment_bytes') or 0) / MiB, 0)} MiB segment each, all read at "
            "once by the light client (a consumer group catching up), through a fresh server "
            f"each round ({info.get('rounds', '?')} rounds). Every partition's first fetch "
            "goes out at once (the client's threads wait for each other first); *first "
            "fetch p50*: the median of those, each a miss of its partition's first block. "
            "The last column: seconds until the first and the last partition were done.\n")
        out.append(_table([*header, "first fetch p50 ms", "first / last done s"],
                          _cost_rows(results, "wide-48p")))
        out.append("")
        out.append(_prefetch_line(results, "wide-48p", "sidecar_cold_1") + "\n")
    out += _thread_section(results)
    return out


def _us(value: Any) -> str:
    return _num(value, 0)


def _cpus(run: dict[str, Any]) -> str:
    affinity = run.get("affinity") or {}
    if run.get("pinned"):
        return (f"sidecar `--cpus {run.get('load_cpus')}` (threads on "
                f"{affinity.get('sidecar')}), nginx + replay `taskset -c {run.get('load_cpus')}`")
    return f"not pinned (sidecar on {affinity.get('sidecar')}, nginx on {affinity.get('origin')})"


def _isolation_sections(results: dict[str, Any]) -> list[str]:
    info = (results.get("scenarios") or {}).get("isolation")
    if not info:
        return []
    out = ["## Isolation: a latency-sensitive process on the other core\n"]
    probe_cpu, load_cpu = info.get("probe_cpu", 0), info.get("load_cpu", 1)
    out.append(
        f"A probe pinned to CPU {probe_cpu} (`bench/probe.py`, cyclictest-like: "
        "`time.sleep(0.001)` in a loop, SCHED_OTHER, nice 0) records how late each wake-up is. "
        f"Idle it runs {_num(info.get('probe_idle_seconds'), 0)} s with nothing of the "
        "benchmark running; loaded it runs for the whole of a cold replay of "
        f"{_num((info.get('bytes') or 0) / MiB, 0)} MiB (partitions `{info.get('partitions')}`, "
        f"concurrency {info.get('concurrency')}) through a fresh sidecar and origin. "
        "*Other processes* is the CPU that processes outside the benchmark used during the "
        "window (in cores); a window where they used more than 0.05 was measured again, "
        "and the least disturbed attempt is shown.\n")
    idle = _run(results, "isolation", "idle")
    rows = []
    for run_name, label in (("idle", "idle"), ("pinned", f"**cold replay, load pinned to CPU "
                                                          f"{load_cpu}**"),
                            ("unpinned", "cold replay, nothing pinned (contrast)"),
                            ("idle_after", "idle again, afterwards")):
        data = _run(results, "isolation", run_name)
        if data is None:
            rows.append([label, "failed / not run", *[""] * 9])
            continue
        probe = data.get("probe") or {}
        lateness = probe.get("lateness_us") or {}
        usage = probe.get("cpu_usage") or {}
        replay = data.get("replay") or {}
        foreign = probe.get("foreign_cpu") or {}
        rows.append([
            label, _cpus(data) if "pinned" in data else "-",
            _us(lateness.get("p50")), _us(lateness.get("p99")), _us(lateness.get("p999")),
            _us(lateness.get("max")), _times(_ratio(_probe_p99(data), _probe_p99(idle))),
            _num(_mbps(replay)) if replay else "-",
            _pct((usage.get(str(probe_cpu)) or {}).get("busy"), 0),
            _pct((usage.get(str(load_cpu)) or {}).get("busy"), 0),
            f"{_num(foreign.get('cores'), 2)}"
            + (f" ({data.get('attempts')} attempts)" if (data.get("attempts") or 1) > 1 else ""),
        ])
    out.append(_table(["condition", "CPUs of sidecar, nginx, replay", "p50 µs", "p99 µs",
                       "p99.9 µs", "max µs", "p99 vs idle", "replay MB/s",
                       f"CPU {probe_cpu} busy", f"CPU {load_cpu} busy", "other processes"],
                      rows))
    out.append("")
    out.append("CPU busy shares are from /proc/stat over the probe's window and include the "
               f"probe itself (a few %) on CPU {probe_cpu}.\n")

    misses = _run(results, "isolation", "misses")
    out.append("## Isolation: foreground misses under warm-up\n")
    if misses is None:
        out.append("Failed / not run.\n")
        return out
    warm = misses.get("warm") or {}
    lane = warm.get("lane") or {}
    answer = warm.get("answer") or {}
    out.append(
        f"A fresh sidecar with `--origin-bandwidth {misses.get('origin_bandwidth')}` (warm share "
        f"{misses.get('warm_share')}). Each request is `GET` of "
        f"`bytes=X-(X+{(misses.get('range_bytes') or MiB) // MiB}MiB-1)` at an 8 MiB-aligned X in "
        "a segment that is not warmed, a block nobody has fetched, one at a time on a new "
        "connection (after an untimed HEAD, so the time is the block's). First idle (and, "
        "for reference, the same ranges straight from the origin), then "
        f"while one `POST /api/v1/warm` of {warm.get('segments')} other segments "
        f"({_num((warm.get('bytes') or 0) / MiB, 0)} MiB) runs; only misses (`x-sidecar-cache: "
        "miss`) that ended before the warm-up answered are counted.\n")
    rows = []
    idle_ms = (misses.get("idle") or {}).get("total_ms") or {}
    for phase, label in (("origin_direct", "origin direct, same ranges as idle (reference)"),
                         ("idle", "sidecar, idle"), ("loaded", "**sidecar, under warm-up**")):
        data = misses.get(phase)
        if data is None:
            continue
        total = data.get("total_ms") or {}
        first = data.get("first_byte_ms") or {}
        rows.append([
            label, f"{data.get('counted')} of {data.get('requests')}", _num(total.get("p50")),
            _num(total.get("p90")), _num(total.get("p99")), _num(total.get("max")),
            _num(first.get("p50")), _times(_ratio(total.get("p50"), idle_ms.get("p50"))),
            _num((data.get("foreign_cpu") or {}).get("cores"), 2),
        ])
    out.append(_table(["phase", "misses counted", "p50 ms", "p90 ms", "p99 ms", "max ms",
                       "first byte p50 ms", "p50 vs sidecar idle", "other processes"], rows))
    out.append("")
    by_lane = warm.get("origin_bytes_by_lane") or {}
    out.append(
        f"The warm-up call answered after {_num(warm.get('seconds'), 2)} s: "
        f"{answer.get('fetched', '?')} blocks fetched, {answer.get('failed', '?')} failed, "
        f"{_num((answer.get('bytes_fetched') or 0) / MiB, 0)} MiB; its lane moved "
        f"{_num((lane.get('bytes_per_s') or 0) / MiB)} MiB/s. Origin bytes meanwhile by lane: "
        + ", ".join(f"{lane_name} {_num(value / MiB)} MiB" for lane_name, value in
                    sorted(by_lane.items())) + ". With so few requests p99 is the "
        "slowest one or two.\n")
    return out


# Sections measured by scripts of their own (python -m bench.recovery --record,
# bench.disk_io, bench.capacity_accuracy, bench.capacity_scale), each written as a markdown
# fragment beside the results; spliced in as they are.
FRAGMENTS = ("recovery.md", "disk-io.md", "capacity-accuracy.md", "capacity-scale.md")


def _fragments() -> list[str]:
    results = Path(__file__).with_name("results")
    return [(results / name).read_text().rstrip() + "\n" for name in FRAGMENTS
            if (results / name).exists()]


def _warmup_section(results: dict[str, Any]) -> list[str]:
    info = (results.get("scenarios") or {}).get("warmup")
    if not info:
        return []
    out = ["## Warm-up ahead of a replay\n"]
    budget = info.get("warm_lane_budget_bytes_per_s") or 0
    out.append(
        f"A fresh sidecar with `--origin-bandwidth {info.get('origin_bandwidth')}`, "
        f"`SIDECAR_WARM_SHARE={info.get('warm_share')}` (a warm lane of "
        f"{_num(budget / MiB, 0)} MiB/s) and `SIDECAR_WARM_CONCURRENCY="
        f"{info.get('warm_concurrency')}` (origin connections; at 64 MB/s each they are not the "
        f"limit), `--cache-size {info.get('cache_size')}`, is warmed with all "
        f"{info.get('segments')} segments ({_num((info.get('bytes') or 0) / MiB, 0)} MiB), "
        f"{info.get('calls_in_flight')} warm calls (one segment each) at a time, then every "
        "partition is replayed through it. The warm-lane rate is "
        "`sidecar_origin_bytes_total{lane=\"warm\"}`, sampled every 100 ms, over the window "
        "from the last sample before its first byte to the first sample after its last (it can "
        "only come out low); *steady* is the middle 80% of the bytes.\n")
    if info.get("spark_failure"):
        out.append(f"The Spark job could not run, so the warm calls were sent directly: "
                   f"`{' '.join(str(info['spark_failure']).split())[-400:]}`\n")
    elif not info.get("spark_available", True):
        out.append(f"The Spark job was not used: {info.get('spark_unavailable_reason')}.\n")
    warm = _run(results, "warmup", "warm")
    if warm is None:
        out.append("Warm-up failed / not run.\n")
    else:
        lane = warm.get("warm_lane") or {}
        via = ("Spark job, `--master local[2]`" if warm.get("via") == "spark"
               else "direct `POST /api/v1/warm`")
        out.append(_table(
            ["warmed via", "bytes fetched", "warm lane s", "warm lane MiB/s", "vs budget",
             "steady MiB/s", "warm stage s", "warm stage MiB/s", "whole job s",
             "failed segments"],
            [[via, f"{_num((warm.get('bytes_fetched') or 0) / MiB, 1)} MiB",
              _num(lane.get("seconds"), 2), _num((lane.get("bytes_per_s") or 0) / MiB),
              _pct(warm.get("warm_lane_vs_budget"), 1),
              _num((lane.get("steady_bytes_per_s") or 0) / MiB),
              _num(warm.get("warm_stage_seconds"), 2),
              _num((warm.get("warm_stage_bytes_per_s") or 0) / MiB),
              _num(warm.get("job_seconds"), 1), str(warm.get("failed_segments", "?"))]]))
        out.append("")
        waits = (warm.get("ratelimit_wait_seconds_by_lane") or {}).get("warm")
        held = ("the budget, not the connections, is what held it back"
                if isinstance(waits, int | float) and waits > 0.5 else
                "so what held it back was not the budget (connections, the sidecar's CPU)")
        out.append(
            "*Warm stage* is the job's own clock around its warm calls (Spark: the warm stage, "
            "task start-up included); *whole job* adds start-up, listing and planning (for "
            f"Spark, the JVM). The warm lane waited {_num(waits, 1)} s in total on its token "
            f"bucket (`sidecar_ratelimit_wait_seconds_total`, summed over its concurrent "
            f"fetches): {held}.\n")
    replay = _run(results, "warmup", "replay")
    if replay is None:
        out.append("Replay after the warm-up failed / not run.\n")
        return out
    stats = replay.get("sidecar") or {}
    latency = replay.get("fetch_latency_ms") or {}
    by_lane = replay.get("origin_bytes_by_lane") or {}
    out.append(_table(
        ["replay after warm-up", "MB/s", "fetch p50 ms", "fetch p99 ms", "block hit ratio",
         "byte hit ratio", "foreground origin bytes", "prefetch origin bytes", "CRC errors"],
        [[f"partitions `{info.get('partitions')}`, concurrency {info.get('concurrency')}",
          _num(_mbps(replay)), _num(latency.get("p50")), _num(latency.get("p99")),
          _pct(stats.get("block_hit_ratio")), _pct(stats.get("byte_hit_ratio")),
          f"{int(by_lane.get('foreground', 0)):,}", f"{int(by_lane.get('prefetch', 0)):,}",
          str(replay.get("crc_errors", "n/a"))]]))
    out.append("")
    return out


# --- broker (bench/broker.py): consumers catching up through a real Kafka broker ----------


def _broker_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    info = (results.get("scenarios") or {}).get("broker")
    if not info:
        return []
    targets = []
    remote = info.get("remote_log_bytes")
    small = (f"{remote / MiB:.0f} MiB in remote storage, the target needs >= 512 MiB "
             "(quick run: indicative only)") if remote is not None and \
        remote < BROKER_MIN_REMOTE else ""

    def problem(*runs: dict[str, Any] | None) -> str:
        for run in runs:
            if run is not None and not run.get("verified"):
                return (f"{run.get('records')} of {run.get('records_expected')} records "
                        "verified")
        errors = sum(int(run.get("fetch_errors") or 0) for run in runs if run)
        return f"{errors} fetches failed and were retried" if errors else ""

    def judge(name: str, required: str, value: float | None, shown: str, met_if: Any,
              runs: list[dict[str, Any] | None], note: str = "") -> None:
        failed = problem(*runs)
        met = None if value is None else bool(met_if(value))
        if met is not None and failed and "verified" in failed:
            met = False
        elif met is not None and small:
            met = None
        notes = "; ".join(filter(None, [failed, small, note]))
        targets.append(_target(name, required, value, shown, met, notes))

    def run(name: str) -> dict[str, Any] | None:
        return _run(results, "broker", name)

    cold, direct, cached = run("sidecar_cold"), run("direct"), run("plugin_cache")
    warm, local = run("sidecar_warm"), run("local")
    for base, label, minimum in ((direct, "the manager reading the origin directly", 3.0),
                                 (cached, "the manager with its own disk chunk cache", 1.5)):
        value = _ratio(_mbps(cold), _mbps(base))
        judge(f"broker catch-up, cold: sidecar vs {label}", f">= {minimum:g}x", value,
              _times(value), lambda v, m=minimum: v >= m, [cold, base])
    value = _ratio(_mbps(warm), _mbps(local))
    judge("broker catch-up: warmed sidecar vs the broker's local log", ">= 0.8x", value,
          _times(value), lambda v: v >= 0.8, [warm, local],
          f"warmed via {(warm or {}).get('warm_up', {}).get('via', '?')}" if warm else "")
    sidecar_cpu = _broker_cpu(cold, "sidecar_cpu_per_gib")
    broker_cpu = _broker_cpu(cold, "broker_cpu_per_gib")
    value = _ratio(sidecar_cpu, broker_cpu)
    judge("broker catch-up, cold: sidecar CPU per GiB / the broker's own", "<= 1x", value,
          _times(value), lambda v: v <= 1.0, [cold],
          "" if sidecar_cpu is None or broker_cpu is None else
          f"sidecar {sidecar_cpu:.2f}, broker {broker_cpu:.2f} CPU-s/GiB consumed")
    value = (cold or {}).get("origin_body_bytes_per_consumed_byte")
    judge("broker catch-up, cold: origin bytes / bytes consumed (sidecar)", "<= 1.05x", value,
          _times(value), lambda v: v <= 1.05, [cold])
    return targets


def _broker_cpu(run: dict[str, Any] | None, field: str) -> float | None:
    value = ((run or {}).get(field) or {}).get("total")
    return float(value) if isinstance(value, int | float) else None


_BROKER_ROWS = (
    ("local", "local log (`catchup-local`, never tiered): the ceiling"),
    ("direct", "manager → origin (direct)"),
    ("plugin_cache", "manager + its disk chunk cache → origin"),
    ("sidecar_cold", "manager → **sidecar, cold** → origin"),
    ("sidecar_warm", "manager → **sidecar, warmed** → origin"),
    ("sidecar_warm_1m", "manager, 1 MiB chunks → **sidecar, warmed** → origin"),
)


def _mib(value: Any) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value / MiB:,.1f}"


def _size(value: Any) -> str:
    if not isinstance(value, int | float):
        return "n/a"
    if value < 1024:
        return f"{value:.0f} B"
    if value < MiB:
        return f"{value / 1024:.1f} KiB"
    return f"{value / MiB:.1f} MiB"


def _sizes(pattern: dict[str, Any]) -> str:
    sizes = pattern.get("sizes") or {}
    return " / ".join(_size(sizes.get(name)) for name in ("p10", "p50", "p90", "max"))


def _broker_section(results: dict[str, Any]) -> list[str]:
    info = (results.get("scenarios") or {}).get("broker")
    if not info:
        return []
    out = ["## Catching up through a real Kafka broker\n"]
    warm = _run(results, "broker", "sidecar_warm") or {}
    warmed = warm.get("warm_up") or {}
    via = {"spark": "the Spark job (`--master local[2]`)",
           "direct": "direct `POST /api/v1/warm` calls"}.get(str(warmed.get("via")), "n/a")
    out.append(
        f"One Apache Kafka {info.get('kafka_version', '')} broker (KRaft, tiered storage on, "
        f"{info.get('java_version', 'Java')}, heap {info.get('broker_heap', '?')} and the "
        "JVM flags of Kafka's start scripts) with the stand-in for Aiven's remote storage manager "
        "(`tests/kafka`: Aiven's object layout and request pattern, a manifest GET whole, "
        "indexes by closed range, the log one closed-range GET per "
        f"{_num((info.get('chunk_bytes') or 0) / MiB, 0)} MiB chunk). Topic `catchup`: "
        f"{info.get('partitions', '?')} partitions of "
        f"{_num(info.get('records_per_partition'), 0)} records of "
        f"{info.get('record_bytes', '?')} B, segments of "
        f"{_num((info.get('segment_bytes') or 0) / MiB, 0)} MiB, "
        f"{info.get('remote_segments', '?')} segments "
        f"({_num((info.get('remote_log_bytes') or 0) / MiB, 1)} MiB of log, for "
        f"{_num((info.get('value_bytes') or 0) / MiB, 1)} MiB of record values) in remote "
        "storage, whatever is past them in each partition's active segment on the broker's "
        "disk; `catchup-local` holds the same records "
        "and is never tiered. Tiered through moto, then the bucket copied into the origin "
        "emulator's files. For each row the broker is restarted with the manager pointed at "
        "that row's endpoint (a fresh origin emulator, and sidecar), without its cache of "
        "remote indexes, and a fresh consumer (kafka-python, in the harness's process, "
        "`max_partition_fetch_bytes` 1 MiB) reads every partition from offset 0, checking "
        "every record. *Plugin cache*: the stand-in for the plugin's `DiskChunkCache`, "
        "`chunk.cache.prefetch.max.size` "
        f"{_num((info.get('prefetch_bytes') or 0) / MiB, 0)} MiB (the plugin's README "
        f"example), cache as large as the sidecar's ({info.get('sidecar_cache_size')}). "
        f"*Warmed*: a fresh sidecar warmed with {via} before the restart"
        + (f" ({_num(warmed.get('seconds'), 1)} s, "
           f"{_num((warmed.get('bytes_fetched') or 0) / MiB, 0)} MiB fetched)" if warmed
           else "")
        + ". *1 MiB chunks*: topic `catchup-1m`, the same records tiered by the manager "
        "with `chunk.size` 1 MiB, read through a fresh sidecar warmed with direct warm "
        "calls of its objects. MB/s: record values, 10^6 B/s. *Fetch*: the consumer's polls "
        "that returned records. CPU-s per GiB of values consumed, from /proc around the "
        "catch-up: the broker's JVM, the sidecar, and the consumer's process (the harness). *Other "
        "processes*: the cores that processes outside this run used meanwhile (this "
        "machine may be shared).\n")
    if info.get("spark_failure"):
        out.append(f"The Spark job could not run, so the warm calls were sent directly: "
                   f"`{' '.join(str(info['spark_failure']).split())[-400:]}`\n")
    direct, local = _run(results, "broker", "direct"), _run(results, "broker", "local")
    rows = []
    for run_name, label in _BROKER_ROWS:
        data = _run(results, "broker", run_name)
        if data is None:
            rows.append([label, "failed / not run", *[""] * 12])
            continue
        latency = data.get("fetch_latency_ms") or {}
        traffic = data.get("origin_traffic") or {}
        rows.append([
            label, _num(_mbps(data)), _times(_ratio(_mbps(data), _mbps(direct))),
            _times(_ratio(_mbps(data), _mbps(local))),
            f"{data.get('records', 0):,} of {data.get('records_expected', 0):,}",
            _num(latency.get("p50")), _num(latency.get("p99")),
            _num(_broker_cpu(data, "broker_cpu_per_gib"), 2),
            _num(_broker_cpu(data, "sidecar_cpu_per_gib"), 2)
            if data.get("sidecar_cpu_per_gib") else "-",
            _num(_broker_cpu(data, "consumer_cpu_per_gib"), 2),
            f"{traffic.get('get_requests', 0):,}", _mib(traffic.get("body_bytes")),
            _times(data.get("origin_body_bytes_per_consumed_byte")),
            _num((data.get("foreign_cpu") or {}).get("cores"), 2),
        ])
    out.append(_table(["path", "MB/s", "x direct", "x local", "records verified",
                       "fetch p50 ms", "fetch p99 ms", "broker CPU-s/GiB",
                       "sidecar CPU-s/GiB", "consumer CPU-s/GiB", "origin GETs",
                       "origin MiB", "origin bytes / consumed", "other processes"], rows))
    out.append("")

    out.append(
        "What the manager asked of its endpoint (the sidecar's access log; for the direct "
        "and cached rows the origin's, which it spoke to itself): GETs by object, how "
        "their ranges were written, their sizes (the closed range's length, else "
        "the bytes sent), and the connections they came over (distinct client ports "
        "of established connections to the endpoint in /proc/net/tcp, sampled every "
        "100 ms).\n")
    histogram_labels: list[str] = []
    rows = []
    for run_name, label in _BROKER_ROWS:
        pattern = (_run(results, "broker", run_name) or {}).get("endpoint_pattern")
        if not pattern:
            continue
        kinds = pattern.get("by_kind") or {}
        ranges = pattern.get("ranges") or {}
        histogram = pattern.get("histogram") or {}
        histogram_labels = histogram_labels or list(histogram)
        rows.append([
            label, f"{pattern.get('requests', 0):,}",
            " / ".join(f"{(kinds.get(kind) or {}).get('gets', 0):,} "
                       f"({_pct((kinds.get(kind) or {}).get('share'), 0)})"
                       for kind in ("rsm-manifest", "indexes", "log")),
            " / ".join(str(ranges.get(form, 0)) for form in ("closed", "open", "none")),
            _sizes(pattern),
            " / ".join(str(histogram.get(name, 0)) for name in histogram_labels),
            str(pattern.get("connections") or "n/a"),
            _num(pattern.get("requests_per_connection")),
        ])
    if rows:
        out.append(_table(["path", "requests", "GETs: manifest / indexes / log",
                           "ranges closed / open / none", "GET size p10 / p50 / p90 / max",
                           "GETs " + " / ".join(histogram_labels), "connections",
                           "requests per connection"], rows))
        out.append("")

    rows = []
    for run_name, label in _BROKER_ROWS:
        split = (_run(results, "broker", run_name) or {}).get("broker_threads_per_gib") or {}
        if split:
            top = sorted(split.items(), key=lambda item: -item[1])[:6]
            rows.append([label, ", ".join(f"`{kind}` {value:.2f}" for kind, value in top)])
    if rows:
        out.append("Where the broker's CPU went, by thread (CPU-s per GiB consumed, the "
                   "six largest kinds; Java's thread names as the kernel keeps them, 15 "
                   "characters, less their numbers):\n")
        out.append(_table(["path", "broker CPU-s/GiB by thread"], rows))
        out.append("")

    out.append("What reached the origin (its access log; connections are nginx's own "
               "serial numbers):\n")
    rows = []
    for run_name, label in _BROKER_ROWS:
        data = _run(results, "broker", run_name)
        pattern = (data or {}).get("origin_pattern")
        if not pattern:
            continue
        methods = pattern.get("methods") or {}
        kinds = pattern.get("by_kind") or {}
        rows.append([
            label, f"{methods.get('GET', 0):,}", f"{methods.get('HEAD', 0):,}",
            " / ".join(f"{(kinds.get(kind) or {}).get('gets', 0):,}"
                       for kind in ("rsm-manifest", "indexes", "log")),
            _sizes(pattern), _mib(pattern.get("bytes")),
            str(pattern.get("connections") or "-"),
            _num(pattern.get("requests_per_connection")),
        ])
    out.append(_table(["path", "GETs", "HEADs", "GETs: manifest / indexes / log",
                       "GET size p10 / p50 / p90 / max", "MiB sent", "connections",
                       "requests per connection"], rows))
    out.append("")
    return out


METHOD = """## Running it

```sh
make bench                          # the benchmark: installs nginx-light and wrk if missing,
                                    # writes the 1 GiB data set (bench/data/, reused), runs all,
                                    # writes bench/results/<UTC time>.json, latest.json
                                    # and BENCHMARKS.md
.venv/bin/python -m bench --quick   # 256 MiB, 5 s wrk runs: checks the harness in about a minute
                                    # (bench/results/*-quick.{json,md}, not committed)
.venv/bin/python -m bench --only cold-1p,warm-ranges   # some of: cold-1p cold-4p warm-replay
                                    # warm-ranges cost-4p wide-48p isolation warmup restart
                                    # broker (needs `make kafka`)
.venv/bin/python -m bench --report-only bench/results/latest.json   # only regenerate this file
.venv/bin/python -m bench --report-only bench/results/latest.json bench/results/X-partial.json
                                    # ... with the scenarios of a later partial run in their place
```

Servers bind 127.0.0.1 on free ports and run as child processes in their own
process groups (never the system nginx service); all are stopped at the end,
on failure and on Ctrl-C/SIGTERM. Configs and logs of a run with failures stay
in `bench/results/tmp/` (`--keep-work` keeps them always).

## How this is measured

**Origin emulator** (docs/ARCHITECTURE.md, "Benchmark origin model"): nginx with the echo
module of Debian's `nginx-light`, serving the data set files path-style
(`/tiered/{key}`), first byte after 30 ms, 64 MB/s per connection:

```nginx
location /tiered/ { echo_sleep 0.03; echo_exec @obj; }
location @obj     { root DATA; limit_rate 64m; sendfile_max_chunk 268436; }
```

- `echo_exec` to a named location is an internal redirect of the request itself
  (not a subrequest), so the static module answers as usual after the sleep:
  `Range` (206 + `Content-Range`, 416), `HEAD`, `If-Match` (412), `ETag`,
  `Last-Modified`, `Content-Length` all work through it; the harness's functional
  test checks this with boto3. nginx itself sends `Accept-Ranges` only with a
  200; S3 sends it with 206 too, so the config adds it when the request has a
  `Range` (`add_header` runs before the range filter turns 200 into 206, so it
  cannot key on `$status`).
- `sendfile_max_chunk 268436` is needed for the rate limit to mean anything at
  1 MiB: nginx enforces `limit_rate` by pausing *after* each send for
  bytes/rate (whole milliseconds), and by default one send pushes up to 2 MiB
  into a loopback socket, so a 1 MiB answer arrived in one burst at 30 ms
  (measured 31 ms instead of ~46 ms). With 268436-byte sends (64 MiB/s x 4 ms)
  nginx pauses 4 ms per send: a 1 MiB range takes ~43 ms, an 8 MiB range
  ~160 ms, a whole 64 MiB object ~1.05 s (~64 MB/s after the first byte).
  `limit_rate` is per request, i.e. per connection for sequential requests.
- nginx cannot list, so the harness writes ListObjectsV2 answers (S3 namespace,
  `KeyCount`, `MaxKeys` 1000, `IsTruncated` false, `Contents` with `Key`,
  `LastModified`, `ETag` equal to nginx's own ETag, `Size`, `StorageClass`) for
  every prefix a client can ask: `""`, `orders`, `orders-`, `orders-{topicId}/`
  and each `orders-{topicId}/{p}/`. `GET /tiered?list-type=2&prefix=...` picks
  the file with a `map` on `$arg_prefix`, which nginx does not decode, so each
  prefix is mapped in its percent-encoded form (`orders-X%2F0%2F`, as botocore
  sends it) and with a raw `/`; `map` compares case-insensitively, so `%2f` is
  covered too. `delimiter=/` (the Spark warm-up job's way to find a topic's
  partitions) picks a second file per prefix, with `CommonPrefixes`. An
  unknown prefix gets an empty listing; other delimiters, `start-after` and
  continuation tokens are refused with 501 rather than answered wrongly.
  `GET /` answers a one-bucket ListAllMyBucketsResult (the sidecar's start-up
  check), a missing key an S3 `NoSuchKey` XML 404.
- The origin's access log (`$body_bytes_sent` per request) gives the
  "origin bytes / replayed" column for every path: what the origin put on the
  wire, including the part of an open-ended range already sent when the client
  hung up.

**Replay client**: `python -m sidecar replay --fetch-bytes 1MiB --json`, the
same client for every row: per partition one sequential reader that opens the
segment with an open-ended range (`bytes=pos-`), reads 1 MiB (to the end of
the batch it is in), checks every record batch's CRC-32C and offset continuity,
drops the connection and continues after the last whole batch, into the next
segment. MB/s is 10^6 bytes of checked batches per second of replay (listing
not included). Dummy AWS credentials; the origin does not check signatures.

**nginx slice baseline** (the one the targets compare against): `slice 8m;
proxy_cache` (fresh cache directory per cold run),
`proxy_cache_key $uri$is_args$args$slice_range`,
`proxy_set_header Range $slice_range`, `proxy_cache_valid 200 206 1h`,
`proxy_http_version 1.1`, upstream keep-alive, `worker_processes auto`;
listings are proxied uncached. A broker-like reader defeats it in a particular
way: it asks for the next 1 MiB of a slice while nginx is still caching that
slice (nginx finishes a cacheable slice after the client hangs up), so without
a lock each such fetch is a miss that fetches the whole 8 MiB slice from the
origin again (hence its origin bytes of several times the data). The *extra*
row adds `proxy_cache_lock on`: origin bytes drop to ~1x, but nginx re-checks
a held cache lock only every 500 ms, so most slices cost the reader a
~500 ms stall and it is slower still; it is shown for reference and not used
for the targets.

**Sidecar**: `python -m sidecar serve --cache-size 2GiB` with a fresh cache
directory per cold run, defaults otherwise, in front of its own fresh origin
emulator. Hit ratios and origin bytes are the deltas of its `/api/v1/stats`
around each replay.

**Warm range reads**: wrk with a Lua script (`bench/random_ranges.lua`) picking
random 1 MiB-aligned 1 MiB ranges of random segments; the local-file nginx
(`worker_processes auto`, sendfile) serves the same files with no delay and no
rate limit. MB/s counts 1 MiB per successful response.

**Isolation** (`bench/isolation.py`, `bench/probe.py`): the probe is a child
process that pins itself to CPU 0 (`os.sched_setaffinity`) and sleeps 1 ms in a
loop, recording `actual - 1 ms` per wake-up (default timer slack, 50 µs, is part
of every number). For the pinned row the sidecar is started with `--cpus 1`
(process and all its threads; the table shows the threads' affinity as read
back from /proc), and the origin nginx (master and worker) and the replay
client run under `taskset -c 1`; for the contrast row nothing is pinned but the
probe. Each loaded row uses a fresh origin and sidecar (cold cache). Because
this machine may be shared, the probe's window also sums the CPU time of every
process outside the benchmark's process tree (`/proc/<pid>/stat`, children
reaped meanwhile included through their parent); more than 0.05 cores and the
window is measured again (idle up to 3 times, loaded up to 2), and when the
idle or the pinned window kept was still disturbed, the target is reported as
not measured. The miss
latency rows use their own fresh sidecar (not pinned) and origin.

**Warm-up** (`bench/warmup.py`): `python -m spark_warmup PLAN.json --master
local[2] --report DIR` with a plan naming the origin emulator, the sidecar's
admin URL, topic `orders` with all partitions and `ttl_s` 3600; the job lists
the topic's directories and partitions at the origin (ListObjectsV2 with
`delimiter=/`, which the emulator answers from pre-generated files too) and
sends one warm call per segment. Without Spark (or when the job cannot start)
the harness sends the same calls itself and says so. The replay that follows
lists segments at the origin (`--list-endpoint`), like the other sidecar rows.

**Real broker** (`bench/broker.py`, `python -m bench --only broker`, after `make
kafka`): the broker's remote storage manager signs every request (SigV4) with a
key of its own; the origin emulator ignores signatures, the sidecar checks them
and is given that key (`SIDECAR_AUTH_KEYS`). The data is tiered through moto
(the emulator serves static files and cannot take uploads), then the bucket is
copied into the emulator's files, with listings for the Spark job. Each row
restarts the broker with `rsm.config.*` pointing at its endpoint, removes the
broker's `remote-log-index-cache` while it is down, and waits until the
broker logs that its remote log metadata is loaded before the consumer
starts. The sidecar rows run with an access log (`SIDECAR_ACCESS_LOG`), the
source of the request pattern; the origin emulator's log line carries nginx's
connection serial and its request count.

**Caveats**: everything (client, sidecar, nginx, origin) shares this one
machine and its cores over loopback; the data set sits in the page cache, so
the origin emulator's only costs are the ones it models (latency and
per-connection bandwidth).
"""


def console_summary(results: dict[str, Any]) -> str:
    lines = ["", "targets:"]
    for target in results.get("targets") or []:
        lines.append(f"  {_status(target['met']).replace('**', ''):13} {target['target']}: "
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
                             + f"  other processes {_foreign_cores(data):.2f} cores")
            elif data.get("kind") == "misses":
                for phase in ("idle", "loaded"):
                    total = (data.get(phase) or {}).get("total_ms") or {}
                    lines.append(f"  {scenario:12} {'misses ' + phase:22} p50 {total.get('p50')} "
                                 f"ms  p99 {total.get('p99')} ms  "
                                 f"({(data.get(phase) or {}).get('counted')} counted)")
            elif "median_seconds" in data:
                lines.append(f"  {scenario:12} {run:22} indexed in {data.get('seconds')} s "
                             f"(recovered {data.get('recovered')})")
            elif "warm_lane" in data:
                lane = data.get("warm_lane") or {}
                lines.append(f"  {scenario:12} {run:22} via {data.get('via')}: "
                             f"{(data.get('bytes_fetched') or 0) / MiB:.0f} MiB, warm lane "
                             f"{(lane.get('bytes_per_s') or 0) / MiB:.1f} MiB/s "
                             f"({_pct(data.get('warm_lane_vs_budget'), 1)} of budget)")
            elif "requests_per_s" in data:
                lines.append(f"  {scenario:12} {run:22} {data['requests_per_s']:>9} req/s "
                             f"{data['mb_per_s']:>9} MB/s  p50 {data['latency_ms']['p50']} ms  "
                             f"p99 {data['latency_ms']['p99']} ms")
            else:
                latency = data.get("fetch_latency_ms") or {}
                lines.append(f"  {scenario:12} {run:22} {data.get('mb_per_s')!s:>9} MB/s  "
                             f"fetch p50 {latency.get('p50')} ms  p99 {latency.get('p99')} ms  "
                             f"byte hit {_pct(_sidecar_stat(data, 'byte_hit_ratio'))}")
    return "\n".join(lines)


def merge_results(base: dict[str, Any], extra: dict[str, Any], name: str) -> dict[str, Any]:
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
