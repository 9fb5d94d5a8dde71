"""An example plan for `sidecar demo`'s own data, so a newcomer can warm and then replay.

Kept here, not in the demo, so that it is checked against the plan validator
(`tests/unit/test_spark_warmup_example.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sidecar.tools.commands import DEMO_SPARK_CONF, program, python_module

# `sidecar.tools.kafka_segments.generate_topic_segments`' default first timestamp.
DEMO_START_TIME_MS = 1_790_000_000_000


def example_plan(origin_endpoint: str, bucket: str, sidecar_admin_url: str,
                 topics: Sequence[tuple[str, int]],
                 start_time_ms: int = DEMO_START_TIME_MS,
                 admin_token_file: str | None = None) -> dict[str, object]:
    """A plan over `topics` ((name, partitions), at least one): the first by an offset
    range, the others by a time range (the first hour of their data);
    `admin_token_file`: where the job finds the sidecar's admin token."""
    start = datetime.fromtimestamp(start_time_ms / 1000, tz=UTC)
    (first, partitions), *rest = topics
    replays: list[dict[str, object]] = [
        {"topic": first, "partitions": list(range(partitions)),
         "from_offset": 0, "to_offset": 4999},
    ]
    replays += [
        {"topic": name, "partitions": "all",
         "from_time": _iso(start), "to_time": _iso(start + timedelta(hours=1))}
        for name, _ in rest
    ]
    plan: dict[str, object] = {
        "origin": {"endpoint": origin_endpoint, "bucket": bucket, "prefix": "",
                   "region": "us-east-1"},
        "layout": "aiven",
        "sidecars": {"demo": sidecar_admin_url},
        "replays": replays,
        "ttl_s": 3600,
        "warm_rate": "100MiB/s",
    }
    if admin_token_file:
        plan["admin_token_file"] = admin_token_file
    return plan


def example_instructions(plan_path: str, plan: dict[str, object], data_url: str,
                         credentials: dict[str, str], *, report_dir: str) -> str:
    """How to dry-run, run and then replay the example plan (printed by the demo);
    the run writes its report to `report_dir`."""
    origin = plan["origin"]
    assert isinstance(origin, dict)
    replays = plan["replays"]
    assert isinstance(replays, list)
    sidecars = plan["sidecars"]
    assert isinstance(sidecars, dict)
    env = " ".join(f"{name}={value}" for name, value in sorted(credentials.items()))
    return "\n".join([
        f"Warm the cache ahead of a replay (example plan written to {plan_path}):",
        *("  " + line for line in json.dumps(plan, indent=2).splitlines()),
        f"  {env} \\",
        # A dry run starts Spark too (it plans on the executors): no web UI either.
        f"  {python_module('spark_warmup')} {DEMO_SPARK_CONF} {plan_path} --dry-run",
        f"  {env} \\",
        f"  {python_module('spark_warmup')} {DEMO_SPARK_CONF} {plan_path} --report {report_dir}",
        "then replay through the sidecar (100% block hits for the warmed range):",
        f"  {env} \\",
        f"  {program('sidecar')} replay --endpoint {data_url} "
        f"--bucket {origin['bucket']} --topic {replays[-1]['topic']} "
        f"--admin {next(iter(sidecars.values()))}",
    ])


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
