"""Scenario `isolation` (issue 4): does the sidecar leave the rest of the node alone?

a. CPU: a latency-sensitive process (bench/probe.py: 1 ms sleeps, wake-up
   lateness, like cyclictest) pinned to CPU 0, measured
   - idle (nothing of the benchmark running),
   - while the sidecar, started with `--cpus 1`, runs a cold four-partition
     replay at full speed, with the origin emulator and the replay client under
     `taskset -c 1` (so all the benchmark's load is on CPU 1),
   - the same with nothing pinned (sidecar, nginx and replay float over both
     CPUs; the probe stays on CPU 0): the contrast,
   - idle again, to show the machine did not change under us.
   Target: p99 lateness, pinned replay / idle <= 1.2x. A window in which
   processes outside the benchmark used CPU is measured again (bounded; see
   FOREIGN_QUIET): on a shared machine it measures someone else's load.

b. Origin lanes: foreground miss latency through a sidecar with
   `--origin-bandwidth 200MiB/s` (the warm lane gets SIDECAR_WARM_SHARE, default
   0.4): ~20 `GET bytes=X-(X+1MiB-1)` at 8 MiB-aligned X in segments that are
   not warmed (each a block nobody fetched), one at a time on a new connection,
   first idle, then while one `POST /api/v1/warm` of the other partitions runs.
   Target: p50, under warm-up / idle <= 1.5x.
"""

from __future__ import annotations

import http.client
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.clients import head
from bench.dataset import StoredObject
from bench.harness import Bench
from bench.probe import (
    Probe,
    affinity_of,
    foreign_cpu,
    group_affinity,
    percentiles,
    read_process_times,
)
from bench.sidecar_server import SidecarServer, stats_delta
from bench.signing import presigned_path
from bench.warmup import LaneSampler, lane_window

SCENARIO = "isolation"
MiB = 1024 * 1024
BLOCK = 8 * MiB  # the sidecar's default block size
RANGE = MiB
#: A probe window counts as undisturbed when processes outside the benchmark
#: used at most this much CPU (in cores) meanwhile; otherwise it is measured
#: again (IDLE_ATTEMPTS, LOADED_ATTEMPTS in all) after RETRY_PAUSE_S, and the
#: least disturbed attempt is kept, marked as such.
FOREIGN_QUIET = 0.05
IDLE_ATTEMPTS = 3
LOADED_ATTEMPTS = 2
RETRY_PAUSE_S = 3.0
SETTLE_S = 1.0
MISS_GAP_S = 0.05
WARM_TTL_S = 3600


# --- a. CPU isolation ----------------------------------------------------------------


def _probe_log(bench: Bench, label: str) -> Path:
    return bench.work / "logs" / f"{label}.log"


def _foreign(result: dict[str, Any]) -> float:
    return float((result.get("foreign_cpu") or {}).get("cores") or 0.0)


