"""Parsing one option's value: sizes, rates, durations, addresses, CPU lists,
priorities, access keys. Pure; each parser raises ConfigError with what it
expected, and the loader adds where the value came from."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

from sidecar.bucket_names import bucket_name_problem
from sidecar.errors import ConfigError
from sidecar.layout import Layout

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
# Past any disk or memory a sidecar is given, and well inside the 64-bit
# fields the slab's headers keep sizes in.
MAX_SIZE = 2**60
# Past any timeout, interval or lifetime an option means (1000 days).
MAX_DURATION_S = 1000 * 86400.0
# Linux's largest NR_CPUS is 8192.
MAX_CPU = 8191
# re.ASCII: \d would also take other scripts' digits ("٣MiB"), and int() and
# float() take those and "1_000" too; an operator's number is ASCII decimal.
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.ASCII)
_WHOLE_RE = re.compile(r"\s*[+-]?[0-9]+\s*")
_DECIMAL_RE = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
_DURATION_UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "h": 3600.0}


def parse_size(value: object) -> int:
    """`8MiB`, `10GiB`, `500MB`, `4096` -> bytes (binary units are powers of 1024)."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {shown(value)}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"size must not be negative: {shown(value)}")
        return _bounded_size(value, value)
    return _bounded_size(_size_amount(value), value)


def _size_amount(value: object) -> Decimal:
    """The bytes a size's text says, exactly (a float would overflow, or round)."""
    match = _SIZE_RE.match(str(value))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ConfigError(f"not a size: {shown(value)} "
                          "(expected e.g. 8MiB, 10GiB, 500MB or bytes)")
    return Decimal(match.group(1)) * _SIZE_UNITS[unit]


def _bounded_size(amount: int | Decimal, value: object) -> int:
    if amount > MAX_SIZE:
        raise ConfigError(f"too large a size: {shown(value)} (at most 1EiB)")
    return int(amount)


def shown(value: object) -> str:
    """A value as an error message quotes it: whole, or its start when long."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def parse_size_or_auto(value: object) -> int | None:
    """A size as ``parse_size``, or `auto` -> None (the default derived from other options)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    return parse_size(value)


def parse_rate(value: object) -> int | None:
    """`100MiB/s` -> bytes per second; `unlimited` or 0 -> None."""
    text = str(value).strip()
    if text.lower() in ("unlimited", "none", "0", ""):
        return None
    if not text.endswith("/s"):
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise ConfigError(f"a rate must not be negative: {shown(value)}")
            return _bounded_size(value, value) or None
        raise ConfigError(f"not a rate: {shown(value)} (expected e.g. 100MiB/s or unlimited)")
    amount = _size_amount(text[:-2])
    if 0 < amount < 1:
        # Would round to 0, which means no limit at all.
        raise ConfigError(f"a rate of less than a byte a second: {shown(value)}")
    return _bounded_size(amount, value) or None


def parse_duration(value: object) -> float:
    """`30s`, `500ms`, `2m`, `1.5` (seconds) -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value))
        if match is None:
            raise ConfigError(f"not a duration: {value!r} (expected e.g. 30s, 500ms, 2m)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(f"not a duration: {shown(value)} (not a finite number)")
    if seconds < 0:
        raise ConfigError(f"duration must not be negative: {shown(value)}")
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"too long a duration: {shown(value)} (at most 1000 days)")
    return seconds


def parse_sample_interval(value: object) -> float:
    """A duration from 50ms to 1m: the admin port's sampler runs on the event loop,
    and a minute is as coarse as a chart of the last minutes can be."""
    seconds = parse_duration(value)
    if not 0.05 <= seconds <= 60:
        raise ConfigError(f"must be between 50ms and 1m: {value!r}")
    return seconds


def parse_stop_timeout(value: object) -> float:
    """A duration from 100ms to 1h: a stop must get some time to save the
    index snapshot, and one that may take longer is no bound at all."""
    seconds = parse_duration(value)
    if not 0.1 <= seconds <= 3600:
        raise ConfigError(f"must be between 100ms and 1h: {value!r}")
    return seconds


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        # An IPv6 address is bracketed, as in a URL's authority (RFC 3986 section 3.2.2).
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}"

    @property
    def is_loopback(self) -> bool:
        """Whether it listens on loopback only: an address in 127.0.0.0/8 or
        ::1, or localhost. A name that merely starts like one
        (127.example.net) is not."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_host_port(value: object) -> HostPort:
    host, sep, port = str(value).strip().rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if bracketed:
        host = host[1:-1]
    elif ":" in host and "[" not in host and "]" not in host:
        # `::1` would be host `:` and port 1, `fe80::1:9330` either of two
        # addresses: the brackets say where the address ends (RFC 3986).
        raise ConfigError(f"not a HOST:PORT address: {value!r} (an IPv6 address is written "
                          "in brackets, e.g. [::1]:9330)")
    if not sep or not host or "[" in host or "]" in host or not _digits(port) \
            or int(port) > 65535:
        raise ConfigError(f"not a HOST:PORT address: {value!r}")
    return HostPort(host, int(port))


