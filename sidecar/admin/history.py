"""The admin port's memory of the recent past: a bounded ring of counter samples,
and the rates between two of them (the charts of /ui, the `window` of the stats).

Counters since start hide what happens now: after an hour of hits, a collapse of
the hit ratio barely moves the cumulative figure. So the admin port reads the
counters every few seconds into a `Sample` (a flat array of ~80 floats) and
keeps the last `capacity` of them, with the rates since the sample before (the
charts' points, flat too): about 1.4 KiB a sample, memory fixed by the capacity
whatever the uptime. The tiles' window is computed when asked, between the
newest reading and the sample a minute older.

Nothing here reads a clock: the sampler (sidecar.admin.port) hands the times in.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.model import LANES
from sidecar.telemetry.metrics import (
    DISK_OPS,
    EVICTION_REASONS,
    LATENCY_BUCKETS,
    ORIGIN_OUTCOMES,
    PREFETCH_OUTCOMES,
    REQUEST_CACHE_RESULTS,
    WARM_OUTCOMES,
    MetricsReading,
)

# Counters kept per label value: (field prefix, metric sample name, label, label values).
# Each is summed over any other label (origin requests over the lanes, for instance).
_LABELLED_COUNTERS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("served", "sidecar_served_bytes_total", "source", ("cache", "origin")),
    ("lookups", "sidecar_cache_lookups_total", "result", ("hit", "miss")),
    ("origin_bytes", "sidecar_origin_bytes_total", "lane", LANES),
    ("origin_requests", "sidecar_origin_requests_total", "outcome", ORIGIN_OUTCOMES),
    ("ratelimit_wait", "sidecar_ratelimit_wait_seconds_total", "lane", LANES),
    ("evictions", "sidecar_cache_evictions_total", "reason", EVICTION_REASONS),
    ("warm_blocks", "sidecar_warm_blocks_total", "outcome", WARM_OUTCOMES),
    ("prefetch_blocks", "sidecar_prefetch_blocks_total", "outcome", PREFETCH_OUTCOMES),
    ("disk_errors", "sidecar_cache_disk_errors_total", "op", DISK_OPS),
)
# Values without labels: counters, and gauges whose latest value a chart shows.
_PLAIN = (
    ("checksum_failures", "sidecar_cache_checksum_failures_total"),
    ("breaker_rejected", "sidecar_origin_breaker_rejected_total"),
    ("cache_used", "sidecar_cache_used_bytes"),
    ("cache_capacity", "sidecar_cache_capacity_bytes"),
)
REQUEST_DURATION = "sidecar_request_duration_seconds"
# Upper bounds of the request latency buckets, +inf last (Prometheus' `le`).
LATENCY_BOUNDS = (*LATENCY_BUCKETS, math.inf)

FIELDS: tuple[str, ...] = (
    *(f"{prefix}.{value}" for prefix, _, _, values in _LABELLED_COUNTERS for value in values),
    *(field for field, _ in _PLAIN),
    # Cumulative bucket counts of client requests with a body, by how the cache served them.
    *(f"latency.{cache}.{i}" for cache in REQUEST_CACHE_RESULTS
      for i in range(len(LATENCY_BOUNDS))),
)
FIELD_INDEX = {field: i for i, field in enumerate(FIELDS)}


@dataclass(frozen=True, slots=True)
class Sample:
    """Every counter the page plots, read at one instant."""

    wall: float  # time.time(): the charts' time axis
    mono: float  # time.monotonic(): spans between samples, immune to clock steps
    values: array[float]  # by FIELD_INDEX

    def __getitem__(self, field: str) -> float:
        return self.values[FIELD_INDEX[field]]


def take_sample(reading: MetricsReading, wall: float, mono: float) -> Sample:
    values = array("d", bytes(8 * len(FIELDS)))
    for prefix, name, label, label_values in _LABELLED_COUNTERS:
        for value in label_values:
            values[FIELD_INDEX[f"{prefix}.{value}"]] = reading.total(name, **{label: value})
    for field, name in _PLAIN:
        values[FIELD_INDEX[field]] = reading.value(name)
    for cache in REQUEST_CACHE_RESULTS:
        counts = reading.buckets(REQUEST_DURATION, cache=cache)
        for i, bound in enumerate(LATENCY_BOUNDS):
            values[FIELD_INDEX[f"latency.{cache}.{i}"]] = counts.get(bound, 0.0)
    return Sample(wall, mono, values)


def quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The q-quantile of a histogram, as Prometheus' histogram_quantile estimates it.

    `cumulative[i]` counts the observations <= `bounds[i]`; the last bound is +inf.
    The quantile is interpolated linearly inside the bucket it falls in (the first
    bucket starts at 0); one in the +inf bucket is the largest finite bound. None
    without observations."""
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    below = 0.0
    for i, (bound, count) in enumerate(zip(bounds, cumulative, strict=True)):
        if count >= rank and count > below:
            if math.isinf(bound):
                return bounds[i - 1] if i else None
            lower = bounds[i - 1] if i else 0.0
            return lower + (bound - lower) * (rank - below) / (count - below)
        below = count
    return None


