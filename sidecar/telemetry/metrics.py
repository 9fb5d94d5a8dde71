"""Prometheus collectors of the sidecar, all on one registry handed in.

Metric names and labels are the dashboards' contract (docs/ARCHITECTURE.md, "Metrics"). No
label carries an unbounded value: never a key, bucket or client address.
"""

from __future__ import annotations

import math
import platform
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from sidecar import installed_version
from sidecar.model import LANES
from sidecar.telemetry.thread_cpu import ThreadCpuCollector

# From sub-millisecond cache hits (a 1 MiB chunk read, verified and sent from
# the page cache takes ~0.3 ms) up to multi-second cold origin reads of coalesced 64 MiB runs.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
)
ORIGIN_OUTCOMES = ("ok", "not_found", "error")
# sidecar.origin.breaker.BreakerState values.
BREAKER_STATES = ("closed", "half_open", "open")
# "recovery": a slot header dropped when the cache index was rebuilt at start
# (corrupt, or an older copy of a block held in another slot).
EVICTION_REASONS = ("capacity", "checksum", "invalidated", "shrink", "recovery")
WARM_OUTCOMES = ("already_cached", "fetched", "failed")
PREFETCH_OUTCOMES = ("issued", "used", "wasted")
DISK_OPS = ("read", "write")
# Why an answer was cut off after its headers went out (sidecar_client_cutoffs_total,
# the access log's `cut_off`): the client took no bytes for client_timeout, a mode
# paused the origin reads the rest needed, max_buffered refused them, the origin
# failed, a pass-through answer ran past passthrough_timeout, the fetch of a block
# it needed (or the answer itself) was stopped (the sidecar stopping), or anything
# else went wrong. A client that hangs up itself is no cut-off.
CUTOFF_REASONS = ("client_timeout", "paused", "overloaded", "origin", "passthrough_timeout",
                  "stopped", "error")
# The `cache` label of sidecar_request_duration_seconds: how a read was served
# ("none" for answers without a body: HEAD, 304, errors).
REQUEST_CACHE_RESULTS = ("hit", "partial", "miss")
# sidecar.s3.sigv4.Reason values (metrics imports nothing of the project's logic).
AUTH_FAILURE_REASONS = (
    "unsigned", "malformed", "unknown_key", "bad_signature", "expired", "skewed",
)
# sidecar_memory_tier_*: (name, help, counter?) of what the tier reports
# (sidecar.cache.memory_tier), keyed as its figures are.
MEMORY_TIER_SERIES = (
    ("size_bytes", "Bytes the memory tier may hold: its sealed memfd's size (0: off)", False),
    ("used_bytes", "Bytes of verified chunks held in the memory tier", False),
    ("protected_bytes",
     "Of those, bytes a warm-up put there: kept, never evicted, until first read", False),
    ("resident_bytes",
     "Memory the tier's memfd holds as the kernel counts it: shared memory, which counts "
     "toward a container's limit and is not in the process's resident set", False),
    ("hits", "Chunk pieces sent from the memory tier (sendfile, no read, no hash)", True),
    ("misses", "Lookups of a cached chunk the memory tier did not hold", True),
    ("inserts", "Verified chunks that entered the memory tier (origin or disk)", True),
    ("evictions", "Chunks the memory tier let go to make room (pages released)", True),
    ("refused",
     "Chunks the memory tier admitted but could not take: every region was being filled "
     "or sent from", True),
    ("declined",
     "Chunks offered to the full memory tier and not admitted (not read again soon enough)",
     True),
)


