"""warm-ranges: wrk's random 1 MiB ranges against a warm sidecar.

The same ranges against nginx serving the files from local disk, and against
three floor servers (bench/floor_server.py, aiohttp): from the page cache;
each chunk read with O_DIRECT and hashed first; each chunk's slice sent with
sendfile, as the memory tier's hits are. Each server's CPU per GiB from
/proc. The sidecar is the one bench/four_partitions.py warmed; beside it a
fresh one whose memory tier holds the data set, filled by one cold replay.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from bench import cpu
from bench.clients import run_wrk
from bench.cost import light_replay, tier_variants
from bench.dataset import write_range_targets
from bench.harness import Bench
from bench.sidecar_server import SidecarServer, stats_delta
from bench.signing import presigned_path

SCENARIO = "warm-ranges"
RANGE_BYTES = 1024 * 1024
# Floor servers (bench/floor_server.py) the warm ranges are also read from.
RANGE_FLOORS = ("aiohttp", "aiohttp-direct-verified", "aiohttp-sendfile")


def run_warm_ranges(bench: Bench, sidecar: SidecarServer) -> None:
    settings = bench.settings
    targets = bench.work / "range-targets.txt"
    ranges = write_range_targets(bench.dataset, targets, RANGE_BYTES)
    # The sidecar's requests are signed, as the plugin's are (nginx ignores the query).
    signed_targets = bench.work / "range-targets-signed.txt"
    write_range_targets(bench.dataset, signed_targets, RANGE_BYTES,
                        functools.partial(presigned_path, sidecar.data_url))
    bench.scenarios[SCENARIO] = {
        "tool": "wrk", "range_bytes": RANGE_BYTES, "aligned_ranges": ranges,
        "connections": settings.wrk_connections, "threads": settings.wrk_threads,
        "seconds": settings.wrk_seconds, "runs": {},
    }
    print(f"{SCENARIO}: wrk, random 1 MiB ranges, {settings.wrk_connections} connections, "
          f"{settings.wrk_seconds} s each", file=sys.stderr, flush=True)

    def local() -> dict[str, Any]:
        with bench.local_files() as server:
            return _wrk(bench, server.url, "warm-ranges-nginx-local", server.pid, targets)

    def sidecar_warm() -> dict[str, Any]:
        before = sidecar.stats()
        result = _wrk(bench, sidecar.data_url, "warm-ranges-sidecar", sidecar.pid,
                      signed_targets)
        result["sidecar"] = stats_delta(before, sidecar.stats())
        return result

    def sidecar_tier_warm() -> dict[str, Any]:
        # A fresh sidecar whose memory tier holds the data set, filled by one
        # cold replay (chunks land in its free regions): the same ranges sent
        # with sendfile from memory, no slab read and no second hash.
        with bench.origin("warm-ranges-tier") as origin, \
                bench.sidecar(origin, env=dict(tier_variants(bench.dataset))[
                    "sidecar_tier_whole"]) as tiered:
            light_replay(bench, "warm-ranges-tier-fill", bench.dataset, tiered.data_url,
                         tiered.pid, origin, tiered)
            tiered_targets = bench.work / "range-targets-tier.txt"
            write_range_targets(bench.dataset, tiered_targets, RANGE_BYTES,
                                functools.partial(presigned_path, tiered.data_url))
            before = tiered.stats()
            result = _wrk(bench, tiered.data_url, "warm-ranges-sidecar-tier", tiered.pid,
                          tiered_targets)
            result["sidecar"] = stats_delta(before, tiered.stats())
            result["memory_tier_hits"] = (tiered.metric_samples(
                "sidecar_memory_tier_hits_total") or {}).get("", 0)
            return result

    def floor(mode: str) -> dict[str, Any]:
        with bench.floor_server(mode) as (endpoint, pid):
            return _wrk(bench, endpoint, f"warm-ranges-floor-{mode}", pid, targets)

    bench.attempt(SCENARIO, "sidecar_warm", sidecar_warm)
    bench.attempt(SCENARIO, "nginx_local", local)
    bench.attempt(SCENARIO, "sidecar_tier_warm", sidecar_tier_warm)
    # What any Python server pays for the same ranges: answering them from the
    # page cache and nothing else, and reading each chunk past the page cache
    # and hashing it first, as a cache that verifies every byte it serves.
    for mode in RANGE_FLOORS:
        bench.attempt(SCENARIO, f"floor_{mode}", functools.partial(floor, mode))


def _wrk(bench: Bench, url: str, label: str, server_pid: int | None,
         objects: Path) -> dict[str, Any]:
    settings = bench.settings
    before = cpu.usage(server_pid) if server_pid else None
    result = run_wrk(url, objects, settings.wrk_seconds, settings.wrk_connections,
                     settings.wrk_threads, bench.work / "logs" / f"{label}.log")
    if server_pid and before:
        # The server's CPU per GiB it sent: what a hit costs the node.
        delivered = (result["requests"] - result["errors"]["status"]) * result["range_bytes"]
        result["server_cpu_per_gib"] = (cpu.usage(server_pid) - before).per_gib(delivered)
    print(f"  {label}: {result['requests_per_s']} req/s, {result['mb_per_s']} MB/s, "
          f"p99 {result['latency_ms']['p99']} ms", file=sys.stderr, flush=True)
    return result
