"""`sidecar serve|demo|replay|stats|mode|purge`: the command line.

Every start-up failure ends in one line on stderr and an exit code that says
whether to retry: 2 for what only the operator can fix (a bad flag, size or
config key, an unusable cache dir), 75 (EX_TEMPFAIL, sysexits.h) when the
origin cannot be reached or no credentials can be found yet, which may pass by
itself (a network or instance metadata service not up at boot), so a service
manager restarts on 75 and not on 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

from sidecar import installed_version
from sidecar.admin.token import client_token
from sidecar.config import OPTIONS, Config, Setting, build_config, read_toml, resolve
from sidecar.config.loading import emptied_keys_file
from sidecar.config.parsing import parse_host_port, parse_http_url
from sidecar.config.reference import NEGATED_FLAGS, effective_values, render_effective
from sidecar.errors import ConfigError, MissingExtra, OriginUnavailable
from sidecar.isolation.modes import Mode
from sidecar.telemetry.logs import RequestIdFilter, choose_format, formatter_for

EXIT_USAGE = 2
EXIT_TEMPFAIL = 75


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sidecar", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_serve(commands)
    _add_demo(commands)
    _add_replay(commands)
    _add_stats(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[_Parser]) -> None:
    """`sidecar serve`: a flag for every option of the table that has one."""
    serve = commands.add_parser("serve", help="serve S3 range reads through the block cache")
    serve.add_argument("--config", type=Path, help="TOML file (keys named like the flags)")
    serve.add_argument(
        "--check-config", action="store_true",
        help="load and validate the configuration (flags, env, file) as serve does, print "
             "the effective values (secrets as <set>/<unset>) and exit; binds no port, "
             "contacts no origin, leaves the cache dir alone")
    serve.add_argument(NEGATED_FLAGS["prefetch"], dest="prefetch", action="store_const",
                       const=False, default=argparse.SUPPRESS,
                       help="no sequential read-ahead (env SIDECAR_PREFETCH=false)")
    for option in OPTIONS:
        if not option.flag:
            continue
        described = f"{option.help} (env {option.env}, " + (
            "required)" if option.required else f"default {option.default or 'none'})")
        if option.kind == "switch":
            serve.add_argument(option.cli, dest=option.name, action="store_const", const=True,
                               default=argparse.SUPPRESS, help=described)
        elif option.kind == "list":
            serve.add_argument(option.cli, dest=option.name, action="append",
                               metavar=option.metavar, default=argparse.SUPPRESS, help=described)
        else:
            serve.add_argument(option.cli, dest=option.name, metavar=option.metavar,
                               default=argparse.SUPPRESS, help=described)


def _add_demo(commands: argparse._SubParsersAction[_Parser]) -> None:
    """`sidecar demo`: local S3, Kafka segments and the sidecar."""
    demo = commands.add_parser("demo", help="local S3 with Kafka segments + the sidecar")
    demo.add_argument("--broker", action="store_true",
                      help="also a real Kafka broker (the jars of `make kafka`) whose tiered "
                           "storage goes through the sidecar: produce, tier, catch two "
                           "consumer groups up, print MB/s and hit ratios, then serve")
    demo.add_argument("--listen", default=None, metavar="H:P", type=_host_port,
                      help="the sidecar's S3 data port (default 127.0.0.1:9330; with "
                           "--broker a free port)")
    demo.add_argument("--admin-listen", default=None, metavar="H:P", type=_host_port,
                      help="its admin port: /ui, /metrics, the API (default 127.0.0.1:9331; "
                           "with --broker a free port)")
    demo.add_argument("--seconds", type=_seconds, default=None,
                      help="stop after this many seconds of serving (default: run until "
                           "interrupted)")


def _host_port(text: str) -> str:
    """A HOST:PORT argument, checked before anything is made for it."""
    try:
        parse_host_port(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return seconds


def _http_url(text: str) -> str:
    """An argument's http(s) URL (HOST:PORT taken as http://HOST:PORT)."""
    try:
        return parse_http_url(text, bare_host=True)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_replay(commands: argparse._SubParsersAction[_Parser]) -> None:
    """`sidecar replay`: read partitions as a broker's remote reader does."""
    replay = commands.add_parser(
        "replay", help="read partitions as a broker's remote reader does; check CRCs, measure")
    replay.add_argument("--endpoint", required=True, metavar="URL", type=_http_url,
                        help="S3 endpoint to read through (a sidecar or the object store)")
    replay.add_argument("--bucket", required=True, help="the tiered-storage bucket")
    replay.add_argument("--prefix", default="", help="key prefix of the Aiven layout")
    replay.add_argument("--topic", default=None, help="only this topic (default: all)")
    replay.add_argument("--partitions", default="all", metavar="all|0,1",
                        help="partitions to read (default all)")
    replay.add_argument("--fetch-bytes", default="1MiB", metavar="SIZE",
                        help="bytes read per fetch, as max.partition.fetch.bytes (default 1MiB)")
    replay.add_argument("--concurrency", type=int, default=4, metavar="N",
                        help="partitions read at once (default 4)")
    replay.add_argument("--region", default="us-east-1",
                        help="region the requests are signed for (default us-east-1)")
    replay.add_argument("--admin", default=None, metavar="URL", type=_http_url,
                        help="the sidecar's admin URL, for its hit rate")
    replay.add_argument("--max-bytes", default=None, metavar="SIZE",
                        help="stop after delivering this much (default: everything)")
    replay.add_argument("--list-endpoint", default=None, metavar="URL", type=_http_url,
                        help="list segments here instead of at --endpoint")
    replay.add_argument("--from-offset", type=int, default=None, metavar="N",
                        help="only the segments holding offsets from N on (as a warm-up "
                        "plan's from_offset selects them)")
    replay.add_argument("--to-offset", type=int, default=None, metavar="N",
                        help="only the segments holding offsets up to N")
    replay.add_argument("--from-time", default=None, metavar="TIME",
                        help="only the segments from this time on: ISO 8601 with a zone "
                        "(2026-11-01T00:00:00Z) or epoch ms, by each segment's first batch")
    replay.add_argument("--to-time", default=None, metavar="TIME",
                        help="only the segments up to this time")
    replay.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                        help="a progress line on stderr this often (default 10; 0: none)")
    replay.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long each request may wait to connect and for each read "
                        "before it fails (default 10; a request is tried 4 times in all); an "
                        "endpoint that stays silent ends the replay with exit 75")
    replay.add_argument("--json", action="store_true", help="print one JSON object")


