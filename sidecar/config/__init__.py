"""One frozen configuration tree, loaded in one place.

Every option has one flat name used three ways: the flag `--cache-size`, the TOML
key `cache_size` and the env var `SIDECAR_CACHE_SIZE`. Precedence is
flag > env > file > default. Values from flags and env are strings; TOML may give
native types. Each value goes through the option's parser exactly once, so
"unlimited", sizes and durations are normalised here and nowhere else.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}


def parse_size(value: object) -> int:
    """`8MiB`, `10GiB`, `500MB`, `4096` -> bytes (binary units are powers of 1024)."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"size must not be negative: {value}")
        return value
    match = _SIZE_RE.match(str(value))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ConfigError(f"not a size: {value!r} (expected e.g. 8MiB, 10GiB, 500MB or bytes)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_rate(value: object) -> int | None:
    """`100MiB/s` -> bytes per second; `unlimited` or 0 -> None."""
    text = str(value).strip()
    if text.lower() in ("unlimited", "none", "0", ""):
        return None
    if not text.endswith("/s"):
        if isinstance(value, int):
            return value or None
        raise ConfigError(f"not a rate: {value!r} (expected e.g. 100MiB/s or unlimited)")
    return parse_size(text[:-2]) or None


def parse_duration(value: object) -> float:
    """`30s`, `500ms`, `2m`, `1.5` (seconds) -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value))
        if match is None:
            raise ConfigError(f"not a duration: {value!r} (expected e.g. 30s, 500ms, 2m)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError(f"duration must not be negative: {value!r}")
    return seconds


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return self.host in ("localhost", "::1") or self.host.startswith("127.")


def parse_host_port(value: object) -> HostPort:
    host, sep, port = str(value).strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"not a HOST:PORT address: {value!r}")
    return HostPort(host, int(port))


def parse_cpu_list(value: object) -> tuple[int, ...] | None:
    """`2-3`, `0,2,4-5` -> CPU ids; empty -> None (no pinning)."""
    text = str(value).strip()
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ConfigError(f"not a CPU list: {value!r} (expected e.g. 2-3 or 0,2,4-5)")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ConfigError(f"not a CPU list: {value!r} ({part.strip()} is reversed)")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"not a boolean: {value!r} (expected true or false)")


def _whole_number(value: object, minimum: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"not a whole number: {value!r}") from None
    if number < minimum:
        raise ConfigError(f"must be at least {minimum}: {value!r}")
    return number


def _positive_int(value: object) -> int:
    return _whole_number(value, 1)


def _non_negative_int(value: object) -> int:
    return _whole_number(value, 0)


def _fraction(value: object) -> float:
    try:
        number = float(str(value))
    except ValueError:
        raise ConfigError(f"not a number: {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise ConfigError(f"must be between 0 and 1: {value!r}")
    return number


def _layout_name(value: object) -> str:
    name = str(value).strip().lower()
    if name not in ("aiven", "plain"):
        raise ConfigError(f"unknown key layout {value!r} (expected aiven or plain)")
    return name


def parse_path_list(value: object) -> tuple[Path, ...]:
    """A TOML list, repeated flags, or a comma-separated env var -> paths."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(Path(str(item).strip()) for item in items if str(item).strip())


def parse_ionice(value: object) -> tuple[str, int] | None:
    """`best-effort:7`, `idle`, `realtime:0` or `none` -> (class, level)."""
    text = str(value).strip().lower()
    if text in ("", "none"):
        return None
    name, _, level = text.partition(":")
    if name not in ("best-effort", "idle", "realtime") or (level and not level.isdigit()):
        raise ConfigError(f"not an I/O priority: {value!r} (expected e.g. best-effort:7 or idle)")
    number = int(level) if level else 4
    if not 0 <= number <= 7:
        raise ConfigError(f"I/O priority level must be 0..7: {value!r}")
    return name, number


def _nice(value: object) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"not a nice value: {value!r}") from None
    if not -20 <= number <= 19:
        raise ConfigError(f"nice must be between -20 and 19: {value!r}")
    return number


def _optional_str(value: object) -> str | None:
    text = str(value).strip()
    return text or None


def _log_format(value: object) -> str:
    name = str(value).strip().lower()
    if name not in ("auto", "json", "text"):
        raise ConfigError(f"unknown log format {value!r} (expected auto, json or text)")
    return name


def _optional_bool(value: object) -> bool | None:
    return None if str(value).strip() == "" else parse_bool(value)