def _significant(value: float) -> float:
    """Nine significant digits (byte rates to the byte up to 1 GB/s): the JSON of
    a long history stays small, where a float's repr takes up to 17."""
    return float(f"{value:.9g}") if value else 0.0


def rates(older: Sample, newer: Sample) -> dict[str, Any] | None:
    """What happened between two samples, per second and as ratios; None when they
    span no time. Ratios and latencies are None where nothing was read."""
    seconds = newer.mono - older.mono
    if seconds <= 0:
        return None

    def delta(field: str) -> float:
        # Counters only grow in one process; max() keeps a wrapped float from
        # showing as a negative rate.
        return max(0.0, newer[field] - older[field])

    def per_second(prefix: str, keys: Sequence[str]) -> dict[str, float]:
        return {key: _significant(delta(f"{prefix}.{key}") / seconds) for key in keys}

    def ratio(part: float, whole: float) -> float | None:
        return _significant(part / whole) if whole > 0 else None

    width = len(LATENCY_BOUNDS)
    # The span's count in each bucket, by how the cache served the request.
    span_buckets: dict[str, list[float]] = {}
    for cache in REQUEST_CACHE_RESULTS:
        first = FIELD_INDEX[f"latency.{cache}.0"]
        span_buckets[cache] = [max(0.0, new - old) for new, old in zip(
            newer.values[first:first + width], older.values[first:first + width], strict=True)]

    def latency(q: float, *caches: str) -> float | None:
        if not any(span_buckets[c][-1] for c in caches):
            return None  # a quiet span, the most common one: no work
        counts = [sum(column) for column in zip(*(span_buckets[c] for c in caches), strict=True)]
        # Cumulative counts never fall from one bound to the next.
        for i in range(1, width):
            counts[i] = max(counts[i], counts[i - 1])
        value = quantile(q, LATENCY_BOUNDS, counts)
        return None if value is None else _significant(value)

    requests = sum(span_buckets[cache][-1] for cache in REQUEST_CACHE_RESULTS)
    hits, misses = delta("lookups.hit"), delta("lookups.miss")
    from_cache, from_origin = delta("served.cache"), delta("served.origin")
    served_as = REQUEST_CACHE_RESULTS  # hit, partial, miss
    return {
        "seconds": _significant(seconds),
        "hit_ratio": {"byte": ratio(from_cache, from_cache + from_origin),
                      "block": ratio(hits, hits + misses)},
        "served_bytes_per_s": per_second("served", ("cache", "origin")),
        "origin_bytes_per_s": per_second("origin_bytes", LANES),
        "origin_requests_per_s": per_second("origin_requests", ORIGIN_OUTCOMES),
        "latency_s": {
            "p50": latency(0.5, *served_as),
            "p99": latency(0.99, *served_as),
            "hit_p99": latency(0.99, "hit"),
            # A request any of whose blocks came from the origin.
            "miss_p99": latency(0.99, "partial", "miss"),
            "requests_per_s": _significant(requests / seconds),
        },
        # Seconds spent waiting per second: the average number of origin reads
        # held back by the bandwidth budget.
        "ratelimit_wait_s_per_s": per_second("ratelimit_wait", LANES),
        "evictions_per_s": per_second("evictions", EVICTION_REASONS),
        "warm_blocks_per_s": per_second("warm_blocks", WARM_OUTCOMES),
        "prefetch_blocks_per_s": per_second("prefetch_blocks", PREFETCH_OUTCOMES),
        "disk_errors_per_s": per_second("disk_errors", DISK_OPS),
        "checksum_failures_per_s": _significant(delta("checksum_failures") / seconds),
        "breaker_rejected_per_s": _significant(delta("breaker_rejected") / seconds),
        # Gauges: their value at the end of the span.
        "cache_bytes": {"used": newer["cache_used"], "capacity": newer["cache_capacity"]},
    }