def parse_optional_host_port(value: object) -> HostPort | None:
    """A HOST:PORT address, or None for an empty value (the listener is off)."""
    if value is None or str(value).strip() == "":
        return None
    return parse_host_port(value)


def parse_cpu_list(value: object) -> tuple[int, ...] | None:
    """`2-3`, `0,2,4-5` -> CPU ids; empty -> None (no pinning)."""
    text = str(value).strip()
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not _digits(lo) or (dash and not _digits(hi)):
            raise ConfigError(f"not a CPU list: {value!r} (expected e.g. 2-3 or 0,2,4-5)")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last > MAX_CPU:
            raise ConfigError(f"not a CPU list: {shown(value)} (CPU {last} is past any "
                              f"machine's: at most {MAX_CPU})")
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


def _whole(value: object) -> int | None:
    """An integer, or ASCII decimal text of one; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if not _WHOLE_RE.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # past int()'s 4300 digits
        return None


def whole_number(value: object, minimum: int) -> int:
    number = _whole(value)
    if number is None:
        raise ConfigError(f"not a whole number: {shown(value)}")
    if number < minimum:
        raise ConfigError(f"must be at least {minimum}: {shown(value)}")
    return number


def positive_int(value: object) -> int:
    return whole_number(value, 1)


def non_negative_int(value: object) -> int:
    return whole_number(value, 0)


def fraction(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif _DECIMAL_RE.fullmatch(str(value)):
        number = float(str(value))
    else:
        raise ConfigError(f"not a number: {shown(value)}")
    if not 0.0 <= number <= 1.0:
        raise ConfigError(f"must be between 0 and 1: {shown(value)}")
    return number


def parse_layout_name(value: object) -> Layout:
    if isinstance(value, Layout):
        return value
    name = str(value).strip().lower()
    try:
        return Layout(name)
    except ValueError:
        raise ConfigError(f"unknown key layout {value!r} (expected aiven or plain)") from None


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
    if name not in ("best-effort", "idle", "realtime") or (level and not _digits(level)):
        raise ConfigError(f"not an I/O priority: {value!r} (expected e.g. best-effort:7 or idle)")
    if name == "idle" and level:
        # ioprio_set(2): the idle class has no levels; one given would do nothing.
        raise ConfigError(f"not an I/O priority: {value!r} (the idle class takes no level: "
                          "give idle)")
    number = int(level) if level else 4
    if not 0 <= number <= 7:
        raise ConfigError(f"I/O priority level must be 0..7: {value!r}")
    return name, number


def parse_nice(value: object) -> int:
    number = _whole(value)
    if number is None:
        raise ConfigError(f"not a nice value: {shown(value)}")
    if not -20 <= number <= 19:
        raise ConfigError(f"nice must be between -20 and 19: {value!r}")
    return number


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix at the origin ("" or ending in "/")."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_s3_location(value: object) -> S3Location | None:
    """`s3://bucket/prefix/` -> S3Location; empty -> None. The prefix gets a
    trailing "/" so that every node's objects go under a folder of their own."""
    text = str(value).strip()
    if not text:
        return None
    bucket, _, prefix = text.removeprefix("s3://").partition("/")
    if not text.startswith("s3://") or bucket_name_problem(bucket) is not None:
        raise ConfigError(f"not an s3://BUCKET/PREFIX location: {value!r} "
                          "(expected e.g. s3://kafka-logs/sidecar-access/)")
    prefix = prefix.strip("/")
    return S3Location(bucket, prefix + "/" if prefix else "")


def optional_str(value: object) -> str | None:
    text = str(value).strip()
    return text or None


# A node's name is one path segment of the shipped logs' keys (PREFIX/NODE/...).
MAX_NODE_NAME_CHARS = 255


