"""warm-ranges: wrk's random 1 MiB ranges against a warm sidecar.

The same ranges against nginx serving the files from local disk, and against
three floor servers (bench/floor_server.py, aiohttp): from the page cache;
each chunk read with O_DIRECT and hashed first; each chunk's slice sent with
sendfile, as the memory tier's hits are. Each server's CPU per GiB from
/proc. The sidecar is the one bench/four_partitions.py warmed; beside it a
fresh one whose memory tier holds the data set, filled by one cold replay.
All of them are up at once and take wrk in turn, round after round (the
cost scenarios' `--rounds`): a run's figures are its median round's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import cpu
from bench.clients import ClientFailed, run_wrk
from bench.cost import light_replay, tier_variants
from bench.dataset import write_range_targets
from bench.harness import Bench
from bench.sidecar_server import SidecarServer, stats_delta
from bench.signing import presigned_path

SCENARIO = "warm-ranges"
RANGE_BYTES = 1024 * 1024
# Floor servers (bench/floor_server.py) the warm ranges are also read from.
RANGE_FLOORS = ("aiohttp", "aiohttp-direct-verified", "aiohttp-sendfile")
# The shortest round of wrk worth its figures (a round's connections warm up first).
MIN_ROUND_SECONDS = 5


def run_warm_ranges(bench: Bench, sidecar: SidecarServer) -> None:
    settings = bench.settings
    targets = bench.work / "range-targets.txt"
    ranges = write_range_targets(bench.dataset, targets, RANGE_BYTES)
    # The sidecar's requests are signed, as the plugin's are (nginx ignores the query).
    signed_targets = bench.work / "range-targets-signed.txt"
    write_range_targets(bench.dataset, signed_targets, RANGE_BYTES,
                        functools.partial(presigned_path, sidecar.data_url))
    rounds = settings.cost_rounds
    # The same time in all as one run a server, cut into rounds that take
    # the servers in turn: a burst of other work on this shared machine then
    # falls on one round of one server, not on the whole of it.
    seconds = max(MIN_ROUND_SECONDS, -(-settings.wrk_seconds // rounds))
    bench.scenarios[SCENARIO] = {
        "tool": "wrk", "range_bytes": RANGE_BYTES, "aligned_ranges": ranges,
        "connections": settings.wrk_connections, "threads": settings.wrk_threads,
        "seconds": seconds, "rounds": rounds, "runs": {},
    }
    print(f"{SCENARIO}: wrk, random 1 MiB ranges, {settings.wrk_connections} connections, "
          f"{rounds} round{'s' if rounds > 1 else ''} of {seconds} s, the servers in turn",
          file=sys.stderr, flush=True)
    with ExitStack() as stack:
        # Every server up first, each round of wrk given to them in turn.
        servers: dict[str, Callable[[str], dict[str, Any]]] = {}

        def start(run: str, make: Callable[[], Callable[[str], dict[str, Any]]]) -> None:
            try:
                servers[run] = make()
            except (RuntimeError, OSError, ValueError) as exc:
                bench.scenarios[SCENARIO]["runs"][run] = None
                bench.errors.append({"scenario": SCENARIO, "run": run, "error": str(exc)[-4000:]})
                print(f"  {SCENARIO}/{run} FAILED: {exc}", file=sys.stderr, flush=True)

        def warm() -> Callable[[str], dict[str, Any]]:
            return functools.partial(_sidecar_round, bench, sidecar, signed_targets, seconds)

        def local() -> Callable[[str], dict[str, Any]]:
            server = stack.enter_context(bench.local_files())
            return lambda label: _wrk(bench, server.url, label, server.pid, targets, seconds)

        def tiered() -> Callable[[str], dict[str, Any]]:
            # A fresh sidecar whose memory tier holds the data set, filled by
            # one cold replay (chunks land in its free regions): the same
            # ranges sent with sendfile from memory, no slab read and no
            # second hash.
            origin = stack.enter_context(bench.origin("warm-ranges-tier"))
            server = stack.enter_context(bench.sidecar(origin, env=dict(
                tier_variants(bench.dataset))["sidecar_tier_whole"]))
            light_replay(bench, "warm-ranges-tier-fill", bench.dataset, server.data_url,
                         server.pid, origin, server)
            tier_targets = bench.work / "range-targets-tier.txt"
            write_range_targets(bench.dataset, tier_targets, RANGE_BYTES,
                                functools.partial(presigned_path, server.data_url))
            return functools.partial(_sidecar_round, bench, server, tier_targets, seconds)

        def floor(mode: str) -> Callable[[str], dict[str, Any]]:
            endpoint, pid = stack.enter_context(bench.floor_server(mode))
            return lambda label: _wrk(bench, endpoint, label, pid, targets, seconds)

        start("sidecar_warm", warm)
        start("nginx_local", local)
        start("sidecar_tier_warm", tiered)
        # What any Python server pays for the same ranges: answering them from the
        # page cache and nothing else, and reading each chunk past the page cache
        # and hashing it first, as a cache that verifies every byte it serves.
        for mode in RANGE_FLOORS:
            start(f"floor_{mode}", functools.partial(floor, mode))
        _take_turns(bench, servers, rounds)


def _take_turns(bench: Bench, servers: dict[str, Callable[[str], dict[str, Any]]],
                rounds: int) -> None:
    """`rounds` of wrk a server, the servers in turn (each round in the other
    order than the last); each run's result is its median round by requests
    a second, with every round's figures beside it."""
    taken: dict[str, list[dict[str, Any]]] = {run: [] for run in servers}
    order = list(servers)
    for number in range(1, rounds + 1):
        for run in order if number % 2 else reversed(order):
            try:
                taken[run].append(servers[run](f"{LABELS.get(run, run)}-{number}"))
            except (ClientFailed, RuntimeError, OSError, ValueError) as exc:
                bench.errors.append({"scenario": SCENARIO, "run": run,
                                     "error": str(exc)[-4000:]})
                print(f"  {SCENARIO}/{run} round {number} FAILED: {exc}",
                      file=sys.stderr, flush=True)
    runs = bench.scenarios[SCENARIO]["runs"]
    for run, results in taken.items():
        if not results:
            runs[run] = None
            continue
        ranked = sorted(results, key=lambda result: result["requests_per_s"])
        runs[run] = {**ranked[(len(ranked) - 1) // 2], "rounds": [
            {"requests_per_s": result["requests_per_s"],
             "server_cpu_per_gib": (result.get("server_cpu_per_gib") or {}).get("total")}
            for result in results]}