class Metrics:
    """The sidecar's collectors, declared a family at a time.

    Each family pre-creates the label sets the dashboards plot, so a quiet
    sidecar still exports zeros instead of absent series.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._declare_process(registry)
        self._declare_requests(registry)
        self._declare_origin(registry)
        self._declare_cache(registry)
        self._declare_read_ahead_and_warm_up(registry)
        self._declare_isolation(registry)
        # sidecar_memory_tier_*: the tier's own figures, read at each collection.
        self.memory_tier = MemoryTierCollector(registry)

    def _declare_process(self, registry: CollectorRegistry) -> None:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        # sidecar_thread_cpu_seconds_total{thread}: which threads take the CPU.
        ThreadCpuCollector(registry)
        # sidecar_build_info{version, python} 1: which build each node runs.
        Info("sidecar_build", "The running sidecar's version", registry=registry).info(
            {"version": installed_version(), "python": platform.python_version()})

    def _declare_requests(self, registry: CollectorRegistry) -> None:
        """What clients asked and what they were answered."""
        self.requests = Counter(
            "sidecar_requests", "Client requests answered, by S3 operation and status code",
            ["op", "code"], registry=registry,
        )
        self.request_duration = Histogram(
            "sidecar_request_duration_seconds",
            "Client request duration until the last byte, by whether the cache served it",
            ["op", "cache"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.plain_range_requests = Counter(
            "sidecar_plain_range_requests",
            "Of sidecar_requests_total, the ranged GETs answered on the data port's "
            "plain-range path, without aiohttp's request handling (s3/plain_ranges.py)",
            registry=registry,
        )
        self.cache_lookups = Counter(
            "sidecar_cache_lookups", "Block lookups by clients", ["result"], registry=registry,
        )
        self.served_bytes = Counter(
            "sidecar_served_bytes", "Body bytes sent to clients, by where they came from",
            ["source"], registry=registry,
        )
        self.access_log_dropped = Counter(
            "sidecar_access_log_dropped_lines",
            "Access log lines not written: the writer fell behind (queue) or the log's "
            "disk failed or is full (disk); serving goes on either way",
            ["reason"], registry=registry,
        )
        self.access_log_uploads = Counter(
            "sidecar_access_log_uploads",
            "Rotated access log files shipped to access_log_upload (ok), uploads that "
            "failed and will be tried again (failed), files given up (dropped)",
            ["outcome"], registry=registry,
        )
        # Pre-created for the ports every sidecar has, so a clean node exports zeros.
        self.malformed_requests = Counter(
            "sidecar_malformed_requests",
            "Requests aiohttp refused itself before any handler ran (a request line, "
            "header or Content-Length it cannot parse, an unknown Expect), by port and "
            "status: they have no sidecar_requests_total sample and no access log line",
            ["port", "code"], registry=registry,
        )
        for port in ("data", "admin"):
            self.malformed_requests.labels(port, "400")
        self.client_disconnects = Counter(
            "sidecar_client_disconnects",
            "Answers a client stopped reading by closing its connection, before the "
            "headers or during the body (Kafka's remote reader closes after each fetch)",
            registry=registry,
        )
        self.client_cutoffs = Counter(
            "sidecar_client_cutoffs",
            "Answers the sidecar cut off after their headers (and a 200 or 206, which "
            "sidecar_requests_total counts) went out, by reason: the client took no bytes "
            "for client_timeout, a mode paused the origin reads the rest needed (paused), "
            "max_buffered refused them (overloaded), the origin failed (origin), the fetch "
            "of a block it needed, or the answer itself, was stopped as the sidecar stops "
            "(stopped), any other error (error)",
            ["reason"], registry=registry,
        )
        self.auth_failures = Counter(
            "sidecar_auth_failures",
            "Data-port requests refused 403 AccessDenied by SigV4 verification, by reason",
            ["reason"], registry=registry,
        )
        self.access_denied = Counter(
            "sidecar_access_denied",
            "Data-port requests refused 403 AccessDenied by [access] or a key's scope "
            "(a bucket not served, bucket administration, a copy from elsewhere), by operation",
            ["op"], registry=registry,
        )
        for result in ("hit", "miss"):
            self.cache_lookups.labels(result)
        for source in ("cache", "origin"):
            self.served_bytes.labels(source)
        for reason in ("queue", "disk"):
            self.access_log_dropped.labels(reason)
        for outcome in ("ok", "failed", "dropped"):
            self.access_log_uploads.labels(outcome)
        for cache_result in REQUEST_CACHE_RESULTS:
            self.request_duration.labels("GetObject", cache_result)
        for op, code in (("GetObject", "200"), ("GetObject", "206"), ("HeadObject", "200")):
            self.requests.labels(op, code)
        for reason in AUTH_FAILURE_REASONS:
            self.auth_failures.labels(reason)
        for reason in CUTOFF_REASONS:
            self.client_cutoffs.labels(reason)

    def _declare_origin(self, registry: CollectorRegistry) -> None:
        """The object store: requests, bytes, durations, the circuit breaker."""
        self.origin_requests = Counter(
            "sidecar_origin_requests", "Requests to the object store", ["lane", "outcome"],
            registry=registry,
        )
        self.origin_bytes = Counter(
            "sidecar_origin_bytes", "Body bytes read from the object store", ["lane"],
            registry=registry,
        )
        self.origin_duration = Histogram(
            "sidecar_origin_request_duration_seconds",
            "Object store request duration until the last byte", ["lane"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.origin_breaker_state = Gauge(
            "sidecar_origin_breaker_state",
            "1 for the origin circuit breaker's state (open: misses fail fast with 503)",
            ["state"], registry=registry,
        )
        self.origin_breaker_rejected = Counter(
            "sidecar_origin_breaker_rejected",
            "Origin calls refused at once because the circuit breaker was open",
            registry=registry,
        )
        for lane in LANES:
            self.origin_bytes.labels(lane)
            self.origin_duration.labels(lane)
            for origin_outcome in ORIGIN_OUTCOMES:
                self.origin_requests.labels(lane, origin_outcome)

    def _declare_cache(self, registry: CollectorRegistry) -> None:
        """The block cache and its disk."""
        self.cache_used = Gauge(
            "sidecar_cache_used_bytes", "Bytes of cached block data", registry=registry,
        )
        self.cache_capacity = Gauge(
            "sidecar_cache_capacity_bytes", "Bytes of block data the cache can hold",
            registry=registry,
        )
        self.cache_blocks = Gauge(
            "sidecar_cache_blocks", "Blocks in the cache", registry=registry,
        )
        self.cache_protected_blocks = Gauge(
            "sidecar_cache_protected_blocks",
            "Blocks a warm-up made cached and protects from eviction until read or its "
            "ttl_s passes",
            registry=registry,
        )
        self.evictions = Counter(
            "sidecar_cache_evictions", "Blocks dropped from the cache, by reason", ["reason"],
            registry=registry,
        )
        self.checksum_failures = Counter(
            "sidecar_cache_checksum_failures",
            "Cached blocks whose data did not match their checksum (dropped and refetched)",
            registry=registry,
        )
        self.disk_errors = Counter(
            "sidecar_cache_disk_errors",
            "Reads and writes of the cache disk that failed (EIO, ENOSPC...), by operation",
            ["op"], registry=registry,
        )
        for reason in EVICTION_REASONS:
            self.evictions.labels(reason)
        for disk_op in DISK_OPS:
            self.disk_errors.labels(disk_op)

    def _declare_read_ahead_and_warm_up(self, registry: CollectorRegistry) -> None:
        """Blocks fetched before any reader asked: read-ahead and warm-up."""
        self.prefetch_blocks = Counter(
            "sidecar_prefetch_blocks",
            "Read-ahead blocks: issued to the origin, used by a reader, wasted (evicted unread)",
            ["outcome"], registry=registry,
        )
        self.warm_blocks = Counter(
            "sidecar_warm_blocks", "Blocks asked for by warm-up calls, by what became of them",
            ["outcome"], registry=registry,
        )
        for outcome in PREFETCH_OUTCOMES:
            self.prefetch_blocks.labels(outcome)
        for outcome in WARM_OUTCOMES:
            self.warm_blocks.labels(outcome)

    def _declare_isolation(self, registry: CollectorRegistry) -> None:
        """What keeps the sidecar from hurting the broker: bandwidth lanes, modes."""
        self.ratelimit_wait = Counter(
            "sidecar_ratelimit_wait_seconds",
            "Time origin reads waited for the bandwidth budget, by lane", ["lane"],
            registry=registry,
        )
        self.mode = Gauge(
            "sidecar_mode", "1 for the mode in force (a failing cache disk forces bypass)",
            ["mode"], registry=registry,
        )
        for lane in LANES:
            self.ratelimit_wait.labels(lane)

    # CacheMetrics protocol of sidecar.cache.store
    def on_eviction(self, reason: str) -> None:
        self.evictions.labels(reason).inc()

    def on_checksum_failure(self) -> None:
        self.checksum_failures.inc()

    def on_disk_error(self, op: str) -> None:
        self.disk_errors.labels(op).inc()

    def read(self) -> MetricsReading:
        """Every sample of the sidecar's own collectors, collected once.

        The stats JSON and the admin port's sampler ask for dozens of values at
        a time; `value` would collect the whole registry for each, the process
        collector's /proc reads included."""
        own = (collector for collector in vars(self).values()
               if isinstance(collector, MetricWrapperBase | MemoryTierCollector))
        return MetricsReading(sample for collector in own
                              for family in collector.collect() for sample in family.samples)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of one sample (for the stats JSON and `sidecar stats`)."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (any other labels)."""
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name
            and all(sample.labels.get(k) == v for k, v in labels.items())
        )


