"""`python -m spark_warmup PLAN.json [--master URL] [--report DIR] [--dry-run] [--conf K=V ...]`.

Also runs under spark-submit (`spark-submit --master URL spark_warmup/__main__.py
PLAN.json`, with the package importable). The plan is validated, and the Kafka
cluster it names is read, and the --report directory checked, before Spark
starts, so a bad plan (or an unreachable cluster, an unknown group or topic, a
report that could not be written) costs no JVM. Exit status: 0 when every
planned segment was warmed, 1 when any failed or the report could not be
written after all (the summary is printed first), 2 for a plan that cannot run
(the message names the field).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sidecar.errors import MissingExtra

PROG = "spark_warmup"
MAX_PROGRESS_S = 86400  # a day: more is no progress line in any warm-up, and inf overflows

try:
    from pyspark.sql import SparkSession

    from spark_warmup.cluster import read_cluster
    from spark_warmup.job import run
    from spark_warmup.plan import PlanError, load_plan
    from spark_warmup.writable import report_dir_problem
except ImportError as missing:  # a plain `pip install .` has no spark extra
    if __name__ != "__main__":
        raise
    print(f"{PROG}: error: {MissingExtra(f'python -m {PROG}', 'spark', missing.name)}",
          file=sys.stderr)
    sys.exit(2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Warm the sidecars' caches ahead of a planned Kafka replay.",
    )
    parser.add_argument("plan", type=Path, metavar="PLAN.json")
    parser.add_argument("--master", default=None, metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--report", type=Path, default=None, metavar="DIR",
                        help="write report.jsonl, report.parquet/ and summary.json here")
    parser.add_argument("--dry-run", action="store_true",
                        help="plan and estimate at each sidecar's warm-lane rate; warm nothing")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting (repeatable)")
    parser.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                        help="a progress line this often while warming, from the sidecars' "
                        "counters (default 10; 0: none)")
    return parser.parse_args(argv)


def master_problem(master: str | None) -> str | None:
    """Why `master` is no Spark master URL, or None. Spark's own rule (SparkContext:
    "Master must either be yarn or start with spark, k8s, or local"), checked here
    because Spark reports it as a JVM stack trace and a Python one."""
    if master is None or master == "yarn" or master.startswith(("local", "spark://", "k8s://")):
        return None
    return (f"--master: not a Spark master URL: {master!r} (local[*], local[N], "
            "spark://HOST:PORT, yarn or k8s://HOST:PORT)")


def session_settings(master: str | None, conf: Mapping[str, str],
                     env: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings of the run: `--conf` as given, and for a local master
    (everything in this process) the driver on loopback unless the operator
    chose an address (SPARK_LOCAL_IP or --conf): Spark otherwise binds the
    machine's first interface, reachable from the whole network."""
    settings = dict(conf)
    # No --master: local[*], unless spark-submit started us (its JVM is already
    # up, with the master and addresses it was given).
    local = master.startswith("local") if master else "PYSPARK_GATEWAY_PORT" not in env
    if local and "SPARK_LOCAL_IP" not in env:
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
        settings.setdefault("spark.driver.host", "127.0.0.1")
    return settings


def local_environment(master: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """What the environment of a local master's JVM needs: SPARK_LOCAL_IP on loopback
    unless the operator chose one. Spark binds its web UI to every interface (and
    warns that the host name resolves to loopback) when it is unset."""
    local = master.startswith("local") if master else "PYSPARK_GATEWAY_PORT" not in env
    return {"SPARK_LOCAL_IP": "127.0.0.1"} if local and "SPARK_LOCAL_IP" not in env else {}


def build_session(master: str | None, settings: Mapping[str, str]) -> SparkSession:
    builder = SparkSession.builder.appName(PROG).config("spark.ui.showConsoleProgress", "false")
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"{PROG}: error: --conf wants KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        settings[key] = value
    if (problem := master_problem(args.master)) is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    # float() takes "inf" and "nan": the first kills the progress thread (Event.wait
    # overflows), the second compares false everywhere and means no progress.
    if not 0 <= args.progress <= MAX_PROGRESS_S:
        print(f"{PROG}: error: --progress must be 0 (none) to {MAX_PROGRESS_S} seconds, "
              f"got {args.progress}", file=sys.stderr)
        return 2
    if args.report is not None and (problem := report_dir_problem(args.report)) is not None:
        print(f"{PROG}: error: --report {args.report}: {problem}", file=sys.stderr)
        return 2
    try:
        plan = load_plan(args.plan, os.environ)
        cluster = read_cluster(plan)
    except PlanError as exc:
        print(f"{PROG}: error: {args.plan}: {exc}", file=sys.stderr)
        return 2
    if args.master is None or args.master.startswith("local"):
        # Python workers of a local master run on this machine: use this
        # interpreter (Spark's default `python3` may lack boto3). On a cluster
        # PYSPARK_PYTHON must name the executors' own interpreter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark_settings = session_settings(args.master, settings, os.environ)
    os.environ.update(local_environment(args.master, os.environ))
    spark = build_session(args.master, spark_settings)
    try:
        result = run(spark, plan, report_dir=args.report, dry_run=args.dry_run,
                     progress_s=args.progress, cluster=cluster)
    except PlanError as exc:
        print(f"{PROG}: error: {args.plan}: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    if result.report_error is not None:
        print(f"{PROG}: error: {result.report_error}", file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