# Log names of the runs (bench/results/tmp/.../logs/<label>-<round>.log).
LABELS = {"sidecar_warm": "warm-ranges-sidecar", "nginx_local": "warm-ranges-nginx-local",
          "sidecar_tier_warm": "warm-ranges-sidecar-tier",
          **{f"floor_{mode}": f"warm-ranges-floor-{mode}" for mode in RANGE_FLOORS}}


def _sidecar_round(bench: Bench, server: SidecarServer, objects: Path, seconds: int,
                   label: str) -> dict[str, Any]:
    before = server.stats()
    result = _wrk(bench, server.data_url, label, server.pid, objects, seconds)
    result["sidecar"] = stats_delta(before, server.stats())
    result["memory_tier_hits"] = (server.metric_samples(
        "sidecar_memory_tier_hits_total") or {}).get("", 0)
    return result


def _wrk(bench: Bench, url: str, label: str, server_pid: int | None,
         objects: Path, seconds: int) -> dict[str, Any]:
    settings = bench.settings
    before = cpu.usage(server_pid) if server_pid else None
    result = run_wrk(url, objects, seconds, settings.wrk_connections,
                     settings.wrk_threads, bench.work / "logs" / f"{label}.log")
    if server_pid and before:
        # The server's CPU per GiB it sent: what a hit costs the node.
        delivered = (result["requests"] - result["errors"]["status"]) * result["range_bytes"]
        result["server_cpu_per_gib"] = (cpu.usage(server_pid) - before).per_gib(delivered)
    print(f"  {label}: {result['requests_per_s']} req/s, {result['mb_per_s']} MB/s, "
          f"p99 {result['latency_ms']['p99']} ms", file=sys.stderr, flush=True)
    return result