class MemoryTierCollector(Collector):
    """sidecar_memory_tier_*, from the figures the tier keeps itself (counters
    in the core, this exporter at the rim): zeros until ``watch`` names the
    tier's, and when the tier is off."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._figures: Callable[[], Mapping[str, int]] = dict
        registry.register(self)

    def watch(self, figures: Callable[[], Mapping[str, int]]) -> None:
        """What to read at each collection, as ``Gauge.set_function`` does."""
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self._figures()
        for name, help_text, counter in MEMORY_TIER_SERIES:
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(f"sidecar_memory_tier_{name}", help_text,
                         value=figures.get(name, 0))


class MetricsReading:
    """Samples of the registry at one instant, asked as `Metrics` answers them."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self._by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for sample in samples:
            self._by_name[sample.name].append((sample.labels, sample.value))

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sample of `name` with exactly these labels (0 when there is none)."""
        wanted = labels or {}
        return next((value for sample_labels, value in self._by_name.get(name, ())
                     if sample_labels == wanted), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (any other labels)."""
        return sum(value for sample_labels, value in self._by_name.get(name, ())
                   if all(sample_labels.get(k) == v for k, v in labels.items()))

    def buckets(self, histogram: str, **labels: str) -> dict[float, float]:
        """A histogram's cumulative counts by upper bound (+inf last), summed over the
        label sets that include `labels`."""
        counts: dict[float, float] = defaultdict(float)
        for sample_labels, value in self._by_name.get(histogram + "_bucket", ()):
            if all(sample_labels.get(k) == v for k, v in labels.items()):
                counts[math.inf if sample_labels["le"] == "+Inf"
                       else float(sample_labels["le"])] += value
        return dict(sorted(counts.items()))
