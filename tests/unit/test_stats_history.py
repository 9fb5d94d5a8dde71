"""The ring of counter samples behind /ui's charts and the stats' `window`:
rates between samples, latency percentiles from histogram buckets, bounded memory."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admin.history import (
    FIELDS,
    LATENCY_BOUNDS,
    POINT_PATHS,
    Sample,
    SampleRing,
    columns,
    flatten,
    quantile,
    rates,
    take_sample,
)
from sidecar.telemetry.metrics import Metrics

MIB = 2**20


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    bounds = (0.001, 0.01, 0.1, math.inf)
    # 10 observations <= 1 ms, 10 more <= 10 ms, none slower.
    cumulative = (10.0, 20.0, 20.0, 20.0)
    assert quantile(0.5, bounds, cumulative) == pytest.approx(0.001)
    # Rank 15 is half-way through the second bucket: half-way from 1 ms to 10 ms.
    assert quantile(0.75, bounds, cumulative) == pytest.approx(0.0055)
    # The first bucket starts at zero.
    assert quantile(0.25, bounds, cumulative) == pytest.approx(0.0005)


def test_quantile_in_the_open_bucket_is_the_largest_bound_and_none_without_data() -> None:
    bounds = (0.001, 0.01, math.inf)
    assert quantile(0.99, bounds, (0.0, 1.0, 100.0)) == 0.01
    assert quantile(0.5, bounds, (0.0, 0.0, 0.0)) is None
    assert quantile(0.5, (math.inf,), (5.0,)) is None


def test_quantile_skips_empty_buckets() -> None:
    bounds = (0.001, 0.01, 0.1, 1.0, math.inf)
    cumulative = (0.0, 0.0, 0.0, 4.0, 4.0)
    assert quantile(0.5, bounds, cumulative) == pytest.approx(0.1 + 0.9 * 0.5)


def sample_of(metrics: Metrics, wall: float, mono: float | None = None) -> Sample:
    return take_sample(metrics.read(), wall, wall if mono is None else mono)


def test_rates_are_of_the_span_not_since_start() -> None:
    metrics = Metrics(CollectorRegistry())
    # An hour of hits before the span...
    metrics.cache_lookups.labels("hit").inc(10_000)
    metrics.served_bytes.labels("cache").inc(10_000 * MIB)
    before = sample_of(metrics, 100.0)
    # ...then ten seconds of misses only: the span's ratio is 0, not ~99.9%.
    metrics.cache_lookups.labels("miss").inc(20)
    metrics.served_bytes.labels("origin").inc(20 * MIB)
    metrics.origin_bytes.labels("foreground").inc(20 * MIB)
    metrics.origin_bytes.labels("prefetch").inc(40 * MIB)
    metrics.origin_requests.labels("prefetch", "error").inc(2)
    metrics.origin_requests.labels("warm", "error").inc(3)
    metrics.ratelimit_wait.labels("prefetch").inc(5.0)
    metrics.evictions.labels("capacity").inc(30)
    metrics.warm_blocks.labels("fetched").inc(4)
    metrics.disk_errors.labels("read").inc(1)
    after = sample_of(metrics, 110.0)

    span = rates(before, after)
    assert span is not None
    assert span["seconds"] == 10
    assert span["hit_ratio"] == {"byte": 0.0, "block": 0.0}
    assert span["served_bytes_per_s"] == {"cache": 0.0, "origin": 2 * MIB}
    assert span["origin_bytes_per_s"] == {"foreground": 2 * MIB, "prefetch": 4 * MIB,
                                          "warm": 0.0}
    # Summed over the lanes.
    assert span["origin_requests_per_s"] == {"ok": 0.0, "not_found": 0.0, "error": 0.5}
    assert span["ratelimit_wait_s_per_s"]["prefetch"] == 0.5
    assert span["evictions_per_s"]["capacity"] == 3.0
    assert span["warm_blocks_per_s"]["fetched"] == 0.4
    assert span["disk_errors_per_s"] == {"read": 0.1, "write": 0.0}


def test_a_span_without_reads_has_no_ratio_and_no_latency() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.cache_lookups.labels("hit").inc(5)
    first = sample_of(metrics, 1.0)
    second = sample_of(metrics, 3.0)
    span = rates(first, second)
    assert span is not None
    assert span["hit_ratio"] == {"byte": None, "block": None}
    assert span["latency_s"]["p50"] is None and span["latency_s"]["requests_per_s"] == 0
    # No time between them: no rates at all.
    assert rates(second, sample_of(metrics, 3.0)) is None


def test_latency_percentiles_are_of_the_requests_in_the_span() -> None:
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_duration
    for _ in range(1000):  # slow requests long ago
        duration.labels("GetObject", "miss").observe(4.0)
    before = sample_of(metrics, 0.0)
    for _ in range(98):
        duration.labels("GetObject", "hit").observe(0.0004)
    duration.labels("GetObject", "partial").observe(0.2)
    duration.labels("GetObject", "miss").observe(0.2)
    duration.labels("HeadObject", "none").observe(9.0)  # no body: not a GET's latency
    span = rates(before, sample_of(metrics, 60.0))
    assert span is not None
    latency = span["latency_s"]
    assert 0.00025 < latency["p50"] <= 0.0005
    # Rank 99 of 100 is one of the two slow ones; the older 4 s requests count for nothing.
    assert 0.1 < latency["p99"] <= 0.25
    assert 0.1 < latency["miss_p99"] <= 0.25
    assert 0.00025 < latency["hit_p99"] <= 0.0005
    assert latency["requests_per_s"] == pytest.approx(100 / 60, rel=1e-5)


def test_the_ring_keeps_its_capacity_whatever_the_uptime() -> None:
    metrics = Metrics(CollectorRegistry())
    ring = SampleRing(capacity=5, interval_s=2.0, started=1000.0)
    for i in range(50):
        metrics.served_bytes.labels("cache").inc(MIB)
        ring.add(sample_of(metrics, 1000.0 + 2 * i))
    assert len(ring) == 5
    history = ring.history()
    # The newest five spans, each ending at its sample.
    assert history["time"] == [1090.0, 1092.0, 1094.0, 1096.0, 1098.0]
    assert history["series"]["served_bytes_per_s"]["cache"] == [MIB / 2] * 5
    assert history["series"]["seconds"] == [2.0] * 5
    assert history["interval_s"] == 2.0 and history["capacity"] == 5
    assert history["started"] == 1000.0
    # A sample and a point are flat arrays of floats: the ring's memory is the
    # capacity times these.
    assert len(FIELDS) < 100 and len(POINT_PATHS) < 60


def test_history_since_gives_only_the_newer_points() -> None:
    metrics = Metrics(CollectorRegistry())
    ring = SampleRing(capacity=10, interval_s=1.0, started=0.0)
    for i in range(6):
        ring.add(sample_of(metrics, float(i)))
    assert ring.history()["time"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ring.history(since=3.0)["time"] == [4.0, 5.0]
    assert ring.history(since=5.0) == {"interval_s": 1.0, "capacity": 10, "started": 0.0,
                                       "time": [], "series": {}}


def test_the_window_reaches_back_a_minute_or_to_the_oldest_sample() -> None:
    metrics = Metrics(CollectorRegistry())
    ring = SampleRing(capacity=100, interval_s=10.0, started=0.0)
    for i in range(10):  # samples at 0, 10, ... 90 s; one more hit each time
        metrics.cache_lookups.labels("hit").inc()
        ring.add(sample_of(metrics, 10.0 * i))
    metrics.cache_lookups.labels("miss").inc()
    now = sample_of(metrics, 95.0)
    window = ring.window(now, 60.0)
    assert window is not None
    # From the sample at 30 s (the newest at least 60 s old): 6 hits, 1 miss.
    assert window["seconds"] == 65
    assert window["hit_ratio"]["block"] == pytest.approx(6 / 7, rel=1e-5)
    # Early after start the window is as long as the sidecar has run.
    young = SampleRing(capacity=100, interval_s=10.0, started=0.0)
    young.add(sample_of(metrics, 90.0))
    assert young.window(now, 60.0)["seconds"] == 5  # type: ignore[index]
    assert SampleRing(capacity=1, interval_s=1.0, started=0.0).window(now, 60.0) is None


def test_the_clock_is_handed_in_spans_use_the_monotonic_one() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.served_bytes.labels("cache").inc(MIB)
    first = sample_of(metrics, wall=5000.0, mono=10.0)
    metrics.served_bytes.labels("cache").inc(MIB)
    # The wall clock stepped back an hour; the span is still 2 s.
    second = sample_of(metrics, wall=1400.0, mono=12.0)
    span = rates(first, second)
    assert span is not None and span["served_bytes_per_s"]["cache"] == MIB / 2


def test_a_wall_clock_stepped_back_neither_hides_new_points_nor_reverses_the_axis() -> None:
    """NTP stepping the clock back (or a VM resumed with an old clock): the page
    asks for the points after the newest one it has, so points stamped with the
    earlier wall time would never reach it, and its time axis would run backwards."""
    metrics = Metrics(CollectorRegistry())
    ring = SampleRing(capacity=10, interval_s=2.0, started=5000.0)
    for i in range(3):  # wall 5000, 5002, 5004
        ring.add(sample_of(metrics, wall=5000.0 + 2 * i, mono=100.0 + 2 * i))
    newest_shown = ring.history()["time"][-1]
    for i in range(3, 5):  # the clock stepped back an hour; the monotonic one runs on
        metrics.served_bytes.labels("cache").inc(MIB)
        ring.add(sample_of(metrics, wall=1400.0 + 2 * i, mono=100.0 + 2 * i))
    times = ring.history()["time"]
    assert times == sorted(set(times))  # strictly increasing
    # Each point is a span of the monotonic clock after the one before.
    assert times[-2:] == [newest_shown + 2.0, newest_shown + 4.0]
    fresh = ring.history(since=newest_shown)
    assert fresh["time"] == times[-2:]
    assert fresh["series"]["served_bytes_per_s"]["cache"] == [MIB / 2, MIB / 2]


def test_once_the_wall_clock_is_ahead_again_the_points_follow_it() -> None:
    metrics = Metrics(CollectorRegistry())
    ring = SampleRing(capacity=10, interval_s=2.0, started=5000.0)
    ring.add(sample_of(metrics, wall=5000.0, mono=0.0))
    ring.add(sample_of(metrics, wall=4000.0, mono=2.0))  # stepped back: 5002 instead
    ring.add(sample_of(metrics, wall=9000.0, mono=4.0))  # stepped forward past it
    assert ring.history()["time"] == [5002.0, 9000.0]


def test_points_kept_flat_come_back_as_columns_of_the_same_shape() -> None:
    metrics = Metrics(CollectorRegistry())
    quiet = sample_of(metrics, 0.0)
    metrics.cache_lookups.labels("hit").inc(3)
    metrics.cache_lookups.labels("miss").inc(1)
    busy = sample_of(metrics, 1.0)
    points = [rates(quiet, busy), rates(busy, sample_of(metrics, 2.0))]
    assert points[0] is not None and points[1] is not None
    table = columns([flatten(point) for point in points])
    assert table["hit_ratio"]["block"] == [0.75, None]  # None survives the trip (as NaN)
    assert table["seconds"] == [1.0, 1.0]
    assert set(table) == set(points[0])
    assert set(table["latency_s"]) == set(points[0]["latency_s"])
    assert columns([]) == {}


def test_latency_bounds_are_the_histograms() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.request_duration.labels("GetObject", "hit").observe(0.003)
    buckets = metrics.read().buckets("sidecar_request_duration_seconds", cache="hit")
    assert tuple(buckets) == LATENCY_BOUNDS
    assert buckets[0.0025] == 0 and buckets[0.005] == 1 and buckets[math.inf] == 1
