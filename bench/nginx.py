"""nginx instances for the benchmark: the origin emulator, the slice cache and the
local-file server, each generated from a template and run as a child process.

Every instance has its own prefix directory (config, pid file, logs, temp paths,
cache), listens on a free 127.0.0.1 port and runs in the foreground
(`daemon off;`) in its own process group, so stopping it can never touch the
system nginx or another instance.

The origin emulator (docs/ARCHITECTURE.md, "Benchmark origin model"): first byte after
30 ms, 64 MB/s per connection, real HTTP range semantics. Objects go through

    location /tiered/ { echo_sleep 0.03; echo_exec @obj; }
    location @obj     { root DATA; limit_rate 64m; sendfile_max_chunk 268436; }

`echo_exec` to a named location is an internal redirect of the main request
(not a subrequest), so the static handler, the range filter and the
not-modified filter (If-Match, If-None-Match, If-Unmodified-Since) all run as
for a plain static location; HEAD works too. (nginx sends Accept-Ranges with
200 only; S3 also with 206, so it is added when the request has a Range.)
`sendfile_max_chunk` matters: nginx paces `limit_rate` by sleeping *after* each send for
bytes_sent / rate (in whole milliseconds), and by default one send may push
2 MiB into a loopback socket, so a 1 MiB response would arrive in one burst at
30 ms and the rate limit would only show on long transfers. With sends of
64 MiB/s x 4 ms = 268436 bytes, each send is followed by a 4 ms pause: a 1 MiB
range takes ~43 ms, an 8 MiB range ~160 ms, a 64 MiB object ~1.05 s
(measured: ~64 MB/s after the first byte).

nginx cannot list, so ListObjectsV2 answers (`GET /tiered?list-type=2&prefix=P`,
optionally `&delimiter=/`, or `&start-after=K` for a partition's prefix as the
sidecar looks for a next segment) are pre-generated files chosen by a `map` from
the raw (still percent-encoded) `$arg_prefix` and `start-after`; a start-after
no file was written for is 501. `GET /` answers ListBuckets (the sidecar's
start-up check).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.dataset import AFTER_SEPARATOR, BUCKET, S3_XMLNS, delimited_listing_name
from sidecar.tools.ports import free_port

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
FIRST_BYTE_S = 0.03
ORIGIN_RATE = "64m"
#: Bytes per paced send at 64 MiB/s: 64 MiB/s x 4 ms, rounded up so that the
#: per-send pause nginx computes (truncated to whole ms) is exactly 4 ms.
ORIGIN_SEND_CHUNK = 268436
SLICE = "8m"

_NO_SUCH_KEY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>\n"
)
_NO_SUCH_BUCKET = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist.</Message>"
    "</Error>\n"
)
_NOT_IMPLEMENTED = (
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
    "<Error><Code>NotImplemented</Code><Message>The benchmark origin lists with list-type=2, "
    "prefix and delimiter / only.</Message></Error>"
)


def nginx_binary() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        raise RuntimeError("nginx is not installed: run `bash bench/install-deps.sh`")
    return found


def nginx_version() -> str:
    result = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True, timeout=10)
    return (result.stderr or result.stdout).strip().removeprefix("nginx version: ")


def echo_module_path() -> Path:
    """The echo module of Debian's nginx-light (libnginx-mod-http-echo)."""
    result = subprocess.run([nginx_binary(), "-V"], capture_output=True, text=True, timeout=10)
    match = re.search(r"--modules-path=(\S+)", result.stderr + result.stdout)
    directory = Path(match.group(1)) if match else Path("/usr/lib/nginx/modules")
    path = directory / "ngx_http_echo_module.so"
    if not path.exists():
        raise RuntimeError(
            f"{path} is missing: install libnginx-mod-http-echo (bench/install-deps.sh)")
    return path



