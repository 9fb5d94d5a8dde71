"""What a cold and a warm replay cost the server, with a client too light to be the bound.

Two scenarios, both with the light broker-like client (bench/light_client.py:
an open-ended `bytes=pos-` per 1 MiB fetch, the connection dropped after it,
no CRC work) and the CPU of each server process family read from /proc
around every replay (bench/cpu.py):

  cost-4p   the 4-partition data set, every partition at once: the sidecar
            cold then warm (the same replay again), the same with its memory
            tier at auto and with one that holds the whole data set, nginx slice
            cold then warm, and the origin direct; `rounds` times over, fresh servers
            and caches each round, so the figures near a target come with
            their spread. Each round also replays through three servers that
            do nothing but serve the data set's files (bench/floor_server.py:
            aiohttp, a bare asyncio protocol, asyncio's sendfile), the floor
            under a Python server's warm replay
  wide-48p  48 partitions x one 24 MiB segment each, all at once (a consumer
            group catching up on many partitions): the sidecar cold against
            nginx slice cold; fetch p99, when the first and the last
            partition were done, and the sidecar's peak RSS
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from bench import cpu, page_cache
from bench.clients import ClientFailed, run_bounded
from bench.dataset import Dataset, DatasetSpec, ensure_dataset, write_listings
from bench.floor_server import MODES as FLOOR_MODES
from bench.harness import Bench
from bench.nginx import NginxServer, origin_config, origin_traffic
from bench.sidecar_server import SidecarServer, client_env, stats_delta

MiB = 1024 * 1024
#: Connections of the origin floor: about as many as a cold 4-partition replay
#: keeps busy (its read-ahead windows).
ORIGIN_FLOOR_THREADS = 8
#: 48 partitions x one 24 MiB segment (1.1 GiB), beside the main data set.
WIDE = DatasetSpec("wide", partitions=48, segments_per_partition=1, segment_bytes=24 * MiB)
WIDE_QUICK = DatasetSpec("wide-quick", partitions=16, segments_per_partition=1,
                         segment_bytes=8 * MiB)


def segments_file(bench: Bench, dataset: Dataset) -> Path:
    """The light client's (and the origin floor's) --segments file for `dataset`,
    written once a run."""
    segments = bench.work / f"segments-{dataset.spec.name}.json"
    if not segments.exists():
        segments.write_text(json.dumps({"partitions": segments_by_partition(dataset)}))
    return segments


def segments_by_partition(dataset: Dataset) -> dict[str, list[dict[str, object]]]:
    """The light client's input: each partition's segments in offset order."""
    partitions: dict[str, list[tuple[int, dict[str, object]]]] = defaultdict(list)
    for item in dataset.objects:
        partitions[str(item.partition)].append(
            (item.start_offset, {"key": item.key, "size": item.size}))
    return {name: [segment for _, segment in sorted(rows, key=lambda row: row[0])]
            for name, rows in sorted(partitions.items(), key=lambda entry: int(entry[0]))}


def light_replay(
    bench: Bench, label: str, dataset: Dataset, endpoint: str, server_pid: int | None,
    origin: NginxServer | None, sidecar: SidecarServer | None = None,
) -> dict[str, Any]:
    """One light-client replay of every partition at once, with the server's
    CPU over it (user, system, minor faults; per GiB delivered). `origin` None:
    the server reads no origin (a floor server)."""
    segments = segments_file(bench, dataset)
    args = [sys.executable, "-m", "bench.light_client", "--endpoint", endpoint,
            "--bucket", dataset.spec.bucket, "--segments", str(segments),
            *(["--sign"] if sidecar is not None else [])]
    offset = origin_traffic(origin.access_log)[1] if origin is not None else 0
    before_stats = sidecar.stats() if sidecar else None
    before = cpu.usage(server_pid) if server_pid else None
    threads_before = cpu.threads(server_pid) if server_pid else {}
    print(f"  {label}: light client, {dataset.total_bytes / MiB:.0f} MiB from {endpoint} ...",
          file=sys.stderr, flush=True)
    with page_cache.PageCacheWatch() as watch:
        finished = run_bounded(args, 120 + dataset.total_bytes / 2e6, client_env(),
                               bench.work / "logs" / f"{label}.log")
    used = (cpu.usage(server_pid) - before) if server_pid and before else None
    threads_after = cpu.threads(server_pid) if server_pid else {}
    lines = finished.stdout.strip().splitlines()
    if not lines:
        raise ClientFailed(f"{label}: the light client printed nothing: {finished.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    report["exit_code"] = finished.returncode
    report["command"] = "python " + " ".join(args[1:])
    report["listed_via"] = "none (the segments are the data set's)"
    if origin is not None:
        time.sleep(0.2)  # let nginx write the access-log lines of closed connections
        traffic, _ = origin_traffic(origin.access_log, offset)
        report["origin_traffic"] = asdict(traffic)
        report["origin_body_bytes_per_replayed_byte"] = (
            traffic.body_bytes / report["bytes"] if report.get("bytes") else None)
    if used is not None:
        report["server_cpu_seconds"] = {"user": round(used.user_s, 3),
                                        "system": round(used.system_s, 3),
                                        "minor_faults": used.minor_faults}
        report["server_cpu_per_gib"] = used.per_gib(int(report.get("bytes") or 0))
        report["server_threads_per_gib"] = cpu.by_kind(threads_before, threads_after,
                                                        int(report.get("bytes") or 0))
        report["server_peak_rss_bytes"] = cpu.peak_rss_bytes(server_pid) if server_pid else None
        # Results from before carry the first process's alone (bench/report_cost.py).
        report["server_peak_rss_of"] = cpu.PEAK_RSS_OF
    report["page_cache"] = watch.figures()
    if sidecar is not None and before_stats is not None:
        report["sidecar"] = stats_delta(before_stats, sidecar.stats())
        report["memory_tier_size_bytes"] = (
            sidecar.metric_samples("sidecar_memory_tier_size_bytes") or {}).get("", 0)
        report["sidecar_prefetch_blocks_total"] = sidecar.metric_samples(
            "sidecar_prefetch_blocks_total")
    per_gib = (report.get("server_cpu_per_gib") or {}).get("total")
    print(f"  {label}: {report.get('mb_per_s')} MB/s, {per_gib} CPU-s/GiB, fetch p99 "
          f"{(report.get('fetch_latency_ms') or {}).get('p99')} ms", file=sys.stderr, flush=True)
    if report.get("errors"):
        raise ClientFailed(f"{label}: {report.get('error_messages')}")
    return report


def _origin_for(bench: Bench, name: str, dataset: Dataset, listings: Path,
                by_raw: dict[str, str]) -> NginxServer:
    prefix = bench.workdir(f"origin-{name}")
    return NginxServer(f"origin ({name})", prefix,
                       lambda port: origin_config(prefix, port, dataset.root, listings, by_raw))


def _sidecar_pair(bench: Bench, number: int, name: str = "sidecar",
                  env: dict[str, str] | None = None) -> dict[str, Any]:
    """A fresh sidecar replayed twice: cold, then warm. The cold replay's page
    cache growth is counted from before the sidecar starts: a memory tier
    takes its memory at start (memory_tier_reserve), not during the replay."""
    dataset = bench.dataset
    label = name.replace("_", "-")
    with bench.origin(f"cost-{label}-{number}") as origin, \
            page_cache.PageCacheWatch() as since_start, \
            bench.sidecar(origin, env=env) as sidecar:
        replays: dict[str, dict[str, Any]] = {}
        for when in ("cold", "warm"):
            replays[when] = light_replay(bench, f"cost-4p-{label}-{when}-{number}", dataset,
                                         sidecar.data_url, sidecar.pid, origin, sidecar)
            if when == "cold":
                replays[when]["page_cache"] = since_start.figures()
        return replays


def tier_variants(dataset: Dataset) -> tuple[tuple[str, dict[str, str]], ...]:
    """The sidecar pairs beside the default one (memory tier at `auto`: an
    eighth of the cache, at most 256 MiB, several times smaller than the
    replay): the tier off, and one that holds the whole data set, so that the
    warm replay is served from it."""
    whole = -(-(dataset.total_bytes + 64 * MiB) // MiB)
    return (("sidecar_tier_off", {"SIDECAR_MEMORY_TIER": "0"}),
            ("sidecar_tier_whole", {"SIDECAR_MEMORY_TIER": f"{whole}MiB"}))


def _slice_pair(bench: Bench, number: int) -> dict[str, Any]:
    """A fresh nginx slice cache replayed twice: cold, then warm."""
    dataset = bench.dataset
    with bench.origin(f"cost-slice-{number}") as origin, bench.slice_cache(origin) as cache:
        return {when: light_replay(bench, f"cost-4p-slice-{when}-{number}", dataset,
                                   cache.url, cache.pid, origin)
                for when in ("cold", "warm")}


def _direct(bench: Bench, number: int) -> dict[str, Any]:
    with bench.origin(f"cost-direct-{number}") as origin:
        return light_replay(bench, f"cost-4p-origin-{number}", bench.dataset, origin.url,
                            origin.pid, origin)


def _floor(bench: Bench, mode: str, number: int) -> dict[str, Any]:
    """The data set replayed twice through a floor server: the first fills the
    page cache, the second (kept) is the floor."""
    with bench.floor_server(mode) as (endpoint, pid):
        light_replay(bench, f"cost-4p-floor-{mode}-first-{number}", bench.dataset, endpoint,
                     pid, None)
        return light_replay(bench, f"cost-4p-floor-{mode}-{number}", bench.dataset, endpoint,
                            pid, None)


def _origin_floor(bench: Bench, number: int, work: str = "write") -> dict[str, Any]:
    """The data set's blocks received, hashed and written past the page cache
    by bench.origin_floor (and with `work` "tier", kept in a memory tier that
    holds them all, its pages taken first; "tier-fresh", into pages not yet
    taken), from a fresh origin: the floor under a cold replay's origin
    threads."""
    dataset = bench.dataset
    segments = segments_file(bench, dataset)
    name = f"origin-floor-{number}" if work == "write" else f"origin-floor-{work}-{number}"
    scratch = bench.workdir(name)
    with bench.origin(name) as origin:
        args = [sys.executable, "-m", "bench.origin_floor", "--endpoint", origin.url,
                "--bucket", dataset.spec.bucket, "--segments", str(segments),
                "--threads", str(ORIGIN_FLOOR_THREADS), "--scratch", str(scratch),
                "--work", work]
        print(f"  {name}: {dataset.total_bytes / MiB:.0f} MiB from {origin.url} "
              "...", file=sys.stderr, flush=True)
        finished = run_bounded(args, 120 + dataset.total_bytes / 2e6, client_env(),
                               bench.work / "logs" / f"{name}.log")
    lines = finished.stdout.strip().splitlines()
    if finished.returncode != 0 or not lines:
        raise ClientFailed(f"origin floor: {finished.stderr[-2000:] or lines[-1:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    report["command"] = "python " + " ".join(args[1:])
    print(f"  {name}: {report['mb_per_s']} MB/s, "
          f"{report['server_cpu_per_gib']['total']} CPU-s/GiB", file=sys.stderr, flush=True)
    return report


def run_cost_4p(bench: Bench) -> None:
    scenario = "cost-4p"
    rounds = bench.settings.cost_rounds
    dataset = bench.dataset
    bench.scenarios[scenario] = {"partitions": dataset.spec.partitions, "rounds": rounds,
                                 "bytes": dataset.total_bytes, "client": "light", "runs": {}}
    print(f"{scenario}: {dataset.spec.partitions} partitions at once, light client, "
          f"{rounds} rounds", file=sys.stderr, flush=True)
    runs = bench.scenarios[scenario]["runs"]
    # The origin's files in the page cache before any replay is watched: only
    # the servers' own use of it shows (bench/page_cache.py).
    page_cache.load_files(dataset.path(item.key) for item in dataset.objects)
    pairs: list[tuple[str, Any]] = [("sidecar", _sidecar_pair)]
    pairs += [(name, partial(_sidecar_pair, name=name, env=env))
              for name, env in tier_variants(dataset)]
    pairs.append(("nginx_slice", _slice_pair))
    for number in range(1, rounds + 1):
        for name, pair in pairs:
            bench.attempt(scenario, f"{name}_pair_{number}", partial(pair, bench, number))
            both = runs.pop(f"{name}_pair_{number}", None)
            runs[f"{name}_cold_{number}"] = both["cold"] if both else None
            runs[f"{name}_warm_{number}"] = both["warm"] if both else None
        for mode in FLOOR_MODES:
            bench.attempt(scenario, f"floor_{mode}_{number}", partial(_floor, bench, mode, number))
        bench.attempt(scenario, f"floor_origin_{number}", partial(_origin_floor, bench, number))
        for work in ("tier", "tier-fresh"):
            bench.attempt(scenario, f"floor_origin-{work}_{number}",
                          partial(_origin_floor, bench, number, work))
        if number == 1:
            bench.attempt(scenario, "origin_1", partial(_direct, bench, number))


def _wide_replay(bench: Bench, dataset: Dataset, listings: Path, by_raw: dict[str, str],
                 server: str, number: int) -> dict[str, Any]:
    with _origin_for(bench, f"wide-{server}-{number}", dataset, listings, by_raw) as origin:
        if server == "sidecar":
            with bench.sidecar(origin) as sidecar:
                return light_replay(bench, f"wide-sidecar-cold-{number}", dataset,
                                    sidecar.data_url, sidecar.pid, origin, sidecar)
        with bench.slice_cache(origin) as cache:
            return light_replay(bench, f"wide-slice-cold-{number}", dataset, cache.url,
                                cache.pid, origin)


def run_wide(bench: Bench) -> None:
    scenario = "wide-48p"
    spec = WIDE_QUICK if bench.settings.quick else WIDE
    dataset, built = ensure_dataset(spec, bench.data_dir)
    listings = bench.work / "listings-wide"
    by_raw = write_listings(dataset, listings)
    rounds = bench.settings.cost_rounds
    bench.scenarios[scenario] = {
        "partitions": spec.partitions, "segment_bytes": spec.segment_bytes,
        "bytes": dataset.total_bytes, "client": "light", "rounds": rounds,
        "dataset_built_this_run": built, "runs": {},
    }
    print(f"{scenario}: {spec.partitions} partitions x {spec.segment_bytes // MiB} MiB at once, "
          f"light client, {rounds} rounds", file=sys.stderr, flush=True)
    for number in range(1, rounds + 1):
        for server, run in (("sidecar", "sidecar_cold"), ("slice", "nginx_slice_cold")):
            bench.attempt(scenario, f"{run}_{number}", partial(
                _wide_replay, bench, dataset, listings, by_raw, server, number))