# AWS access key ids are letters and digits; a little wider is allowed for
# other S3 implementations, but never a separator of the formats below.
_ACCESS_KEY_RE = re.compile(r"^[A-Za-z0-9_.+=@-]{1,128}$")


def parse_auth_keys(value: object) -> dict[str, str]:
    """`{AKID = "SECRET"}` (TOML) or `AKID:SECRET,AKID2:SECRET2` (env) -> {akid: secret}.

    Error messages name an entry by its position only: a malformed entry may
    well be a secret pasted on its own.
    """
    if isinstance(value, dict):
        pairs: list[tuple[str, object]] = [(str(akid), secret) for akid, secret in value.items()]
    else:
        pairs = [_split_pair(entry) for entry in str(value).split(",") if entry.strip()]
    return _key_table(pairs, "entry")


def _split_pair(text: str) -> tuple[str, object]:
    akid, sep, secret = text.strip().partition(":")
    return (akid, secret) if sep else ("", None)


def read_auth_keys_file(path: Path) -> dict[str, str]:
    """A file of `AKID:SECRET` lines; blank lines and `#` comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"auth_keys_file: cannot read {path}: {reason}") from None
    pairs = [
        _split_pair(line) for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    try:
        return _key_table(pairs, "key line")
    except ConfigError as exc:
        raise ConfigError(f"auth_keys_file {path}: {exc}") from None


def _key_table(pairs: Sequence[tuple[str, object]], unit: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for number, (akid, secret) in enumerate(pairs, 1):
        akid = akid.strip()
        if secret is None or not _ACCESS_KEY_RE.match(akid):
            raise ConfigError(
                f"{unit} {number}: not AKID:SECRET (the access key id must be 1-128 letters, "
                "digits or _.+=@-)"
            )
        if not isinstance(secret, str) or not secret.strip():
            raise ConfigError(f"{unit} {number}: the secret must be a non-empty string")
        if akid in keys:
            raise ConfigError(f"{unit} {number}: an access key id is given twice")
        keys[akid] = secret.strip()
    return keys


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

    @property
    def env(self) -> str:
        return "SIDECAR_" + self.name.upper()

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("listen", parse_host_port, "127.0.0.1:9330", "data port (S3 API) address", "H:P"),
    Option("admin_listen", parse_host_port, "127.0.0.1:9331", "admin port address", "H:P"),
    Option("admin_token", _optional_str, "",
           "bearer token for mutating admin calls (required off loopback)", "TOKEN",
           secret=True),
    Option("origin_endpoint", _optional_str, "",
           "object store URL (default: AWS from the region)", "URL"),
    Option("origin_region", str, "us-east-1", "object store region", "R"),
    Option("origin_max_connections", _positive_int, 32,
           "bound of the origin connection pool", "N", flag=False),
    Option("origin_connect_timeout", parse_duration, "2s",
           "origin connect timeout", "DURATION", flag=False),
    Option("origin_read_timeout", parse_duration, "15s",
           "origin read timeout (per socket read)", "DURATION", flag=False),
    Option("origin_retries", _non_negative_int, 3,
           "retries of a failed origin call, with jittered backoff", "N", flag=False),
    Option("origin_check", parse_bool, True,
           "refuse to start when the origin does not answer", "BOOL", flag=False),
    Option("head_ttl", parse_duration, "30s",
           "how long an object's size and ETag are remembered", "DURATION", flag=False),
    Option("origin_deadline", parse_duration, "10s",
           "an origin read that gets no byte for this long, retries included, fails (503); "
           "one attempt waits at most half of it", "DURATION", flag=False),
    Option("head_stale_if_error", parse_duration, "10m",
           "while the origin fails, an object's last known size and ETag are used this long",
           "DURATION", flag=False),
    Option("origin_breaker_failures", _non_negative_int, 5,
           "consecutive origin failures that open the circuit breaker (0: no breaker)", "N",
           flag=False),
    Option("origin_breaker_ratio", _fraction, 0.5,
           "share of failed origin calls in the window that opens the breaker", "F",
           flag=False),
    Option("origin_breaker_window", parse_duration, "30s",
           "window of the breaker's failure ratio", "DURATION", flag=False),
    Option("origin_breaker_cooldown", parse_duration, "5s",
           "an open breaker lets a probe through after this long", "DURATION", flag=False),
    Option("listing_ttl", parse_duration, "30s",
           "how long a partition's segment listing is remembered", "DURATION", flag=False),
    Option("cache_dir", _optional_str, "",
           "directory of the slab file (a dedicated disk)", "DIR"),
    Option("cache_size", parse_size, "1GiB", "bytes of cache to preallocate", "SIZE"),
    Option("block_size", parse_size, "8MiB", "cache block and origin alignment size", "SIZE"),
    Option("max_coalesce", parse_size, "64MiB",
           "largest single origin GET for adjacent missing blocks", "SIZE", flag=False),
    Option("io_threads", _positive_int, 4,
           "threads of the disk executor (slab copies, checksums)", "N", flag=False),
    Option("prefetch", parse_bool, True,
           "sequential read-ahead (--no-prefetch turns it off)", "BOOL", flag=False),
    Option("prefetch_max_window", parse_size, "64MiB",
           "largest read-ahead of one stream", "SIZE", flag=False),
    Option("prefetch_max_in_flight", _positive_int, 16,
           "prefetch blocks being fetched at once (bounds memory)", "N", flag=False),
    Option("prefetch_cache_share", _fraction, 0.25,
           "share of the cache that prefetched, not yet read blocks may fill", "F", flag=False),
    Option("stream_idle", parse_duration, "60s",
           "a read head with no request for this long is forgotten", "DURATION", flag=False),
    Option("layout", _layout_name, "aiven",
           "object key layout: aiven (segments found for cross-segment prefetch) or plain",
           "NAME", flag=False),
    Option("layout_prefix", str, "", "key prefix of the tiered-storage plugin", "P", flag=False),
    Option("cpus", parse_cpu_list, "", "pin the process to these CPUs, e.g. 2-3", "LIST"),
    Option("ionice", parse_ionice, "none",
           "I/O scheduling class and level, e.g. best-effort:7 or idle", "CLASS[:N]"),
    Option("nice", _nice, 0, "CPU scheduling niceness (0 leaves it as it is)", "N"),
    Option("origin_bandwidth", parse_rate, "unlimited",
           "total origin read budget, e.g. 200MiB/s (shared by the lanes)", "RATE"),
    Option("prefetch_share", _fraction, 0.6,
           "share of the origin budget read-ahead may use", "F", flag=False),
    Option("warm_share", _fraction, 0.4,
           "share of the origin budget warm-up may use", "F", flag=False),
    Option("warm_concurrency", _positive_int, 4,
           "origin connections warm-up may hold at once", "N", flag=False),
    Option("max_requests", _positive_int, 256,
           "client requests served at once; more get 503 SlowDown", "N", flag=False),
    Option("max_buffered", parse_size, "512MiB",
           "bytes of fetched blocks held for readers; more get 503 SlowDown", "SIZE",
           flag=False),
    Option("client_timeout", parse_duration, "30s",
           "a client that takes no bytes for this long is cut off", "DURATION", flag=False),
    Option("protect_path", parse_path_list, "",
           "refuse a cache dir on the same device as this path (repeatable), e.g. log.dirs",
           "PATH", kind="list"),
    Option("allow_shared_disk", parse_bool, False,
           "allow the cache on the same device as a --protect-path", "", kind="switch"),
    Option("disk_reserve", parse_size, "1GiB",
           "free space kept on the cache disk; below it the cache shrinks", "SIZE", flag=False),
    Option("disk_check_interval", parse_duration, "5s",
           "how often free space and a failed disk are checked", "DURATION", flag=False),
    Option("preallocate", parse_bool, True,
           "reserve the whole cache on disk at start (false: a sparse slab)", "BOOL",
           flag=False),
    Option("drop_written_pages", parse_bool, True,
           "advise the kernel to drop slab pages after writing them", "BOOL", flag=False),
    Option("scrub_rate", parse_rate, "64MiB/s",
           "after a restart, verify the recovered blocks' data in the background at this "
           "disk read rate (0: only when read)", "RATE", flag=False, group="cache"),
    Option("access_log", _optional_str, "",
           "JSON-lines access log, one line per request: a file path, or - for stdout",
           "PATH|-"),
    Option("log_format", _log_format, "auto",
           "stderr log lines: json (one object per line), text, or auto (text on a terminal, "
           "else json)", "auto|json|text"),
    # Data-port SigV4 verification ([auth] in TOML). Keys never go on the command
    # line, where any user of the host can read them from ps.
    Option("auth_keys", parse_auth_keys, "",
           "access keys whose SigV4 signatures the data port accepts: a TOML table "
           "{AKID = \"SECRET\"} or AKID:SECRET,AKID2:SECRET2", "KEYS", flag=False, secret=True),
    Option("auth_keys_file", _optional_str, "",
           "a file of AKID:SECRET lines (e.g. a Kubernetes Secret mount), added to auth_keys",
           "PATH", flag=False),
    Option("auth_allow_anonymous", _optional_bool, "",
           "serve unsigned requests (default: true when no keys are configured); next to "
           "access keys they may only read (GET/HEAD of objects and their sub-resources, "
           "listings, HeadBucket, GetBucketLocation, ListBuckets): writes and deletes need a "
           "signature, as they reach the origin with the sidecar's credentials", "BOOL",
           flag=False),
)
_BY_NAME = {option.name: option for option in OPTIONS}
MIN_BLOCK_SIZE = 64 * 1024
MAX_BLOCK_SIZE = 256 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    listen: HostPort
    admin_listen: HostPort
    admin_token: str | None = field(repr=False)  # a secret: kept out of reprs
    cpus: tuple[int, ...] | None
    io_threads: int
    ionice: tuple[str, int] | None
    nice: int
    max_requests: int
    max_buffered_bytes: int
    client_timeout_s: float
    access_log: str | None = None  # a path, "-" for stdout, None: no access log
    log_format: str = "auto"  # auto | json | text (cli.py sets logging up with it)


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
    deadline_s: float = 10.0
    head_stale_if_error_s: float = 600.0
    breaker_failures: int = 5
    breaker_ratio: float = 0.5
    breaker_window_s: float = 30.0
    breaker_cooldown_s: float = 5.0


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
    preallocate: bool
    scrub_rate: int | None = None  # bytes/s; None: recovered blocks are verified when read


@dataclass(frozen=True)
class PrefetchConfig:
    enabled: bool
    max_window_blocks: int
    max_in_flight: int
    cache_share: float
    stream_idle_s: float
    layout: str
    layout_prefix: str


@dataclass(frozen=True)
class AuthConfig:
    """Data-port SigV4 verification: the accepted keys, and whether unsigned requests pass."""

    keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    allow_anonymous: bool = True


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    origin: OriginConfig
    cache: CacheConfig
    prefetch: PrefetchConfig
    auth: AuthConfig = AuthConfig()


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc


def flatten_sections(file_values: Mapping[str, Any]) -> dict[str, Any]:
    """TOML tables name groups of options: `[auth] keys = ...` is the option `auth_keys`.

    Only a table whose name starts known options is read this way, so a table
    that is itself one option's value (a mapping) is left alone.
    """
    flat: dict[str, Any] = {}
    for name, value in file_values.items():
        if (isinstance(value, dict) and name not in _BY_NAME
                and any(option.startswith(name + "_") for option in _BY_NAME)):
            for inner, inner_value in value.items():
                flat[f"{name}_{inner}"] = inner_value
        else:
            flat[name] = value
    return flat


@dataclass(frozen=True)
class Setting:
    """One option's effective value: as given (`raw`), as parsed, and where it came from."""

    option: Option
    raw: object = field(repr=False)
    value: Any = field(repr=False)
    source: str  # "flag", "env", "file" or "default"


