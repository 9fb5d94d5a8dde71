"""The option table: every option once, with its parser, its default, its help,
where it goes on the command line, and the field of the tree it fills.

One flat name is used three ways: the flag `--cache-size`, the TOML key
`cache_size` and the env var `SIDECAR_CACHE_SIZE`. docs/CONFIG.md and the
example config are rendered from this table (sidecar.config.reference).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.config.parsing import (
    fraction,
    non_negative_int,
    optional_str,
    parse_admin_token,
    parse_auth_keys,
    parse_bool,
    parse_bucket_list,
    parse_cpu_list,
    parse_duration,
    parse_host_port,
    parse_ionice,
    parse_key_scopes,
    parse_layout_name,
    parse_log_format,
    parse_nice,
    parse_node_name,
    parse_optional_host_port,
    parse_optional_http_url,
    parse_path_list,
    parse_rate,
    parse_s3_location,
    parse_sample_interval,
    parse_size,
    parse_size_or_auto,
    parse_stop_timeout,
    positive_int,
)
from sidecar.config.toml_types import TomlType, toml_type


@dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[object], Any]
    default: object
    help: str
    metavar: str = ""
    flag: bool = True  # exposed as a command-line flag (all are TOML keys and env vars)
    kind: str = "value"  # "switch": a flag without a value; "list": a repeatable flag
    secret: bool = False  # never shown: not in logs, errors, stats or the config summary
    group: str = ""  # section of docs/CONFIG.md; "" lets config_reference infer it from the name
    # The field of the tree this option's value fills ("section.attribute"), or
    # "" for an option that feeds a derivation (sidecar.config.loading.derive).
    field: str = ""
    required: bool = False  # no default: `serve` refuses to start without it

    @property
    def env(self) -> str:
        return "SIDECAR_" + self.name.upper()

    @property
    def file_type(self) -> TomlType:
        """The TOML types its config-file value may have (sidecar.config.toml_types)."""
        return toml_type(self.parse)

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("listen", parse_host_port, "127.0.0.1:9330", "data port (S3 API) address", "H:P",
           field="server.listen"),
    Option("admin_listen", parse_host_port, "127.0.0.1:9331", "admin port address", "H:P",
           field="server.admin_listen"),
    Option("admin_token", parse_admin_token, "",
           "bearer token for mutating admin calls and, off loopback, for /metrics, /ui and "
           "/api/v1/stats too; empty: the token of admin_token_file (on the command line it "
           "shows in ps: prefer SIDECAR_ADMIN_TOKEN or the file)", "TOKEN",
           secret=True,
           field="server.admin_token"),
    Option("admin_token_file", optional_str, "",
           "where the admin token is kept when admin_token is not set: read at start, or "
           "generated there (mode 0600) at the first start; empty: <cache_dir>/admin.token. "
           "`sidecar stats` and the warm-up job read it (SIDECAR_ADMIN_TOKEN_FILE)", "PATH",
           flag=False, group="server"),
    Option("metrics_listen", parse_optional_host_port, "",
           "a second listener serving GET /metrics only, without a token (for Prometheus "
           "when the admin port is off loopback and guarded); on loopback it answers only "
           "under a loopback Host, as the admin port does; empty: none", "H:P",
           field="server.metrics_listen"),
    Option("origin_endpoint", parse_optional_http_url, "",
           "object store URL (default: AWS from the region)", "URL",
           field="origin.endpoint"),
    Option("origin_region", str, "us-east-1", "object store region", "R",
           field="origin.region"),
    Option("origin_max_connections", positive_int, 32,
           "bound of the origin connection pool", "N", flag=False,
           field="origin.max_connections"),
    Option("origin_connect_timeout", parse_duration, "2s",
           "origin connect timeout", "DURATION", flag=False,
           field="origin.connect_timeout_s"),
    Option("origin_read_timeout", parse_duration, "15s",
           "origin read timeout (per socket read)", "DURATION", flag=False,
           field="origin.read_timeout_s"),
    Option("origin_retries", non_negative_int, 3,
           "retries of a failed origin call, with jittered backoff", "N", flag=False,
           field="origin.retries"),
    Option("origin_check", parse_bool, True,
           "refuse to start when the origin does not answer", "BOOL", flag=False,
           field="origin.check_on_start"),
    Option("head_ttl", parse_duration, "30s",
           "how long an object's size and ETag are remembered", "DURATION", flag=False,
           field="origin.head_ttl_s"),
    Option("origin_deadline", parse_duration, "10s",
           "an origin read that gets no byte for this long, retries included, fails (503); "
           "one attempt waits at most half of it", "DURATION", flag=False,
           field="origin.deadline_s"),
    Option("head_stale_if_error", parse_duration, "10m",
           "while the origin fails, an object's last known size and ETag are used this long",
           "DURATION", flag=False,
           field="origin.head_stale_if_error_s"),
    Option("origin_breaker_failures", non_negative_int, 5,
           "consecutive origin failures that open the circuit breaker (0: no breaker)", "N",
           flag=False,
           field="origin.breaker_failures"),
    Option("origin_breaker_ratio", fraction, 0.5,
           "share of failed origin calls in the window that opens the breaker", "F",
           flag=False,
           field="origin.breaker_ratio"),
    Option("origin_breaker_window", parse_duration, "30s",
           "window of the breaker's failure ratio", "DURATION", flag=False,
           field="origin.breaker_window_s"),
    Option("origin_breaker_cooldown", parse_duration, "5s",
           "an open breaker lets a probe through after this long", "DURATION", flag=False,
           field="origin.breaker_cooldown_s"),
    Option("listing_ttl", parse_duration, "30s",
           "how long a partition's segment listing is remembered", "DURATION", flag=False,
           field="origin.listing_ttl_s"),
    Option("cache_dir", optional_str, "",
           "directory of the slab file (a dedicated disk)", "DIR", required=True),
    Option("cache_size", parse_size, "1GiB", "bytes of cache to preallocate", "SIZE",
           field="cache.size_bytes"),
    Option("block_size", parse_size, "8MiB", "cache block and origin alignment size", "SIZE",
           field="cache.block_size"),
    Option("max_coalesce", parse_size, "64MiB",
           "largest single origin GET for adjacent missing blocks", "SIZE", flag=False),
    Option("io_threads", positive_int, 4,
           "threads of the disk executor (slab copies, checksums)", "N", flag=False,
           field="server.io_threads"),
    Option("prefetch", parse_bool, True,
           "sequential read-ahead (--no-prefetch turns it off)", "BOOL", flag=False,
           field="prefetch.enabled"),
    Option("prefetch_max_window", parse_size, "64MiB",
           "largest read-ahead of one stream", "SIZE", flag=False,
           field="prefetch.max_window_bytes"),
    Option("prefetch_max_in_flight", positive_int, 16,
           "prefetch blocks being fetched at once (bounds memory)", "N", flag=False,
           field="prefetch.max_in_flight"),
    Option("prefetch_cache_share", fraction, 0.25,
           "share of the cache that prefetched, not yet read blocks may fill", "F", flag=False,
           field="prefetch.cache_share"),
    Option("stream_idle", parse_duration, "60s",
           "a read head with no request for this long is forgotten", "DURATION", flag=False,
           field="prefetch.stream_idle_s"),
    Option("layout", parse_layout_name, "aiven",
           "object key layout: aiven (segments found for cross-segment prefetch) or plain",
           "NAME", flag=False,
           field="prefetch.layout"),
    Option("layout_prefix", str, "", "key prefix of the tiered-storage plugin", "P", flag=False,
           field="prefetch.layout_prefix"),
    Option("cpus", parse_cpu_list, "", "pin the process to these CPUs, e.g. 2-3", "LIST",
           field="server.cpus"),
    Option("ionice", parse_ionice, "none",
           "I/O scheduling class and level, e.g. best-effort:7 or idle", "CLASS[:N]",
           field="server.ionice"),
    Option("nice", parse_nice, 0, "CPU scheduling niceness (0 leaves it as it is)", "N",
           field="server.nice"),
    Option("origin_bandwidth", parse_rate, "unlimited",
           "total origin read budget, e.g. 200MiB/s (shared by the lanes); a limit must be "
           "at least 1MiB/s and one block a minute", "RATE",
           field="origin.bandwidth"),
    Option("prefetch_share", fraction, 0.6,
           "share of the origin budget read-ahead may use (with a limit, at least one "
           "block a minute)", "F", flag=False),
    Option("warm_share", fraction, 0.4,
           "share of the origin budget warm-up may use (with a limit, at least one block "
           "a minute)", "F", flag=False),
    Option("warm_concurrency", positive_int, 4,
           "origin connections warm-up may hold at once", "N", flag=False,
           field="origin.warm_concurrency"),
    Option("max_requests", positive_int, 256,
           "client requests served at once; more get 503 SlowDown", "N", flag=False,
           field="server.max_requests"),
    Option("max_buffered", parse_size, "512MiB",
           "bytes of readers' blocks on their way from the origin past which a read that "
           "needs another fetch gets 503 SlowDown; read-ahead and warm-up start a block only "
           "while all blocks on their way fit in it (warm-up waits for room, read-ahead asks "
           "again later), so they never turn a reader away and about twice this at most is on its "
           "way",
           "SIZE",
           flag=False,
           field="server.max_buffered_bytes"),
    Option("client_timeout", parse_duration, "30s",
           "a client that takes no bytes for this long is cut off", "DURATION", flag=False,
           field="server.client_timeout_s"),
    Option("passthrough_acquire_timeout", parse_duration, "5s",
           "a pass-through request (upload, delete, listing) waits at most this long for "
           "one of the origin_max_connections it may use; then 503 SlowDown", "DURATION",
           flag=False, group="server",
           field="server.passthrough_acquire_timeout_s"),
    Option("passthrough_timeout", parse_duration, "15m",
           "the longest one pass-through request may hold an origin connection, its upload "
           "and answer included (a trickling uploader is cut off: 400 RequestTimeout, or "
           "the connection closed once the answer started)", "DURATION",
           flag=False, group="server",
           field="server.passthrough_timeout_s"),
    Option("passthrough_per_client", positive_int, 16,
           "pass-through requests one client address may have in flight at once; more get "
           "503 SlowDown (one client never holds every origin connection)", "N",
           flag=False, group="server",
           field="server.passthrough_per_client"),
    Option("protect_path", parse_path_list, "",
           "refuse a cache dir on the same device as this path (repeatable), e.g. log.dirs",
           "PATH", kind="list",
           field="cache.protect_paths"),
    Option("allow_shared_disk", parse_bool, False,
           "allow the cache on the same device as a --protect-path", "", kind="switch",
           field="cache.allow_shared_disk"),
    Option("disk_reserve", parse_size, "1GiB",
           "free space kept on the cache disk; below it the cache shrinks", "SIZE", flag=False,
           field="cache.disk_reserve_bytes"),
    Option("disk_check_interval", parse_duration, "5s",
           "how often free space and a failed disk are checked", "DURATION", flag=False,
           field="cache.disk_check_interval_s"),
    Option("preallocate", parse_bool, True,
           "reserve the whole cache on disk at start (false: a sparse slab)", "BOOL",
           flag=False,
           field="cache.preallocate"),
    Option("drop_written_pages", parse_bool, True,
           "advise the kernel to drop slab pages once written and once read", "BOOL",
           flag=False,
           field="cache.drop_written_pages"),
    Option("direct_io", parse_bool, True,
           "write and read cache blocks past the page cache (O_DIRECT) where the file "
           "system allows it", "BOOL", flag=False,
           field="cache.direct_io"),
    Option("recent_chunks", parse_size, "64MiB",
           "memory for chunks just read from the cache, served again without reading or "
           "hashing them (a fetch starts in the chunk the last one ended in); 0: none",
           "SIZE", flag=False, group="cache",
           field="cache.recent_chunk_bytes"),
    Option("memory_tier", parse_size_or_auto, "auto",
           "memory of the sidecar's own (a sealed memfd, counted as shared memory, not RSS) "
           "for verified chunks sent with sendfile: no disk read, no second hash; auto (the "
           "default): cache_size/8 up to 256MiB, which the container must be given (see "
           "deploy/README.md); 0: none; more than the machine's or the container's memory "
           "is refused at start",
           "SIZE|auto", flag=False, group="cache",
           field="cache.memory_tier"),
    Option("memory_tier_reserve", parse_bool, True,
           "take the memory tier's memory at start, in the background, so that chunks "
           "land in pages the kernel has given already (cheaper for the origin threads, "
           "and a container limit too small shows at start); false: pages are taken as "
           "chunks come in", "BOOL", flag=False, group="cache",
           field="cache.memory_tier_reserve"),
    Option("scrub_rate", parse_rate, "64MiB/s",
           "after a restart, verify the recovered blocks' data in the background at this "
           "disk read rate (0: only when read)", "RATE", flag=False, group="cache",
           field="cache.scrub_rate"),
    Option("access_log", optional_str, "",
           "JSON-lines access log, one line per request: a file path, or - for stdout",
           "PATH|-",
           field="server.access_log"),
    Option("access_log_max_size", parse_size, "256MiB",
           "rotate the access log file when it reaches this size, keeping "
           "access_log_backups old files beside it (PATH.1 the newest); 0: never rotate",
           "SIZE", flag=False, group="server",
           field="server.access_log_max_bytes"),
    Option("access_log_backups", non_negative_int, 4,
           "rotated access log files kept (PATH.1 .. PATH.N); 0: the file is emptied "
           "when full", "N", flag=False, group="server",
           field="server.access_log_backups"),
    Option("access_log_upload", parse_s3_location, "",
           "ship each rotated access log file to the origin at s3://BUCKET/PREFIX, as "
           "PREFIX/NODE/TIME.jsonl (through the sidecar's origin credentials, in the "
           "background, up to access_log_backups files waiting); empty: keep them local",
           "S3URL", flag=False, group="server",
           field="server.access_log_upload"),
    Option("node_name", parse_node_name, "",
           "this node's name in the access log (capacity analysis groups by it) and its "
           "folder of shipped logs (no control character, not . or .., at most 255 "
           "characters); empty: the host name", "NAME", flag=False, group="server",
           field="server.node_name"),
    Option("log_format", parse_log_format, "auto",
           "stderr log lines: json (one object per line), text, or auto (text on a terminal, "
           "else json)", "auto|json|text",
           field="server.log_format"),
    Option("stats_interval", parse_sample_interval, "2s",
           "how often the admin port samples its counters for the windowed rates of "
           "/api/v1/stats and the charts of /ui; it keeps the last 450 samples (15 minutes "
           "at 2s)", "DURATION", flag=False,
           field="server.stats_interval_s"),
    Option("stop_timeout", parse_stop_timeout, "20s",
           "the longest a stop (SIGTERM, SIGINT) may take: requests still being answered get "
           "half of it to finish, then are cut off; past it, or at a second signal, "
           "the process logs what it was still waiting for and exits 1 at once (a hung "
           "cache disk never holds it); keep it under the orchestrator's grace period "
           "(terminationGracePeriodSeconds, TimeoutStopSec)", "DURATION", flag=False,
           field="server.stop_timeout_s"),
    # Data-port SigV4 verification ([auth] in TOML). Keys never go on the command
    # line, where any user of the host can read them from ps.
    Option("auth_keys", parse_auth_keys, "",
           "access keys whose SigV4 signatures the data port accepts besides the sidecar's "
           "own origin credentials (always accepted): a TOML table {AKID = \"SECRET\"} or "
           "AKID:SECRET,AKID2:SECRET2", "KEYS", flag=False, secret=True),
    Option("auth_keys_file", optional_str, "",
           "a file of AKID:SECRET lines (e.g. a Kubernetes Secret mount), added to auth_keys",
           "PATH", flag=False),
    Option("auth_allow_anonymous", parse_bool, False,
           "serve unsigned requests, for reading the served buckets only (GET/HEAD of "
           "objects and their sub-resources, listings, HeadBucket, GetBucketLocation; never "
           "ListBuckets): writes and deletes always need a signature, as they reach the "
           "origin with the sidecar's credentials", "BOOL", flag=False),
    Option("auth_scopes", parse_key_scopes, "",
           "narrow configured keys: a TOML table {AKID = \"read:BUCKET,...\"} or "
           "AKID=read-write;AKID2=read:BUCKET (read or read-write, then the buckets it may "
           "use, none: every served bucket); a key not named is read-write on every served "
           "bucket, as are the sidecar's own origin credentials", "SCOPES", flag=False,
           field="auth.scopes"),
    # What the data port serves at all ([access] in TOML): requests reach the
    # origin with the sidecar's credentials, which may reach far more.
    Option("access_buckets", parse_bucket_list, "",
           "the buckets the data port serves (the tiered-storage plugin's); every other "
           "bucket gets 403 AccessDenied before the origin is asked. Empty: every bucket the "
           "origin credentials reach (a warning at start), as before this option existed",
           "BUCKETS", flag=False, field="access.buckets"),
    Option("access_bucket_admin", parse_bool, False,
           "let signed callers create and delete buckets and change bucket configuration "
           "(policy, ACL, lifecycle, versioning...) and object ACLs; a Kafka fleet needs "
           "none of it", "BOOL", flag=False, field="access.bucket_admin"),
    Option("access_copy_sources", parse_bucket_list, "",
           "buckets CopyObject and UploadPartCopy may copy from besides the served ones "
           "(with access_buckets empty, any)", "BUCKETS", flag=False,
           field="access.copy_sources"),
)
BY_NAME = {option.name: option for option in OPTIONS}
