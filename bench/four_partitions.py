"""cold-4p and warm-replay: every partition at once, cold, then again warm.

cold-4p replays the four partitions at once through the origin direct, nginx
slice (cold, then the same replay again: its warm row), nginx slice with
proxy_cache_lock, and the sidecar cold. warm-replay is the same replay again
against that sidecar, and warm-ranges (bench/warm_ranges.py) reads the same
warm sidecar; run without cold-4p, they warm a fresh sidecar with one replay
first, recorded as a warm-up.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any

from bench.harness import Bench
from bench.nginx import NginxServer
from bench.sidecar_server import SidecarServer
from bench.warm_ranges import run_warm_ranges

#: The scenarios this module runs, in their order, all on one sidecar.
NAMES = ("cold-4p", "warm-replay", "warm-ranges")


def run_four_partitions(bench: Bench, selected: set[str]) -> None:
    if "cold-4p" in selected:
        _cold_baselines(bench)
    if not selected.intersection(NAMES):
        return
    concurrency = bench.settings.concurrency_4p
    with ExitStack() as stack:
        try:
            origin = stack.enter_context(bench.origin("sidecar-4p"))
            sidecar = stack.enter_context(bench.sidecar(origin))
        except RuntimeError as exc:
            bench.errors.append({"scenario": "cold-4p", "run": "sidecar_cold",
                                 "error": str(exc)})
            return
        if "cold-4p" in selected:
            bench.attempt("cold-4p", "sidecar_cold", lambda: bench.replay(
                "cold-4p-sidecar", sidecar.data_url, "all", concurrency, origin, sidecar))
        else:
            bench.attempt("warm-up", "sidecar", lambda: bench.replay(
                "warm-up-sidecar", sidecar.data_url, "all", concurrency, origin, sidecar))
        if "warm-replay" in selected:
            _warm_replay(bench, origin, sidecar)
        if "warm-ranges" in selected:
            run_warm_ranges(bench, sidecar)


def _cold_baselines(bench: Bench) -> None:
    """cold-4p's rows but the sidecar's: the origin direct and nginx slice."""
    scenario = "cold-4p"
    concurrency = bench.settings.concurrency_4p
    bench.scenarios[scenario] = {
        "partitions": "all", "concurrency": concurrency,
        "bytes": bench.dataset.total_bytes, "runs": {},
    }
    print(f"{scenario}: {bench.dataset.spec.partitions} partitions at once, cold",
          file=sys.stderr, flush=True)

    def direct() -> dict[str, Any]:
        with bench.origin("direct-4p") as origin:
            return bench.replay("cold-4p-origin", origin.url, "all", concurrency, origin)

    bench.attempt(scenario, "origin", direct)
    with ExitStack() as stack:
        try:
            origin = stack.enter_context(bench.origin("slice-4p"))
            cache = stack.enter_context(bench.slice_cache(origin))
        except RuntimeError as exc:
            bench.errors.append({"scenario": scenario, "run": "nginx_slice",
                                 "error": str(exc)})
        else:
            bench.attempt(scenario, "nginx_slice_cold", lambda: bench.replay(
                "cold-4p-nginx-slice", cache.url, "all", concurrency, origin))
            bench.attempt(scenario, "nginx_slice_warm", lambda: bench.replay(
                "warm-4p-nginx-slice", cache.url, "all", concurrency, origin))

    def slice_lock_cold() -> dict[str, Any]:
        with bench.origin("slice-lock-4p") as origin, \
                bench.slice_cache(origin, cache_lock=True) as cache:
            return bench.replay("cold-4p-nginx-slice-lock", cache.url, "all",
                                concurrency, origin)

    bench.attempt(scenario, "nginx_slice_lock_cold", slice_lock_cold)


def _warm_replay(bench: Bench, origin: NginxServer, sidecar: SidecarServer) -> None:
    concurrency = bench.settings.concurrency_4p
    bench.scenarios.setdefault("warm-replay", {}).update({
        "partitions": "all", "concurrency": concurrency,
        "bytes": bench.dataset.total_bytes})
    print("warm-replay: the same replay against the warm sidecar", file=sys.stderr, flush=True)
    bench.attempt("warm-replay", "sidecar_warm", lambda: bench.replay(
        "warm-4p-sidecar", sidecar.data_url, "all", concurrency, origin, sidecar))