def resolve(
    flags: Mapping[str, object], env: Mapping[str, str], file_values: Mapping[str, Any]
) -> dict[str, Setting]:
    """Merge the three sources (flag > env > file > default) and parse each option once.

    `flags` holds only the flags that were given, keyed by option name.
    """
    file_values = flatten_sections(file_values)
    unknown = sorted(set(file_values) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r} (known: {', '.join(_BY_NAME)})")
    settings: dict[str, Setting] = {}
    for option in OPTIONS:
        if option.name in flags:
            raw, source, where = flags[option.name], "flag", option.cli
        elif option.env in env:
            raw, source, where = env[option.env], "env", option.env
        elif option.name in file_values:
            raw, source, where = file_values[option.name], "file", f"config key {option.name}"
        else:
            raw, source, where = option.default, "default", f"default of {option.name}"
        try:
            settings[option.name] = Setting(option, raw, option.parse(raw), source)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return settings


def load_config(
    flags: Mapping[str, object], env: Mapping[str, str], file_values: Mapping[str, Any]
) -> Config:
    """Merge the three sources (see `resolve`) and validate them together."""
    return build_config(resolve(flags, env, file_values))


def build_config(settings: Mapping[str, Setting]) -> Config:
    return _build({name: setting.value for name, setting in settings.items()})