def _quote(value: str) -> str:
    """An nginx config string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _main_section(prefix: Path, workers: str, modules: list[Path]) -> str:
    user = "user root root;\n" if os.geteuid() == 0 else ""
    loads = "".join(f"load_module {module};\n" for module in modules)
    return (
        f"{loads}daemon off;\nmaster_process on;\n{user}"
        f"worker_processes {workers};\n"
        f"pid {prefix}/nginx.pid;\n"
        f"error_log {prefix}/logs/error.log warn;\n"
        "events { worker_connections 4096; }\n"
    )


def _http_common(prefix: Path) -> str:
    return f"""
    types {{ }}
    default_type binary/octet-stream;
    server_tokens off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 60s;
    keepalive_requests 100000;
    client_body_temp_path {prefix}/tmp/client_body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    log_format bench '$request_method $uri $status $body_bytes_sent $request_time "$http_range" '
                     '$connection $connection_requests';
"""


def _empty_listing(bucket: str) -> str:
    """The ListObjectsV2 answer for a prefix without a listing file; `\\n` and
    `$arg_prefix` are for nginx to expand."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\\n'
        f'<ListBucketResult xmlns="{S3_XMLNS}"><Name>{bucket}</Name>'
        "<Prefix>$arg_prefix</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
        "<IsTruncated>false</IsTruncated></ListBucketResult>\\n"
    )


def _bucket_locations(bucket: str, listings: Path) -> str:
    """`GET|HEAD /bucket` (HeadBucket, ListObjectsV2), with and without a trailing slash."""
    body = f"""
        default_type application/xml;
        if ($request_method = HEAD) {{ return 200; }}
        if ($args ~ "(^|&)(continuation-token|marker)=") {{
            return 501 '{_NOT_IMPLEMENTED}';
        }}
        if ($args !~ "(^|&)list-type=2(&|$)") {{ return 501 '{_NOT_IMPLEMENTED}'; }}
        if ($bench_delimiter = other) {{ return 501 '{_NOT_IMPLEMENTED}'; }}
        if ($bench_after_unknown) {{ return 501 '{_NOT_IMPLEMENTED}'; }}
        set $bench_file $bench_listing;
        if ($bench_delimiter = slash) {{ set $bench_file $bench_listing_slash; }}
        if ($bench_file = "") {{
            return 200 '{_empty_listing(bucket)}';
        }}
        rewrite ^ /_bench/$bench_file last;
"""
    return (
        f"        location = /{bucket} {{{body}        }}\n"
        f"        location = /{bucket}/ {{{body}        }}\n"
        f"        location /_bench/ {{ internal; alias {listings}/;"
        " default_type application/xml; }\n"
        "        location = / {\n"
        f"            if ($request_method = HEAD) {{ return 200; }}\n"
        f"            rewrite ^ /_bench/buckets.xml last;\n"
        "        }\n"
    )


def _listing_map(by_raw_prefix: Mapping[str, str]) -> str:
    """`$bench_listing`: the listing file of a prefix; `$bench_listing_slash`: the
    same prefix listed with `delimiter=/`; `$bench_delimiter`: none, slash or other."""
    # Keyed by "PREFIX|START_AFTER" (bench.dataset.write_listings): a plain
    # listing's start-after is empty.
    rows = "".join(
        f"        {_quote(raw if AFTER_SEPARATOR in raw else raw + AFTER_SEPARATOR)} {name};\n"
        for raw, name in sorted(by_raw_prefix.items())
    )
    slash_rows = "".join(
        f"        {_quote(raw)} {delimited_listing_name(name)};\n"
        for raw, name in sorted(by_raw_prefix.items()) if AFTER_SEPARATOR not in raw
    )
    return (
        # A "PREFIX|START_AFTER" key is two percent-encoded keys long.
        "    map_hash_bucket_size 512;\n"
        '    map $args $bench_start_after {\n        default "";\n'
        '        "~(^|&)start-after=(?<after>[^&]*)" $after;\n    }\n'
        f'    map "$arg_prefix{AFTER_SEPARATOR}$bench_start_after" $bench_listing {{\n'
        f'        default "";\n{rows}    }}\n'
        # A start-after that no file was written for: 501, never a wrong page.
        f'    map "$bench_start_after{AFTER_SEPARATOR}$bench_listing" $bench_after_unknown {{\n'
        f'        default 0;\n        "~^[^{AFTER_SEPARATOR}]+\\{AFTER_SEPARATOR}$" 1;\n    }}\n'
        f'    map $arg_prefix $bench_listing_slash {{\n        default "";\n{slash_rows}    }}\n'
        # map compares strings case-insensitively: "%2F" covers "%2f" too.
        '    map $arg_delimiter $bench_delimiter {\n        default other;\n'
        '        "" none;\n        "/" slash;\n        "%2F" slash;\n    }\n'
    )