def parse_node_name(value: object) -> str | None:
    """This node's name, or None (empty: the host name). It names the node's
    folder of shipped access logs (sidecar.telemetry.log_shipping), so it is
    refused where no folder could be named by it: "." and ".." (a client or
    proxy normalising the URL would climb out of the prefix), a control
    character, or a name longer than a file system's."""
    text = optional_str(value)
    if text is None:
        return None
    if text in (".", ".."):
        raise ConfigError(f"{text!r} cannot name a folder of shipped access logs")
    if not text.isprintable():
        raise ConfigError(f"a control character in {shown(value)}: a node's name "
                          "names its folder of shipped access logs")
    if len(text) > MAX_NODE_NAME_CHARS:
        raise ConfigError(f"{len(text)} characters: a node's name names its folder of "
                          f"shipped access logs, at most {MAX_NODE_NAME_CHARS}")
    return text


def parse_admin_token(value: object) -> str | None:
    """The admin token, or None (empty): one line of printable ASCII without
    spaces, as every client takes it (sidecar.admin.token). Any other token would
    be accepted here and then match no request: HTTP drops a header's outer
    spaces, clients refuse to send it, a non-ASCII byte makes the header a 400.
    The value is never echoed: it is a secret."""
    text = optional_str(value)
    if text is not None and not (text.isprintable() and text.isascii() and " " not in text):
        raise ConfigError("not one token (a single line of printable ASCII without spaces; "
                          "the value is not shown)")
    return text


def parse_http_url(value: object, *, bare_host: bool = False) -> str:
    """An http(s) URL with a host (and a valid port, if any); ``bare_host``:
    HOST:PORT without a scheme is taken as http://HOST:PORT."""
    text = str(value).strip()
    url = f"http://{text}" if bare_host and "://" not in text else text
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (urlsplit checks the port only when asked)
    except ValueError as exc:
        raise ConfigError(f"not a URL: {shown(value)} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"not an http(s) URL: {shown(value)} "
                          "(expected e.g. https://s3.eu-west-1.amazonaws.com)")
    return url


def parse_optional_http_url(value: object) -> str | None:
    """``parse_http_url``, or None for an empty value."""
    return None if optional_str(value) is None else parse_http_url(value)


def parse_log_format(value: object) -> str:
    name = str(value).strip().lower()
    if name not in ("auto", "json", "text"):
        raise ConfigError(f"unknown log format {value!r} (expected auto, json or text)")
    return name


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


def parse_auth_keys_file(text: str, path: Path) -> dict[str, str]:
    """The text of a file of `AKID:SECRET` lines; blank lines and `#` comments
    are skipped. `path` only names the file in errors."""
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


_SCOPE_MODES = {"read": False, "read-write": True}


@dataclass(frozen=True)
class KeyScope:
    """What one configured access key may do: the buckets (empty: every bucket
    the sidecar serves) and whether it may write."""

    buckets: tuple[str, ...]
    write: bool


def parse_bucket_list(value: object) -> tuple[str, ...]:
    """A TOML list or a comma-separated string of bucket names (empty: none given)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    buckets: list[str] = []
    for item in items:
        name = str(item).strip()
        if not name:
            continue
        # S3's rules, the legacy ones of us-east-1 (upper case, '_') included:
        # buckets named by them exist (sidecar.bucket_names).
        if (problem := bucket_name_problem(name)) is not None:
            raise ConfigError(f"{name[:70]!r} is {problem}")
        if name not in buckets:
            buckets.append(name)
    return tuple(buckets)


def parse_key_scopes(value: object) -> dict[str, KeyScope]:
    """`{AKID = "read:bucket-a,bucket-b"}` (TOML) or `AKID=read-write;AKID2=read:b`
    (env) -> {akid: KeyScope}. The mode is `read` or `read-write`; the buckets
    after a colon narrow the key to them (none: every served bucket)."""
    if isinstance(value, dict):
        pairs = [(str(akid), str(scope)) for akid, scope in value.items()]
    else:
        pairs = []
        for entry in str(value).split(";"):
            if entry.strip():
                akid, sep, scope = entry.partition("=")
                if not sep:
                    raise ConfigError(f"{entry.strip()[:70]!r} is not AKID=MODE[:BUCKET,...]")
                pairs.append((akid, scope))
    scopes: dict[str, KeyScope] = {}
    for akid, scope in pairs:
        akid = akid.strip()
        if not _ACCESS_KEY_RE.match(akid):
            raise ConfigError(f"{akid[:70]!r} is not an access key id")
        mode, _, buckets = scope.strip().partition(":")
        if mode.strip() not in _SCOPE_MODES:
            raise ConfigError(f"the scope of {akid} must start with read or read-write, "
                              f"got {mode.strip()[:30]!r}")
        if akid in scopes:
            raise ConfigError(f"the scope of {akid} is given twice")
        scopes[akid] = KeyScope(parse_bucket_list(buckets), _SCOPE_MODES[mode.strip()])
    return scopes


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes "²" and other scripts' digits."""
    return text.isascii() and text.isdigit()