def _build(v: Mapping[str, Any]) -> Config:
    block_size: int = v["block_size"]
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size % 4096:
        raise ConfigError(
            f"--block-size must be a multiple of 4KiB between 64KiB and 256MiB, got {block_size}"
        )
    if v["cache_dir"] is None:
        raise ConfigError("--cache-dir is required (a directory on the cache disk)")
    if v["cache_size"] < block_size + 4096:
        raise ConfigError(
            f"--cache-size {v['cache_size']} cannot hold one block of {block_size} bytes"
        )
    max_coalesce = max(block_size, v["max_coalesce"] - v["max_coalesce"] % block_size)
    # Foreground keeps connections of its own: a miss never waits for one that
    # read-ahead or warm-up holds.
    lower_lanes = v["prefetch_max_in_flight"] + v["warm_concurrency"]
    if lower_lanes > v["origin_max_connections"] - 4:
        raise ConfigError(
            f"prefetch_max_in_flight + warm_concurrency ({lower_lanes}) must leave at least 4 of "
            f"origin_max_connections ({v['origin_max_connections']}) to foreground reads"
        )
    if v["origin_deadline"] <= 0:
        raise ConfigError("origin_deadline must be more than 0 (every origin read would fail)")
    admin: HostPort = v["admin_listen"]
    if not admin.is_loopback and v["admin_token"] is None:
        raise ConfigError(
            f"--admin-listen {admin} is not loopback: set --admin-token to protect the admin port"
        )
    auth = _build_auth(v)
    return Config(
        auth=auth,
        server=ServerConfig(
            listen=v["listen"], admin_listen=admin, admin_token=v["admin_token"],
            cpus=v["cpus"], io_threads=v["io_threads"], ionice=v["ionice"], nice=v["nice"],
            max_requests=v["max_requests"], max_buffered_bytes=v["max_buffered"],
            client_timeout_s=v["client_timeout"], access_log=v["access_log"],
            log_format=v["log_format"],
        ),
        origin=OriginConfig(
            endpoint=v["origin_endpoint"], region=v["origin_region"],
            max_connections=v["origin_max_connections"],
            connect_timeout_s=v["origin_connect_timeout"],
            read_timeout_s=v["origin_read_timeout"], retries=v["origin_retries"],
            check_on_start=v["origin_check"], head_ttl_s=v["head_ttl"],
            listing_ttl_s=v["listing_ttl"], bandwidth=v["origin_bandwidth"],
            prefetch_share=v["prefetch_share"] or 1.0, warm_share=v["warm_share"] or 1.0,
            warm_concurrency=v["warm_concurrency"],
            deadline_s=v["origin_deadline"], head_stale_if_error_s=v["head_stale_if_error"],
            breaker_failures=v["origin_breaker_failures"],
            breaker_ratio=v["origin_breaker_ratio"],
            breaker_window_s=v["origin_breaker_window"],
            breaker_cooldown_s=v["origin_breaker_cooldown"],
        ),
        cache=CacheConfig(
            directory=Path(v["cache_dir"]), size_bytes=v["cache_size"],
            block_size=block_size, max_coalesce_bytes=max_coalesce,
            protect_paths=v["protect_path"], allow_shared_disk=v["allow_shared_disk"],
            disk_reserve_bytes=v["disk_reserve"], disk_check_interval_s=v["disk_check_interval"],
            drop_written_pages=v["drop_written_pages"], preallocate=v["preallocate"],
            scrub_rate=v["scrub_rate"],
        ),
        prefetch=PrefetchConfig(
            enabled=v["prefetch"], max_window_blocks=max(1, v["prefetch_max_window"] // block_size),
            max_in_flight=v["prefetch_max_in_flight"], cache_share=v["prefetch_cache_share"],
            stream_idle_s=v["stream_idle"], layout=v["layout"], layout_prefix=v["layout_prefix"],
        ),
    )


def _build_auth(v: Mapping[str, Any]) -> AuthConfig:
    keys: dict[str, str] = dict(v["auth_keys"])
    if v["auth_keys_file"] is not None:
        for akid, secret in read_auth_keys_file(Path(v["auth_keys_file"])).items():
            if keys.get(akid, secret) != secret:
                raise ConfigError(
                    "auth_keys and auth_keys_file give different secrets for one access key id"
                )
            keys[akid] = secret
    allow_anonymous: bool | None = v["auth_allow_anonymous"]
    if allow_anonymous is None:
        # No keys: nothing to check signatures against, so every request is
        # served as before auth existed.
        allow_anonymous = not keys
    elif not allow_anonymous and not keys:
        raise ConfigError(
            "auth_allow_anonymous = false needs access keys (auth_keys or auth_keys_file): "
            "no request could be served"
        )
    return AuthConfig(keys=keys, allow_anonymous=allow_anonymous)