def origin_config(
    prefix: Path,
    port: int,
    data_root: Path,
    listings: Path,
    by_raw_prefix: Mapping[str, str],
    *,
    bucket: str = BUCKET,
    first_byte_s: float | None = FIRST_BYTE_S,
    rate: str | None = ORIGIN_RATE,
    send_chunk: int = ORIGIN_SEND_CHUNK,
    workers: str = "1",
    access_log: bool = True,
) -> str:
    """The origin emulator; with `first_byte_s=None, rate=None` a plain static
    server of the same files (the local-file baseline)."""
    errors = prefix / "errors"
    errors.mkdir(parents=True, exist_ok=True)
    (errors / "NoSuchKey.xml").write_text(_NO_SUCH_KEY)
    (errors / "NoSuchBucket.xml").write_text(_NO_SUCH_BUCKET)
    modules = [echo_module_path()] if first_byte_s else []
    static = (
        f"root {data_root};\n"
        "            error_page 404 /_errors/NoSuchKey.xml;\n"
        # nginx sends Accept-Ranges with 200 only; S3 sends it with 206 too.
        "            add_header Accept-Ranges $bench_accept_ranges_206;\n"
    )
    if rate:
        static += f"            limit_rate {rate};\n            sendfile_max_chunk {send_chunk};\n"
    if first_byte_s:
        objects = (
            f"        location /{bucket}/ {{ echo_sleep {first_byte_s}; echo_exec @obj; }}\n"
            f"        location @obj {{\n            {static}        }}\n"
        )
    else:
        objects = f"        location /{bucket}/ {{\n            {static}        }}\n"
    log = f"access_log {prefix}/logs/access.log bench;" if access_log else "access_log off;"
    return (
        _main_section(prefix, workers, modules)
        + "http {"
        + _http_common(prefix)
        + f"    {log}\n"
        + _listing_map(by_raw_prefix)
        # add_header runs before the range filter turns 200 into 206, so key on
        # the request: with a Range header the answer is a 206 (or a 416, which
        # add_header skips); without one nginx adds Accept-Ranges itself.
        + '    map $http_range $bench_accept_ranges_206 { "" ""; default bytes; }\n'
        + "    server {\n"
        + f"        listen 127.0.0.1:{port} reuseport backlog=4096;\n"
        + _bucket_locations(bucket, listings)
        + objects
        + f"        location /_errors/ {{ internal; alias {errors}/;"
        + " default_type application/xml; }\n"
        + "        location / { error_page 404 /_errors/NoSuchBucket.xml; return 404; }\n"
        + "    }\n}\n"
    )


def slice_cache_config(
    prefix: Path,
    port: int,
    origin_url: str,
    cache_dir: Path,
    *,
    bucket: str = BUCKET,
    slice_size: str = SLICE,
    max_size: str = "8g",
    workers: str = "auto",
    cache_lock: bool = False,
) -> str:
    """nginx `slice` + `proxy_cache` in front of the origin.

    The directives of the issue (slice, proxy_cache_key with $slice_range, Range
    from $slice_range, 200/206 cached for 1 h, HTTP/1.1 upstream) plus upstream
    keep-alive. With `cache_lock`, also `proxy_cache_lock`: a miss on a slice
    being fetched waits for that fetch instead of fetching it again. That saves
    origin bytes, but nginx re-checks a held lock only every 500 ms
    (ngx_http_file_cache_lock_wait), which a broker-like reader, asking the
    next 1 MiB of the slice just being fetched, waits for on nearly every slice.
    Bucket-level requests (listing, HeadBucket) and ListBuckets are proxied
    uncached.
    """
    origin = origin_url.removeprefix("http://").rstrip("/")
    return (
        _main_section(prefix, workers, [])
        + "http {"
        + _http_common(prefix)
        + f"    access_log {prefix}/logs/access.log bench;\n"
        + f"    proxy_cache_path {cache_dir} levels=1:2 keys_zone=slices:64m max_size={max_size}"
        + " inactive=1d use_temp_path=off;\n"
        + f"    upstream origin {{ server {origin}; keepalive 32; }}\n"
        + "    server {\n"
        + f"        listen 127.0.0.1:{port} reuseport backlog=4096;\n"
        + "        proxy_http_version 1.1;\n"
        + '        proxy_set_header Connection "";\n'
        + "        proxy_set_header Host $http_host;\n"
        + f"        location = /{bucket} {{ proxy_pass http://origin; }}\n"
        + f"        location = /{bucket}/ {{ proxy_pass http://origin; }}\n"
        + "        location = / { proxy_pass http://origin; }\n"
        + f"        location /{bucket}/ {{\n"
        + f"            slice {slice_size};\n"
        + "            proxy_cache slices;\n"
        + "            proxy_cache_key $uri$is_args$args$slice_range;\n"
        + "            proxy_set_header Range $slice_range;\n"
        + "            proxy_cache_valid 200 206 1h;\n"
        + ("            proxy_cache_lock on;\n"
           "            proxy_cache_lock_timeout 30s;\n"
           "            proxy_cache_lock_age 30s;\n" if cache_lock else "")
        + "            proxy_pass http://origin;\n"
        + "        }\n"
        + "        location / { proxy_pass http://origin; }\n"
        + "    }\n}\n"
    )