def _leaves(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()
            ) -> list[tuple[tuple[str, ...], Any]]:
    """(path, value) of every leaf, depth first in the tree's own order."""
    leaves: list[tuple[tuple[str, ...], Any]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            leaves.extend(_leaves(value, (*prefix, key)))
        else:
            leaves.append(((*prefix, key), value))
    return leaves


_QUIET = array("d", bytes(8 * len(FIELDS)))
# Where each figure of a point sits in its flat form: rates' own shape, read once.
POINT_PATHS = tuple(path for path, _ in _leaves(
    rates(Sample(0.0, 0.0, _QUIET), Sample(1.0, 1.0, _QUIET)) or {}))


def flatten(point: Mapping[str, Any]) -> array[float]:
    """A point as POINT_PATHS floats (NaN for None): a fifth of the dict's memory."""
    return array("d", (math.nan if value is None else value for _, value in _leaves(point)))


def columns(points: Sequence[array[float]]) -> dict[str, Any]:
    """Flat points as one nested dict of lists, in rates' shape (None for NaN): each
    name is sent once however long the history."""
    if not points:
        return {}
    tree: dict[str, Any] = {}
    for i, path in enumerate(POINT_PATHS):
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        # NaN is the one value not equal to itself.
        node[path[-1]] = [None if v != v else v for v in (point[i] for point in points)]
    return tree


class SampleRing:
    """The last `capacity` samples, taken every `interval_s` by the admin port, and
    the rates between each and the one before it (the charts' points).

    A point is computed once, when its sample arrives, and kept flat: a page
    loading the whole history costs a copy into lists, not 450 sets of rates on
    the event loop."""

    def __init__(self, capacity: int, interval_s: float, started: float) -> None:
        self.capacity = capacity
        self.interval_s = interval_s
        self.started = started  # wall-clock time of the first sample: a page seeing it
        # change knows the sidecar restarted and its history with it
        self._samples: deque[Sample] = deque(maxlen=capacity)
        self._points: deque[tuple[float, array[float]]] = deque(maxlen=capacity)
        self._newest_time = started  # the chart time of the newest sample

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> None:
        # A point's time is the wall clock's, but never earlier than the sample
        # before's plus the monotonic span between them: a clock stepped back
        # (NTP, a resumed VM) would otherwise stamp new points before the newest
        # one a page holds, which asks only for points after it (`since`), and
        # run its time axis backwards. Once the wall clock is ahead again, the
        # points follow it.
        when = sample.wall
        if self._samples:
            previous = self._samples[-1]
            when = max(when, self._newest_time + max(0.0, sample.mono - previous.mono))
            point = rates(previous, sample)
            if point is not None:
                self._points.append((when, flatten(point)))
        self._newest_time = when
        self._samples.append(sample)

    def window(self, now: Sample, seconds: float) -> dict[str, Any] | None:
        """Rates from the newest sample at least `seconds` before `now` (or the
        oldest one, early after start) up to `now`; None without samples."""
        if not self._samples:
            return None
        start = next((sample for sample in reversed(self._samples)
                      if sample.mono <= now.mono - seconds), self._samples[0])
        return rates(start, now)

    def history(self, since: float | None = None) -> dict[str, Any]:
        """The points whose span ends after `since` (None: all), oldest first, as
        columns. Times are wall-clock seconds that never go back (see `add`)."""
        kept = [(wall, point) for wall, point in self._points if since is None or wall > since]
        return {"interval_s": self.interval_s, "capacity": self.capacity,
                "started": self.started, "time": [wall for wall, _ in kept],
                "series": columns([point for _, point in kept])}
