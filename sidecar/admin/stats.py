"""`GET /api/v1/stats` and `sidecar stats`: the hit-rate summary.

Computed from the one metrics registry, so there is no second set of counters
to drift from what Prometheus scrapes. Keys are only ever added: `sidecar stats`,
the replay client, the benchmarks and older scripts read the ones already here.
The admin port adds the time, the mode, the windowed rates (`window`), the
recent warm calls and, when asked, the history behind /ui's charts.
"""

from __future__ import annotations

from typing import Any

from sidecar.model import LANES
from sidecar.telemetry.metrics import (
    BREAKER_STATES,
    DISK_OPS,
    EVICTION_REASONS,
    MEMORY_TIER_SERIES,
    ORIGIN_OUTCOMES,
    PREFETCH_OUTCOMES,
    WARM_OUTCOMES,
    Metrics,
    MetricsReading,
)


def stats_snapshot(metrics: Metrics | MetricsReading) -> dict[str, Any]:
    """The hit-rate summary, computed from the one registry (no second set of counters).

    Given a reading, every figure comes from that one instant."""
    if isinstance(metrics, Metrics):
        metrics = metrics.read()
    hits = metrics.value("sidecar_cache_lookups_total", {"result": "hit"})
    misses = metrics.value("sidecar_cache_lookups_total", {"result": "miss"})
    from_cache = metrics.value("sidecar_served_bytes_total", {"source": "cache"})
    from_origin = metrics.value("sidecar_served_bytes_total", {"source": "origin"})
    origin_by_lane = {
        lane: int(metrics.value("sidecar_origin_bytes_total", {"lane": lane})) for lane in LANES
    }
    issued, used, wasted = (
        metrics.value("sidecar_prefetch_blocks_total", {"outcome": outcome})
        for outcome in PREFETCH_OUTCOMES
    )
    evictions = {
        reason: int(metrics.value("sidecar_cache_evictions_total", {"reason": reason}))
        for reason in EVICTION_REASONS
    }
    lookups = hits + misses
    served = from_cache + from_origin
    return {
        "hits": int(hits),
        "misses": int(misses),
        "block_hit_ratio": hits / lookups if lookups else None,
        "byte_hit_ratio": from_cache / served if served else None,
        "served_bytes": {"cache": int(from_cache), "origin": int(from_origin)},
        "origin_bytes": sum(origin_by_lane.values()),
        "origin": {
            "bytes": origin_by_lane,
            "requests": {
                outcome: int(metrics.total("sidecar_origin_requests_total", outcome=outcome))
                for outcome in ORIGIN_OUTCOMES
            },
            "requests_by_lane": {
                lane: {
                    outcome: int(metrics.value("sidecar_origin_requests_total",
                                               {"lane": lane, "outcome": outcome}))
                    for outcome in ORIGIN_OUTCOMES
                }
                for lane in LANES
            },
            "ratelimit_wait_seconds": {
                lane: metrics.value("sidecar_ratelimit_wait_seconds_total", {"lane": lane})
                for lane in LANES
            },
            "breaker": {
                "state": next((state for state in BREAKER_STATES if metrics.value(
                    "sidecar_origin_breaker_state", {"state": state})), "closed"),
                "rejected": int(metrics.value("sidecar_origin_breaker_rejected_total")),
            },
        },
        "requests": int(metrics.total("sidecar_requests_total")),
        "prefetch": {
            "issued": int(issued), "used": int(used), "wasted": int(wasted),
            # Of the prefetched blocks whose fate is known, the share a reader took.
            "accuracy": used / (used + wasted) if used + wasted else None,
        },
        "cache": {
            "used_bytes": int(metrics.value("sidecar_cache_used_bytes")),
            "capacity_bytes": int(metrics.value("sidecar_cache_capacity_bytes")),
            "blocks": int(metrics.value("sidecar_cache_blocks")),
            "protected_blocks": int(metrics.value("sidecar_cache_protected_blocks")),
            "evictions": sum(evictions.values()),
            "evictions_by_reason": evictions,
            "checksum_failures": int(metrics.value("sidecar_cache_checksum_failures_total")),
            "disk_errors": {
                op: int(metrics.value("sidecar_cache_disk_errors_total", {"op": op}))
                for op in DISK_OPS
            },
        },
        "warm_blocks": {
            outcome: int(metrics.value("sidecar_warm_blocks_total", {"outcome": outcome}))
            for outcome in WARM_OUTCOMES
        },
        "memory_tier": memory_tier_snapshot(metrics),
    }


def memory_tier_snapshot(metrics: MetricsReading) -> dict[str, Any]:
    """The memory tier's size, use and counts (sidecar_memory_tier_*), and the
    share of its lookups it answered."""
    figures = {
        name: int(metrics.value(f"sidecar_memory_tier_{name}" + ("_total" if counter else "")))
        for name, _, counter in MEMORY_TIER_SERIES
    }
    lookups = figures["hits"] + figures["misses"]
    return {**figures, "hit_ratio": figures["hits"] / lookups if lookups else None}