def _add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a running sidecar's admin port is, and its token."""
    parser.add_argument("--admin", default="http://127.0.0.1:9331", metavar="URL", type=_http_url,
                        help="the sidecar's admin port, URL or HOST:PORT "
                             "(default http://127.0.0.1:9331)")
    parser.add_argument("--admin-token-file", type=Path, default=None, metavar="PATH",
                        help="the admin token's file (default: SIDECAR_ADMIN_TOKEN, else "
                             "SIDECAR_ADMIN_TOKEN_FILE, else admin.token under "
                             "SIDECAR_CACHE_DIR)")


def _add_stats(commands: argparse._SubParsersAction[_Parser]) -> None:
    """`sidecar stats`: a running sidecar's hit-rate summary; `mode` and `purge`:
    its mutating calls, with the admin token found as `stats` finds it."""
    stats = commands.add_parser("stats", help="the hit-rate summary of a running sidecar")
    _add_admin_arguments(stats)
    stats.add_argument("--json", action="store_true", help="print the raw JSON")
    mode = commands.add_parser("mode", help="show or set a running sidecar's download mode")
    _add_admin_arguments(mode)
    mode.add_argument("mode", nargs="?", choices=[m.value for m in Mode],
                      help="the mode to set (default: show the mode)")
    purge = commands.add_parser("purge", help="drop an object's blocks from a sidecar's cache")
    _add_admin_arguments(purge)
    purge.add_argument("bucket", help="the bucket of the object")
    purge.add_argument("key", help="the object's key, as stored (not URL-encoded)")