def _least_disturbed(label: str, attempts: int,
                     measure: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """Measure until a window is undisturbed (bounded); the least disturbed one."""
    tried: list[dict[str, Any]] = []
    for attempt in range(attempts):
        if attempt:
            time.sleep(RETRY_PAUSE_S)
        run = measure(attempt)
        tried.append(run)
        foreign = _foreign(run["probe"])
        print(f"  {label}: probe p99 {run['probe']['lateness_us']['p99']} us; other processes "
              f"used {foreign:.2f} cores meanwhile"
              + ("" if foreign <= FOREIGN_QUIET else " (disturbed)"), file=sys.stderr,
              flush=True)
        if foreign <= FOREIGN_QUIET:
            break
    best = min(tried, key=lambda run: _foreign(run["probe"]))
    best["attempts"] = len(tried)
    best["attempts_foreign_cores"] = [_foreign(run["probe"]) for run in tried]
    best["undisturbed"] = _foreign(best["probe"]) <= FOREIGN_QUIET
    return best


def measure_idle(bench: Bench, label: str) -> dict[str, Any]:
    """The probe alone, nothing of the benchmark running."""
    settings = bench.settings

    def once(attempt: int) -> dict[str, Any]:
        probe = Probe(settings.probe_cpu, settings.probe_idle_seconds + 30,
                      _probe_log(bench, f"{label}-{attempt}")).start()
        try:
            time.sleep(settings.probe_idle_seconds)
        finally:
            result = probe.stop()
        return {"kind": "probe", "condition": "idle", "probe": result}

    return _least_disturbed(label, IDLE_ATTEMPTS, once)


def measure_loaded(bench: Bench, pinned: bool) -> dict[str, Any]:
    """The probe while the sidecar serves a cold replay of every partition."""
    settings = bench.settings
    load = str(settings.load_cpu) if pinned else None
    name = "pinned" if pinned else "unpinned"
    extra = ("--cpus", load) if load else ()
    timeout = 600.0 + bench.dataset.total_bytes / 1e6

    def once(attempt: int) -> dict[str, Any]:
        label = f"isolation-{name}-{attempt}"
        with bench.origin(label, cpus=load) as origin, \
                bench.sidecar(origin, extra=extra) as sidecar:
            time.sleep(SETTLE_S)  # start-up (slab preallocation) is not what is measured
            probe = Probe(settings.probe_cpu, timeout, _probe_log(bench, f"{label}-probe"))
            probe.start()
            try:
                replay = bench.replay(f"{label}-replay", sidecar.data_url, "all",
                                      settings.concurrency_4p, origin, sidecar, cpus=load)
                affinity = {"sidecar": affinity_of(sidecar.pid),
                            "origin": group_affinity(origin.pid)}
            finally:
                result = probe.stop()
        return {
            "kind": "probe", "condition": f"cold replay, {name}", "pinned": pinned,
            "load_cpus": load, "sidecar_flags": list(extra), "affinity": affinity,
            "probe": result, "replay": replay,
        }

    return _least_disturbed(f"isolation-{name}", LOADED_ATTEMPTS, once)


# --- b. foreground misses under warm-up ------------------------------------------------


def timed_get(url: str, path: str, start: int, length: int) -> dict[str, Any]:
    """One ranged GET on a new connection: time to headers, to the last byte, the body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                            timeout=60)
    try:
        began = time.perf_counter()
        connection.request("GET", path, headers={"Range": f"bytes={start}-{start + length - 1}"})
        response = connection.getresponse()
        first = time.perf_counter() - began
        body = response.read()
        total = time.perf_counter() - began
        return {"status": response.status, "first_byte_ms": first * 1000,
                "total_ms": total * 1000, "cache": response.getheader("x-sidecar-cache"),
                "body": body}
    finally:
        connection.close()


def miss_positions(objects: list[StoredObject], count: int
                   ) -> tuple[list[tuple[StoredObject, int]], list[tuple[StoredObject, int]]]:
    """Two equal sets of 8 MiB-aligned positions, one block each, none shared.

    Every segment gives blocks to both sets (alternately), and each set reads
    them from the last block down, segment after segment in turn: requests
    that never continue one another, so read-ahead has no stream to follow and
    each one is a foreground miss of a block nobody fetched.
    """
    sets: tuple[list[tuple[StoredObject, int]], list[tuple[StoredObject, int]]] = ([], [])
    for index, item in enumerate(sorted(objects, key=lambda entry: entry.key)):
        for block in range((item.size + BLOCK - 1) // BLOCK):
            if block * BLOCK + RANGE <= item.size:
                sets[(block + index) % 2].append((item, block * BLOCK))
    idle, loaded = (sorted(found, key=lambda entry: (-entry[1], entry[0].key)) for found in sets)
    count = min(count, len(idle), len(loaded))
    return idle[:count], loaded[:count]


def _misses(bench: Bench, url: str, positions: list[tuple[StoredObject, int]],
            sidecar: SidecarServer | None, during: threading.Thread | None = None,
            ) -> dict[str, Any]:
    """Timed GETs at `positions` through `url` (the sidecar, or the origin for reference)."""
    bucket = bench.dataset.spec.bucket
    samples: list[dict[str, Any]] = []
    before = sidecar.stats() if sidecar else None
    processes = read_process_times()
    began = time.monotonic()
    for item, start in positions:
        # Signed, as the plugin's requests are (the origin ignores the query).
        head(url, presigned_path(url, bucket, item.key, "HEAD"))  # metadata known: the
        result = timed_get(url, presigned_path(url, bucket, item.key), start, RANGE)  # GET
        # times the block only
        body = result.pop("body")
        with open(bench.dataset.path(item.key), "rb") as source:
            source.seek(start)
            correct = body == source.read(RANGE)
        samples.append({
            "key": item.key, "start": start, **{k: round(v, 3) if isinstance(v, float) else v
                                                for k, v in result.items()},
            "correct": correct, "under_load": during.is_alive() if during else None,
        })
        time.sleep(MISS_GAP_S)
    foreign = foreign_cpu(processes, read_process_times(), os.getpid(),
                          time.monotonic() - began)
    # Under load: those that ended before the warm-up did; and only real misses.
    counted = [s for s in samples if s["under_load"] is not False
               and (sidecar is None or s["cache"] == "miss")]
    return {
        "requests": len(samples),
        "counted": len(counted),
        "after_warm_up": sum(1 for s in samples if s["under_load"] is False),
        "foreign_cpu": foreign,
        "total_ms": percentiles([s["total_ms"] for s in counted]),
        "first_byte_ms": percentiles([s["first_byte_ms"] for s in counted]),
        "bad": sum(1 for s in samples if s["status"] != 206 or not s["correct"]),
        "cache_header": {value: sum(1 for s in samples if s["cache"] == value)
                         for value in sorted({str(s["cache"]) for s in samples})},
        "sidecar": stats_delta(before, sidecar.stats()) if sidecar and before else None,
        "samples": samples,
    }


def measure_misses(bench: Bench) -> dict[str, Any]:
    settings = bench.settings
    spec = bench.dataset.spec
    half = max(1, spec.partitions // 2)
    warmed = [item for item in bench.dataset.objects if item.partition < half]
    cold = [item for item in bench.dataset.objects if item.partition >= half]
    idle_at, loaded_at = miss_positions(cold, settings.miss_samples)
    if not idle_at:
        raise RuntimeError("the data set has no segment left out of the warm-up to miss on")
    extra = ("--origin-bandwidth", settings.miss_bandwidth)
    warm_bytes = sum(item.size for item in warmed)
    with bench.origin("isolation-misses") as origin, \
            bench.sidecar(origin, extra=extra) as sidecar:
        time.sleep(SETTLE_S)
        # Reference: the same ranges straight from the origin (a 1 MiB GET, no block).
        direct = _misses(bench, origin.url, idle_at, None)
        idle = _misses(bench, sidecar.data_url, idle_at, sidecar)
        print(f"  isolation-misses: idle p50 {idle['total_ms']['p50']} ms, p99 "
              f"{idle['total_ms']['p99']} ms", file=sys.stderr, flush=True)

        answer: dict[str, Any] = {}
        objects = [{"bucket": spec.bucket, "key": item.key, "start": 0, "end": None}
                   for item in warmed]

        def warm() -> None:
            began = time.monotonic()
            try:
                answer["answer"] = sidecar.warm(objects, WARM_TTL_S,
                                                timeout_s=120.0 + warm_bytes / 2**20)
            except (OSError, RuntimeError, ValueError) as exc:
                answer["error"] = str(exc)
            answer["seconds"] = round(time.monotonic() - began, 3)

        bytes_before = sidecar.lane_samples()
        thread = threading.Thread(target=warm, name="warm-call", daemon=True)
        with LaneSampler(sidecar, "warm") as sampler:
            thread.start()
            deadline = time.monotonic() + 30
            while sampler.first_move() is None and thread.is_alive() and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
            loaded = _misses(bench, sidecar.data_url, loaded_at, sidecar, during=thread)
            thread.join(timeout=120.0 + warm_bytes / 2**20)
        if thread.is_alive():
            raise RuntimeError("the warm-up call did not return")
        if "error" in answer:
            raise RuntimeError(f"the warm-up call failed: {answer['error']}")
        lanes_after = sidecar.lane_samples()
    print(f"  isolation-misses: under warm-up p50 {loaded['total_ms']['p50']} ms, p99 "
          f"{loaded['total_ms']['p99']} ms ({loaded['counted']} of {loaded['requests']} "
          "during the warm-up)", file=sys.stderr, flush=True)
    return {
        "kind": "misses", "origin_bandwidth": settings.miss_bandwidth,
        "warm_share": os.environ.get("SIDECAR_WARM_SHARE", "0.4 (default)"),
        "range_bytes": RANGE, "block_bytes": BLOCK,
        "origin_direct": direct, "idle": idle, "loaded": loaded,
        "warm": {
            "segments": len(warmed), "bytes": warm_bytes, **answer,
            "lane": lane_window(sampler.samples),
            "origin_bytes_by_lane": {lane: lanes_after[lane] - bytes_before.get(lane, 0.0)
                                     for lane in lanes_after},
        },
    }


def run_isolation(bench: Bench) -> None:
    settings = bench.settings
    cpus = sorted(os.sched_getaffinity(0))
    info = bench.scenarios.setdefault(SCENARIO, {"runs": {}})
    info.update({
        "probe_cpu": settings.probe_cpu, "load_cpu": settings.load_cpu,
        "probe_idle_seconds": settings.probe_idle_seconds, "probe_interval_us": 1000,
        "partitions": "all", "concurrency": settings.concurrency_4p,
        "bytes": bench.dataset.total_bytes, "miss_samples": settings.miss_samples,
        "cpus_available": cpus,
    })
    print(f"{SCENARIO}: latency probe on CPU {settings.probe_cpu}, load on CPU "
          f"{settings.load_cpu}; then foreground misses under warm-up", file=sys.stderr,
          flush=True)
    if not {settings.probe_cpu, settings.load_cpu} <= set(cpus) or \
            settings.probe_cpu == settings.load_cpu:
        bench.errors.append({"scenario": SCENARIO, "run": "*", "error":
                             f"needs CPUs {settings.probe_cpu} and {settings.load_cpu}; "
                             f"this process may use {cpus}"})
    else:
        bench.attempt(SCENARIO, "idle", lambda: measure_idle(bench, "isolation-idle"))
        bench.attempt(SCENARIO, "pinned", lambda: measure_loaded(bench, pinned=True))
        bench.attempt(SCENARIO, "unpinned", lambda: measure_loaded(bench, pinned=False))
        bench.attempt(SCENARIO, "idle_after",
                      lambda: measure_idle(bench, "isolation-idle-after"))
    bench.attempt(SCENARIO, "misses", lambda: measure_misses(bench))