class NginxServer:
    """One nginx instance in `prefix`; `render(port)` gives its config. With
    `cpus` (a taskset list, e.g. "1") nginx and its workers run on those CPUs."""

    def __init__(
        self, name: str, prefix: Path, render: Callable[[int], str], cpus: str | None = None
    ) -> None:
        self.name = name
        self.prefix = prefix
        self.render = render
        self.cpus = cpus
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The master's pid (taskset execs nginx, so the same process)."""
        return self._process.pid if self._process is not None else None

    @property
    def access_log(self) -> Path:
        return self.prefix / "logs" / "access.log"

    @property
    def error_log(self) -> Path:
        return self.prefix / "logs" / "error.log"

    def __enter__(self) -> NginxServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        for sub in ("logs", "tmp"):
            (self.prefix / sub).mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between probe and bind
            self.port = free_port()
            conf = self.prefix / "nginx.conf"
            conf.write_text(self.render(self.port))
            stderr_path = self.prefix / "logs" / "stderr.log"
            with open(stderr_path, "wb") as stderr:
                pin = ["taskset", "-c", self.cpus] if self.cpus else []
                self._process = subprocess.Popen(
                    [*pin, nginx_binary(), "-c", str(conf), "-p", f"{self.prefix}/",
                     "-e", str(self.error_log)],
                    stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                    start_new_session=True,
                )
            if self._wait_listening():
                return
            self.stop()
            last_error = stderr_path.read_text(errors="replace") + _tail(self.error_log)
            if "Address already in use" not in last_error:
                break
        raise RuntimeError(f"nginx {self.name} did not start:\n{last_error}")

    def _wait_listening(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)  # nginx: fast shutdown
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        # Workers, cache manager and loader are in the same process group.
        _signal_group(process.pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait(timeout=STOP_TIMEOUT_S)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class OriginTraffic:
    requests: int
    get_requests: int
    head_requests: int
    list_requests: int
    body_bytes: int


def origin_traffic(access_log: Path, offset: int = 0) -> tuple[OriginTraffic, int]:
    """What the origin sent since byte `offset` of its access log (format `bench`).

    Returns the totals and the new offset. `$body_bytes_sent` counts what nginx
    handed to the socket, so a response the client cut short still counts what
    was already on its way: origin egress, as an object store would bill it.
    """
    requests = gets = heads = lists = body = 0
    try:
        with open(access_log, "rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return OriginTraffic(0, 0, 0, 0, 0), offset
    end = offset + data.rfind(b"\n") + 1
    for line in data[: end - offset].decode(errors="replace").splitlines():
        parts = line.split(" ")
        if len(parts) < 4:
            continue
        method, uri, sent = parts[0], parts[1], parts[3]
        requests += 1
        if uri.startswith("/_bench/") or uri.count("/") < 2:
            lists += 1
        elif method == "HEAD":
            heads += 1
        elif method == "GET":
            gets += 1
        body += int(sent) if sent.isdigit() else 0
    return OriginTraffic(requests, gets, heads, lists, body), end