def _serve(args: argparse.Namespace) -> None:
    from sidecar.server import serve

    flags = {option.name: getattr(args, option.name)
             for option in OPTIONS
             if (option.flag or option.name in NEGATED_FLAGS) and hasattr(args, option.name)}
    config_path = args.config or (Path(os.environ["SIDECAR_CONFIG"])
                                  if os.environ.get("SIDECAR_CONFIG") else None)
    file_values = read_toml(config_path) if config_path else {}
    settings = resolve(flags, os.environ, file_values,
                       str(config_path) if config_path else None)
    config = build_config(settings)
    if args.check_config:
        def source(setting: Setting) -> str:
            option = setting.option
            return {"flag": f"flag {NEGATED_FLAGS.get(option.name, option.cli)}",
                    "env": f"env {option.env}", "file": f"file {config_path}",
                    "default": "default"}[setting.source]
        sys.stdout.write(render_effective(settings, source))
        return
    configure_logging(config.server.log_format)
    if "admin_token" in flags:
        # Every user of the host reads a process's arguments (/proc/PID/cmdline).
        logging.getLogger("sidecar").warning(
            "--admin-token shows in ps to every user of this host: prefer "
            "SIDECAR_ADMIN_TOKEN or admin_token_file")

    def load() -> Config:
        # The flags and the environment stay as they were; the file may have changed.
        if config_path is None:
            return _without_emptied_keys(resolve(flags, os.environ, {}))
        reloaded = read_toml(config_path)
        if file_values and not reloaded:
            # Most likely caught between the truncation and the writing of an
            # in-place rewrite: taken, it would put every option of the file
            # back to its default (auth keys, served buckets, bandwidth cap).
            raise ConfigError(f"config file {config_path} holds no setting any more "
                              "(caught while being rewritten?); restart the sidecar to "
                              "run on the defaults")
        return _without_emptied_keys(resolve(flags, os.environ, reloaded, str(config_path)))

    def _without_emptied_keys(resolved: dict[str, Setting]) -> Config:
        emptied = emptied_keys_file(settings, resolved)
        if emptied is not None:
            raise ConfigError(f"auth_keys_file {emptied} holds no key any more (caught while "
                              "being rewritten?); restart the sidecar to run without its keys")
        return build_config(resolved)

    asyncio.run(serve(config, effective_values(settings), load))


def _tools_missing(command: str, exc: ImportError) -> ConfigError:
    """`demo` and `replay` need the tools extra, which a broker node does not install."""
    return MissingExtra(f"sidecar {command}", "tools", exc.name)


def _demo(args: argparse.Namespace) -> None:
    if args.broker:
        _broker_demo(args)
        return
    try:
        from sidecar.tools.demo import run_demo
    except ImportError as exc:
        raise _tools_missing("demo", exc) from None

    asyncio.run(run_demo(args.listen or "127.0.0.1:9330",
                         args.admin_listen or "127.0.0.1:9331", args.seconds))


