"""The configuration tree: frozen, built once by sidecar.config.loading.

No field has a default of its own: every default is the option table's
(sidecar.config.options), and every field is filled from it, by an option
that names the field or by one of the loader's derivations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.config.parsing import HostPort, KeyScope, S3Location
from sidecar.layout import Layout


@dataclass(frozen=True)
class ServerConfig:
    listen: HostPort
    admin_listen: HostPort
    admin_token: str | None = field(repr=False)  # a secret: kept out of reprs
    # Where the token is kept when admin_token is None (generated at the first start).
    admin_token_file: Path
    metrics_listen: HostPort | None  # a tokenless /metrics-only listener; None: none
    cpus: tuple[int, ...] | None
    io_threads: int
    ionice: tuple[str, int] | None
    nice: int
    max_requests: int
    max_buffered_bytes: int
    client_timeout_s: float
    passthrough_acquire_timeout_s: float  # wait for an origin connection, then SlowDown
    passthrough_timeout_s: float  # one pass-through request, upload and answer
    passthrough_per_client: int  # pass-through requests in flight per client address
    access_log: str | None  # a path, "-" for stdout, None: no access log
    access_log_max_bytes: int  # rotate the access log file at this size; 0: never
    access_log_backups: int  # rotated files kept
    access_log_upload: S3Location | None  # where rotated files are shipped; None: nowhere
    node_name: str | None  # the access log's `node`; None: the host name
    log_format: str  # auto | json | text (cli.py sets logging up with it)
    stats_interval_s: float  # the admin port samples its counters this often
    stop_timeout_s: float  # past it, a stop ends the process at once (stop_deadline.py)


@dataclass(frozen=True)
class OriginConfig:
    endpoint: str | None
    region: str
    max_connections: int
    connect_timeout_s: float
    read_timeout_s: float
    retries: int
    check_on_start: bool
    head_ttl_s: float
    listing_ttl_s: float
    bandwidth: int | None
    prefetch_share: float
    warm_share: float
    warm_concurrency: int
    deadline_s: float
    head_stale_if_error_s: float
    breaker_failures: int
    breaker_ratio: float
    breaker_window_s: float
    breaker_cooldown_s: float


# The default memory tier's bound, whatever the cache's size.
DEFAULT_MEMORY_TIER_CAP = 256 * 1024 * 1024
# The cache's checksum chunk, the tier's unit (sidecar.cache.slot_format's
# chunk_size_for; not imported: the config loads without the cache's
# dependencies, and a test holds the two equal).
MAX_CHUNK_BYTES = 1024 * 1024


def chunk_bytes(block_size: int) -> int:
    return min(MAX_CHUNK_BYTES, block_size)


def memory_tier_bytes(asked: int | None, cache_size: int, block_size: int) -> int:
    """The memory tier's size: as asked, or by default (None) an eighth of the
    cache up to 256 MiB, a share that holds the hot chunks of a catch-up
    (each Kafka fetch starts in the chunk the last one ended in) without
    making the sidecar's memory grow with its disk; whole chunks, none for a
    cache too small to spare one."""
    if asked is not None:
        return asked
    chunk = chunk_bytes(block_size)
    share = min(cache_size // 8, DEFAULT_MEMORY_TIER_CAP)
    return share - share % chunk


@dataclass(frozen=True)
class CacheConfig:
    directory: Path
    size_bytes: int
    block_size: int
    max_coalesce_bytes: int
    protect_paths: tuple[Path, ...]
    allow_shared_disk: bool
    disk_reserve_bytes: int
    disk_check_interval_s: float
    drop_written_pages: bool
    direct_io: bool
    recent_chunk_bytes: int
    memory_tier: int | None  # as asked; None: auto (see memory_tier_bytes)
    memory_tier_reserve: bool
    preallocate: bool
    scrub_rate: int | None  # bytes/s; None: recovered blocks are verified when read
    # Whether memory_tier was set (flag, environment or file) rather than left
    # at its default: only an operator's own ask is worth a warning when it
    # comes out as none.
    memory_tier_asked: bool

    @property
    def memory_tier_bytes(self) -> int:
        """The memory tier's size (0: none). Derived here rather than when
        loading, so that the option keeps what was asked: a reload that
        changes only cache_size names only cache_size."""
        return memory_tier_bytes(self.memory_tier, self.size_bytes, self.block_size)

    @property
    def memory_tier_off_reason(self) -> str | None:
        """Why a memory tier asked for (``auto``) came out as none, for a
        warning at start: the operator asked for one, and /ui would only say
        "off". None when there is one, or none was asked for (left at its
        default, ``auto``, on a cache too small to spare a chunk: a test's or
        a demo's, which wants none)."""
        if self.memory_tier is not None or self.memory_tier_bytes or not self.memory_tier_asked:
            return None
        chunk = chunk_bytes(self.block_size)
        return (f"memory_tier auto is an eighth of cache_size ({self.size_bytes // 8} bytes), "
                f"less than one chunk of {chunk} bytes: the memory tier is off; give "
                f"memory_tier a size of at least {chunk} bytes to have one")


@dataclass(frozen=True)
class PrefetchConfig:
    enabled: bool
    # As asked: a reload compares this, so that a block_size changed beside it
    # (a restart's matter) is not taken for a new window.
    max_window_bytes: int
    max_window_blocks: int  # max_window_bytes in whole blocks of cache.block_size, at least 1
    max_in_flight: int
    cache_share: float
    stream_idle_s: float
    layout: Layout
    layout_prefix: str


@dataclass(frozen=True)
class AuthConfig:
    """Data-port SigV4 verification: the accepted keys, and whether unsigned requests pass."""

    keys: Mapping[str, str] = field(repr=False)  # secrets
    allow_anonymous: bool
    scopes: Mapping[str, KeyScope]  # access key id -> scope; a key not here: unscoped


@dataclass(frozen=True)
class AccessConfig:
    """What the data port serves at all, whoever signs (sidecar.s3.access)."""

    buckets: tuple[str, ...]  # empty: every bucket the origin credentials reach
    bucket_admin: bool  # bucket creation/deletion, bucket configuration, ACLs
    copy_sources: tuple[str, ...]  # buckets a copy may read besides the served ones


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    origin: OriginConfig
    cache: CacheConfig
    prefetch: PrefetchConfig
    auth: AuthConfig
    access: AccessConfig
