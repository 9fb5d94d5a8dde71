"""`python -m spark_warmup.capacity --logs PATH [--logs PATH ...] --report DIR
[--target-hit-ratio 0.99] [--sizes LIST] [--master URL]`.

PATH: a file, a directory (every file under it), a glob, or s3://bucket/prefix
(read on the executors with boto3; AWS_ENDPOINT_URL names another store).
Writes DIR/summary.json, DIR/*.parquet and DIR/report.html. Exit status: 0
when analysed (malformed or unreadable lines are counted in the report), 1 when
the report could not be written after all (the findings and summary.json's
document are printed on stdout first), 2 for arguments that cannot run or logs
with no object read at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from sidecar.config.loading import (
    BLOCK_SIZE_RULE,
    block_size_refused,
    coalesce_bytes,
    flatten_sections,
    read_toml,
    unknown_key,
)
from sidecar.config.options import BY_NAME
from sidecar.errors import ConfigError, MissingExtra

PROG = "spark_warmup.capacity"

try:
    from spark_warmup.__main__ import (
        build_session,
        local_environment,
        master_problem,
        session_settings,
    )
    from spark_warmup.capacity.curve import SizeError, parse_sizes
    from spark_warmup.capacity.job import MAX_TRACE_REQUESTS, InputError, Options, run
    from spark_warmup.capacity.report import finding_line
    from spark_warmup.capacity.simulate import Settings
    from spark_warmup.capacity.sources import matches_nothing
    from spark_warmup.writable import report_dir_problem
except ImportError as missing:  # a plain `pip install .` has no spark extra
    if __name__ != "__main__":
        raise
    print(f"{PROG}: error: {MissingExtra(f'python -m {PROG}', 'spark', missing.name)}",
          file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line, as the checks after parsing say theirs (`fail`),
    not argparse's usage block before it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message}\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog=f"python -m {PROG}",
        description="Hit ratios per node, topic and partition from the sidecars' access "
        "logs, and the cache size each node needs for a target byte hit ratio.")
    parser.add_argument("--logs", action="append", required=True, metavar="PATH",
                        help="access log file, directory, glob or s3://bucket/prefix "
                        "(repeatable)")
    parser.add_argument("--report", type=Path, required=True, metavar="DIR",
                        help="write summary.json, Parquet tables and report.html here")
    parser.add_argument("--target-hit-ratio", type=float, default=0.99, metavar="RATIO",
                        help="byte hit ratio the recommended size reaches (default 0.99)")
    parser.add_argument("--sizes", default=None, metavar="LIST",
                        help="cache sizes of the curve, e.g. 64GiB,128GiB (default: "
                        "fractions of each node's footprint and its current size)")
    parser.add_argument("--master", default=None, metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--max-trace", type=int, default=MAX_TRACE_REQUESTS, metavar="N",
                        help="reads replayed per node at most; a larger trace is sampled "
                        f"by partition (default {MAX_TRACE_REQUESTS})")
    parser.add_argument("--sidecar-config", type=Path, default=None, metavar="FILE",
                        help="the sidecars' TOML configuration: the replay follows its "
                        "read-ahead and coalescing settings (default: the sidecar's defaults)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting (repeatable)")
    return parser.parse_args(argv)


_REPLAY_OPTIONS = ("block_size", "max_coalesce", "prefetch", "prefetch_max_window",
                   "prefetch_max_in_flight", "prefetch_cache_share", "stream_idle", "layout",
                   "layout_prefix")


def replay_settings(config_file: Path | None = None) -> Settings:
    """The read-ahead and coalescing the replay follows: the sidecars' own
    configuration file's, else the option table's defaults. The block size comes
    from each node's log lines.

    Only these options are read from the file (each parsed as the sidecar parses
    it, an unknown key refused as the sidecar refuses it). The checks that hold
    for a serving sidecar (an admin token off loopback, a keys file to read)
    depend on the secrets its own pod holds, which this job neither has nor
    needs, so the whole configuration is not built here."""
    # read_toml: a file that is not UTF-8 (or not TOML) is a ConfigError.
    file_values = flatten_sections(read_toml(config_file)) if config_file is not None else {}
    unknown = sorted(set(file_values) - set(BY_NAME))
    if unknown:
        raise ConfigError(unknown_key(unknown[0]))
    values = {}
    for name in _REPLAY_OPTIONS:
        option = BY_NAME[name]
        raw = file_values.get(name, option.default)
        try:
            if name in file_values:
                # As the sidecar checks its file's values.
                option.file_type.check(raw, secret=option.secret)
            values[name] = option.parse(raw)
        except ConfigError as exc:
            raise ConfigError(f"config key {name}: {exc}") from None
    block_size = int(values["block_size"])
    if block_size_refused(block_size):
        raise ConfigError(f"config key block_size: {BLOCK_SIZE_RULE}, as the sidecar "
                          f"requires, got {block_size}")
    return Settings(
        block_size=block_size,
        max_coalesce_bytes=coalesce_bytes(int(values["max_coalesce"]), block_size),
        read_ahead=bool(values["prefetch"]),
        # As the sidecar derives its window: whole blocks, at least one.
        max_window_bytes=max(1, int(values["prefetch_max_window"]) // block_size) * block_size,
        max_in_flight=int(values["prefetch_max_in_flight"]),
        cache_share=float(values["prefetch_cache_share"]),
        stream_idle_s=float(values["stream_idle"]),
        layout=values["layout"], layout_prefix=str(values["layout_prefix"] or ""),
    )


def fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return fail(f"--conf wants KEY=VALUE, got {item!r}")
        settings[key] = value
    if (problem := master_problem(args.master)) is not None:
        return fail(problem)
    if not 0.0 < args.target_hit_ratio <= 1.0:
        return fail(f"--target-hit-ratio must be in (0, 1], got {args.target_hit_ratio}")
    if args.max_trace < 1:
        return fail(f"--max-trace must be at least 1, got {args.max_trace}")
    if (problem := report_dir_problem(args.report)) is not None:
        return fail(f"--report {args.report}: {problem}")
    # Some of several paths matching nothing is a problem the report lists; all of
    # them, with no object store among them, leaves nothing to analyse at all.
    if all(matches_nothing(path) for path in args.logs):
        return fail("--logs: no such file, directory or match: " + ", ".join(args.logs))
    try:
        sizes = parse_sizes(args.sizes) if args.sizes else None
    except SizeError as exc:
        return fail(str(exc))
    try:
        replay = replay_settings(args.sidecar_config)
    except (ConfigError, OSError) as exc:
        return fail(f"--sidecar-config {args.sidecar_config}: {exc}")
    if args.master is None or args.master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark_settings = session_settings(args.master, settings, os.environ)
    os.environ.update(local_environment(args.master, os.environ))
    spark = build_session(args.master, spark_settings)
    try:
        analysis = run(spark, Options(
            logs=args.logs, report_dir=args.report, target_hit_ratio=args.target_hit_ratio,
            sizes=sizes, max_trace_requests=args.max_trace, settings=replay))
    except InputError as exc:
        return fail(str(exc))
    finally:
        spark.stop()
    for node, facts in analysis.summary["nodes"].items():
        print(finding_line(node, facts, args.target_hit_ratio))
    if analysis.report_error is not None:
        # The analysis ran: what summary.json would have held is kept on stdout.
        print("summary.json (not written):")
        print(json.dumps(analysis.summary, indent=1), flush=True)
        print(f"{PROG}: error: {analysis.report_error}", file=sys.stderr)
        return 1
    print(f"report: {args.report / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