def _broker_demo(args: argparse.Namespace) -> None:
    try:
        from sidecar.tools.broker_demo import DemoFailed, run_broker_demo
    except ImportError as exc:
        raise _tools_missing("demo --broker", exc) from None

    # Free ports unless asked otherwise: the broker's and moto's are free ones too,
    # and two runs side by side must not collide.
    try:
        run_broker_demo(args.listen or "127.0.0.1:0", args.admin_listen or "127.0.0.1:0",
                        args.seconds)
    except DemoFailed as exc:
        # Missing jars or Java are ConfigErrors (exit 2, before anything starts); this
        # is the run itself failing, as a replay's bad batch does.
        print(f"sidecar: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _replay(args: argparse.Namespace) -> None:
    from sidecar.config import parse_size
    try:
        from sidecar.tools.replay import ReplayOptions, format_summary, run_replay
        from sidecar.tools.replay_flags import (
            check_bucket,
            check_progress,
            check_timeout,
            parse_partitions,
            parse_range,
        )
    except ImportError as exc:
        raise _tools_missing("replay", exc) from None

    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {args.concurrency}")
    fetch_bytes = parse_size(args.fetch_bytes)
    if fetch_bytes < 1:
        raise ConfigError("--fetch-bytes must be at least 1 byte")
    options = ReplayOptions(
        endpoint=args.endpoint, bucket=check_bucket(args.bucket), prefix=args.prefix,
        topic=args.topic,
        partitions=parse_partitions(args.partitions), fetch_bytes=fetch_bytes,
        concurrency=args.concurrency, region=args.region, admin=args.admin,
        max_bytes=None if args.max_bytes is None else parse_size(args.max_bytes),
        list_endpoint=args.list_endpoint,
        offsets=parse_range("offset", args.from_offset, args.to_offset),
        times_ms=parse_range("time", args.from_time, args.to_time),
        progress_s=check_progress(args.progress), timeout_s=check_timeout(args.timeout),
    )
    if options.offsets is not None and options.times_ms is not None:
        raise ConfigError("give an offset range or a time range, not both")
    report = asyncio.run(run_replay(options))
    print(json.dumps(report) if args.json else format_summary(report))
    if report["crc_errors"]:
        raise SystemExit(1)  # a batch failed its check: the data, not the usage, is wrong


def _format_stats(stats: dict[str, Any]) -> str:
    """The stats JSON as an aligned terminal summary (fields a sidecar lacks are skipped)."""
    def ratio(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.2f}%"

    def mib(value: float) -> str:
        return f"{value / 2**20:,.1f} MiB"

    cache = stats["cache"]
    capacity = cache["capacity_bytes"] or 1
    served = stats["served_bytes"]
    mode = stats.get("mode", "n/a")
    if stats.get("requested_mode") not in (None, mode):
        mode += f" (requested {stats['requested_mode']})"
    if stats.get("disk_problem"):
        mode += f" - cache disk: {stats['disk_problem']}"
    lines = [
        ("mode", mode),
        ("byte hit ratio", ratio(stats["byte_hit_ratio"])),
        ("block hit ratio",
         f"{ratio(stats['block_hit_ratio'])}  "
         f"({stats['hits']:,} hits, {stats['misses']:,} misses)"),
        ("served", f"{mib(served['cache'])} from cache, {mib(served['origin'])} from origin"),
    ]
    origin = stats.get("origin")
    if origin is not None:
        by_lane = ", ".join(f"{lane} {mib(n)}" for lane, n in origin["bytes"].items())
        requests = origin["requests"]
        # A 404 is the origin's answer, not its failure (a segment retention
        # deleted): /ui and the origin error alert count it apart too.
        not_found = requests.get("not_found", 0)
        failed = sum(n for outcome, n in requests.items() if outcome not in ("ok", "not_found"))
        lines.append(("origin read", f"{mib(stats['origin_bytes'])} ({by_lane})"))
        lines.append(("origin requests", f"{sum(requests.values()):,} ({failed:,} failed"
                                         + (f", {not_found:,} not found)" if not_found else ")")))
        breaker = origin.get("breaker")
        if breaker is not None and (breaker["state"] != "closed" or breaker["rejected"]):
            lines.append(("origin breaker", f"{breaker['state']} "
                                            f"({breaker['rejected']:,} misses refused)"))
        waits = origin["ratelimit_wait_seconds"]
        if any(waits.values()):
            lines.append(("rate-limit waits",
                          ", ".join(f"{lane} {s:.1f}s" for lane, s in waits.items())))
    else:
        lines.append(("origin read", mib(stats["origin_bytes"])))
    prefetch = stats["prefetch"]
    lines.append(("prefetch", f"accuracy {ratio(prefetch['accuracy'])}  ({prefetch['issued']:,} "
                              f"issued, {prefetch['used']:,} used, {prefetch['wasted']:,} wasted)"))
    warm = stats.get("warm_blocks")
    if warm is not None and any(warm.values()):
        waiting = cache.get("protected_blocks") or 0
        lines.append(("warm-up blocks", f"{warm['fetched']:,} fetched, "
                                        f"{warm['already_cached']:,} already cached, "
                                        f"{warm['failed']:,} failed"
                      + (f"; {waiting:,} waiting for their reader" if waiting else "")))
    lines.append(("cache", f"{mib(cache['used_bytes'])} / {mib(capacity)} "
                           f"({100 * cache['used_bytes'] / capacity:.1f}%), "
                           f"{cache['blocks']:,} blocks"))
    lines.append(("evictions", f"{cache['evictions']:,}  "
                               f"(checksum failures {cache['checksum_failures']:,})"))
    recovery = cache.get("recovery")
    if recovery is not None:
        scanning = (f", scanning ({recovery['slots_scanned']:,} of "
                    f"{recovery['slots_to_scan']:,} slots)" if recovery.get("scanning") else "")
        lines.append(("last start", f"{recovery['blocks_recovered']:,} blocks reused "
                                    f"({mib(recovery['bytes_recovered'])}), "
                                    f"{recovery['corrupt_headers'] + recovery['duplicates']:,} "
                                    f"dropped, {recovery['file']} cache file{scanning}"))
    width = max(len(label) for label, _ in lines) + 2
    return "\n".join(f"{label:<{width}}{value}" for label, value in lines)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """The admin token goes to the URL given, never to where a 3xx points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


#: What each admin answer holds, whatever else a sidecar of another version adds:
#: an answer without it is some other server's (a proxy's, another service's).
_STATS_FIELDS = ("cache", "served_bytes", "origin_bytes", "byte_hit_ratio", "block_hit_ratio",
                 "hits", "misses", "prefetch")
#: An error answer is shown in one line of at most this many characters.
_MAX_ERROR_CHARS = 200


def _admin_call(args: argparse.Namespace, method: str, path: str, fields: Sequence[str],
                body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One call to the admin port, with the admin token when one is found
    (mutating calls: required); the answer is a JSON object with `fields`.
    ConfigError (exit 2) saying what went wrong, in one line."""
    url = args.admin.rstrip("/") + path  # a URL already (_http_url)
    token = client_token(os.environ, args.admin_token_file)
    if token is None and method != "GET":
        raise ConfigError("no admin token found: set SIDECAR_ADMIN_TOKEN, "
                          "SIDECAR_ADMIN_TOKEN_FILE or --admin-token-file (the sidecar "
                          "keeps a generated one in admin.token in its cache dir)")
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.build_opener(_NoRedirects()).open(request, timeout=5) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            text = exc.read(2000).decode(errors="replace")
        raise ConfigError(f"{method} {url}: {exc.code} {_error_text(exc, text)}") from None
    except urllib.error.URLError as exc:
        raise ConfigError(f"cannot read {url}: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {url}: {exc}") from None
    if not isinstance(answer, dict) or any(field not in answer for field in fields):
        raise ConfigError(f"{method} {url}: not a sidecar's admin answer (a JSON object "
                          f"with {', '.join(fields)}): is --admin its admin port?")
    return answer


def _error_text(exc: urllib.error.HTTPError, text: str) -> str:
    """The sidecar's own {"error": ...} message; for anything else (a proxy's or web
    server's page) its reason and what it sent, not the page itself."""
    try:
        message = json.loads(text)["error"]
    except (ValueError, TypeError, KeyError):
        message = None
    if isinstance(message, str):
        return " ".join(message.split())[:_MAX_ERROR_CHARS]
    content_type = exc.headers.get("Content-Type", "no content type")
    return f"{exc.reason} (a {content_type} answer, not a sidecar's)"[:_MAX_ERROR_CHARS]


def _stats(args: argparse.Namespace) -> None:
    stats = _admin_call(args, "GET", "/api/v1/stats", _STATS_FIELDS)
    print(json.dumps(stats, indent=2) if args.json else _format_stats(stats))


def _mode(args: argparse.Namespace) -> None:
    answer = (_admin_call(args, "GET", "/api/v1/mode", ("mode",)) if args.mode is None else
              _admin_call(args, "PUT", "/api/v1/mode", ("mode",), {"mode": args.mode}))
    print(json.dumps(answer))


def _purge(args: argparse.Namespace) -> None:
    # An empty one makes a path the admin port has no route for: its 404 would
    # say nothing of the argument.
    for name, value in (("bucket", args.bucket), ("key", args.key)):
        if not value:
            raise ConfigError(f"purge: the {name} is empty")
    path = f"/api/v1/cache/{quote(args.bucket, safe='')}/{quote(args.key, safe='/')}"
    print(json.dumps(_admin_call(args, "DELETE", path, ("purged_blocks",))))


def configure_logging(setting: str) -> None:
    """One stderr handler on the root logger: JSON lines unless a person is watching.

    Called again by `serve` once the configuration (log_format) is loaded.
    """
    stream = sys.stderr
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(formatter_for(choose_format(setting, stream.isatty())))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    level = os.environ.get("SIDECAR_LOG_LEVEL", "INFO").upper()
    root.setLevel(level if level in logging.getLevelNamesMapping() else logging.INFO)
    # botocore narrates credential look-ups at INFO; operators need its warnings only.
    for noisy in ("botocore", "aiobotocore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Until serve has loaded its configuration, the env var decides (a bad value
    # is reported by load_config; here it just means auto).
    early = os.environ.get("SIDECAR_LOG_FORMAT", "auto").strip().lower()
    configure_logging(early if early in ("json", "text") else "auto")
    handlers = {"serve": _serve, "demo": _demo, "stats": _stats, "replay": _replay,
                "mode": _mode, "purge": _purge}
    try:
        handlers[args.command](args)
    except ConfigError as exc:
        print(f"sidecar: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OriginUnavailable as exc:
        print(f"sidecar: error: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except KeyboardInterrupt:
        return 130
    return 0
