"""cold-1p: one partition, one stream, cold.

The origin direct, nginx slice cold (and with proxy_cache_lock, for
reference) and the sidecar cold, each through fresh servers and empty caches.
"""

from __future__ import annotations

import sys
from typing import Any

from bench.harness import Bench

SCENARIO = "cold-1p"


def run_cold_1p(bench: Bench) -> None:
    partition = "0"
    bench.scenarios[SCENARIO] = {
        "partitions": partition, "concurrency": 1,
        "bytes": bench.dataset.partition_bytes(0), "runs": {},
    }
    print(f"{SCENARIO}: one partition, one stream, cold", file=sys.stderr, flush=True)

    def direct() -> dict[str, Any]:
        with bench.origin("direct-1p") as origin:
            return bench.replay("cold-1p-origin", origin.url, partition, 1, origin)

    def slice_cold() -> dict[str, Any]:
        with bench.origin("slice-1p") as origin, bench.slice_cache(origin) as cache:
            return bench.replay("cold-1p-nginx-slice", cache.url, partition, 1, origin)

    def slice_lock_cold() -> dict[str, Any]:
        with bench.origin("slice-lock-1p") as origin, \
                bench.slice_cache(origin, cache_lock=True) as cache:
            return bench.replay("cold-1p-nginx-slice-lock", cache.url, partition, 1, origin)

    def sidecar_cold() -> dict[str, Any]:
        with bench.origin("sidecar-1p") as origin, bench.sidecar(origin) as sidecar:
            return bench.replay("cold-1p-sidecar", sidecar.data_url, partition, 1, origin,
                                sidecar)

    bench.attempt(SCENARIO, "origin", direct)
    bench.attempt(SCENARIO, "nginx_slice_cold", slice_cold)
    bench.attempt(SCENARIO, "nginx_slice_lock_cold", slice_lock_cold)
    bench.attempt(SCENARIO, "sidecar_cold", sidecar_cold)
