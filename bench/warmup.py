"""Scenario `warmup` (issue 5): warm the whole data set ahead of a replay, then replay it.

A fresh sidecar with `--origin-bandwidth 200MiB/s` and SIDECAR_WARM_SHARE=0.8
(a warm lane of 160 MiB/s) and SIDECAR_WARM_CONCURRENCY=6 (six origin
connections of 64 MB/s each: the connections are not what limits the lane)
is warmed with every segment of the data set:

- through the Spark job (`python -m spark_warmup PLAN.json --master local[2]
  --report DIR`) when `spark_warmup/`, PySpark and Java are there; the job
  lists the segments at the origin emulator (ListObjectsV2 with delimiter `/`
  to find the topic's partitions, then per partition), so the emulator serves
  those listings too;
- otherwise (or when the job cannot run at all) with direct
  `POST /api/v1/warm` calls, one segment per call, a few at a time, as the
  Spark job sends them.

While it warms, the sidecar's `sidecar_origin_bytes_total{lane="warm"}` is
sampled every 100 ms: the warm lane's rate is its bytes over the window from
the last sample before its first byte to the first sample after its last
(so it can only come out low, never high), and is compared with the budget.
Then all partitions are replayed through the sidecar: hit ratios from
/api/v1/stats, foreground origin bytes from /metrics.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.clients import ClientFailed, run_bounded
from bench.dataset import StoredObject
from bench.harness import Bench
from bench.nginx import NginxServer
from bench.sidecar_server import SidecarServer, client_env
from sidecar.config import parse_rate

REPO = Path(__file__).resolve().parent.parent
SCENARIO = "warmup"
SAMPLE_INTERVAL_S = 0.1
WARM_TTL_S = 3600
SPARK_TIMEOUT_S = 900.0


class SparkUnusable(RuntimeError):
    """The Spark job could not run at all (not: it ran and some segments failed)."""


# --- sampling a lane's origin bytes ---------------------------------------------------


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    value: float


class LaneSampler:
    """Polls one lane of `sidecar_origin_bytes_total` in a thread until stopped."""

    def __init__(self, sidecar: SidecarServer, lane: str,
                 interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.sidecar = sidecar
        self.lane = lane
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sample-{lane}", daemon=True)

    def __enter__(self) -> LaneSampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._take()

    def _take(self) -> None:
        try:
            value = self.sidecar.lane_samples().get(self.lane)
        except (OSError, ValueError):
            return
        if value is not None:  # /metrics did not answer this time: no sample
            self.samples.append(Sample(time.monotonic(), value))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def first_move(self) -> float | None:
        """When the lane's bytes first grew (the sample that saw it), or None."""
        if not self.samples:
            return None
        base = self.samples[0].value
        return next((s.at for s in self.samples if s.value > base), None)


def lane_window(samples: list[Sample]) -> dict[str, Any]:
    """Bytes a lane moved and the rate over its active window (see the module doc)."""
    if len(samples) < 2:
        return {"bytes": 0, "seconds": None, "bytes_per_s": None, "samples": len(samples)}
    base, final = samples[0].value, samples[-1].value
    moved = final - base
    if moved <= 0:
        return {"bytes": 0, "seconds": None, "bytes_per_s": None, "samples": len(samples)}
    first = next(i for i, s in enumerate(samples) if s.value > base)
    start = samples[max(0, first - 1)].at
    end = next(s.at for s in samples if s.value >= final)
    seconds = end - start

    def crossing(fraction: float) -> float:
        target = base + fraction * moved
        for before, after in itertools.pairwise(samples):
            if after.value >= target:
                span = after.value - before.value
                part = (target - before.value) / span if span > 0 else 1.0
                return before.at + part * (after.at - before.at)
        return samples[-1].at

    t10, t90 = crossing(0.1), crossing(0.9)
    return {
        "bytes": int(moved),
        "seconds": round(seconds, 3),
        "bytes_per_s": moved / seconds if seconds > 0 else None,
        # the middle 80% of the bytes: the lane's steady rate, without ramp-up and tail
        "steady_bytes_per_s": 0.8 * moved / (t90 - t10) if t90 > t10 else None,
        "samples": len(samples),
        "interval_s": SAMPLE_INTERVAL_S,
    }


# --- the two ways to warm -------------------------------------------------------------


def spark_available() -> tuple[bool, str]:
    if not (REPO / "spark_warmup" / "__main__.py").exists():
        return False, "spark_warmup/ is not in this checkout"
    if importlib.util.find_spec("pyspark") is None:
        return False, "PySpark is not installed"
    if shutil.which("java") is None:
        return False, "java is not on PATH"
    return True, ""


def warm_plan(bench: Bench, origin: NginxServer, sidecar: SidecarServer,
              bucket: str | None = None, topic: str | None = None) -> dict[str, Any]:
    """The plan that warms every partition of `topic` (the data set's by default)."""
    spec = bench.dataset.spec
    return {
        "origin": {"endpoint": origin.url, "bucket": bucket or spec.bucket, "prefix": "",
                   "region": "us-east-1"},
        "layout": "aiven",
        "sidecars": {"bench": sidecar.admin_url},
        "admin_token": sidecar.admin_token,
        "replays": [{"topic": topic or spec.topic, "partitions": "all"}],
        "ttl_s": WARM_TTL_S,
        "concurrency": bench.settings.warmup_calls,
    }


def warm_with_spark(bench: Bench, origin: NginxServer, sidecar: SidecarServer,
                    work: Path, plan: dict[str, Any] | None = None,
                    label: str = SCENARIO) -> dict[str, Any]:
    """Run the Spark job with `plan` (the data set's by default, `warm_plan`)."""
    plan = plan or warm_plan(bench, origin, sidecar)
    plan_path = work / "warmup-plan.json"
    plan_path.write_text(json.dumps(plan, indent=2))
    report_dir = work / "spark-report"
    args = [sys.executable, "-m", "spark_warmup", str(plan_path), "--master", "local[2]",
            "--report", str(report_dir)]
    env = {**client_env(), "PYSPARK_PYTHON": sys.executable}
    topics = ", ".join(replay["topic"] for replay in plan["replays"])
    print(f"  {label}: Spark job (local[2]) warming topic {topics} ...", file=sys.stderr,
          flush=True)
    started = time.monotonic()
    try:
        finished = run_bounded(args, SPARK_TIMEOUT_S, env,
                               bench.work / "logs" / f"{label}-spark.log")
    except ClientFailed as exc:
        raise SparkUnusable(f"the Spark job did not finish: {exc}") from None
    job_seconds = time.monotonic() - started
    summary_path = report_dir / "summary.json"
    if finished.returncode not in (0, 1) or not summary_path.exists():
        raise SparkUnusable(f"the Spark job exited {finished.returncode}: "
                            f"{(finished.stderr or finished.stdout).strip()[-1500:]}")
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    rows = [json.loads(line) for line in (report_dir / "report.jsonl").read_text().splitlines()
            if line.strip()] if (report_dir / "report.jsonl").exists() else []
    errors = sorted({str(row["error"]) for row in rows if row.get("error")})
    return {
        "via": "spark",
        "command": " ".join(["python", *args[1:]]),
        "plan": plan,
        "exit_code": finished.returncode,
        "job_seconds": round(job_seconds, 3),
        "warm_stage_seconds": summary.get("seconds"),
        "segments": summary.get("segments"),
        "planned_bytes": summary.get("planned_bytes"),
        "warmed_bytes": summary.get("warmed_bytes"),
        "bytes_fetched": summary.get("fetched_bytes"),
        "fetched_blocks": summary.get("fetched_blocks"),
        "already_cached_blocks": summary.get("already_cached_blocks"),
        "failed_segments": summary.get("failed_segments"),
        "errors": errors[:5],
        "summary": summary,
        "stdout_tail": finished.stdout.strip()[-1500:],
    }


def warm_directly(bench: Bench, sidecar: SidecarServer,
                  objects: Sequence[StoredObject] | None = None, bucket: str | None = None,
                  label: str = SCENARIO) -> dict[str, Any]:
    """One warm call per object (the data set's segments by default), as the Spark
    job sends them, `warmup_calls` at a time."""
    bucket = bucket or bench.dataset.spec.bucket
    objects = sorted(bench.dataset.objects if objects is None else objects,
                     key=lambda item: (item.partition, item.key))
    planned = sum(item.size for item in objects)
    print(f"  {label}: direct warm calls ({bench.settings.warmup_calls} at a time) warming "
          f"{planned / 2**20:.0f} MiB ...", file=sys.stderr, flush=True)

    def one(key: str, size: int) -> dict[str, Any]:
        body = [{"bucket": bucket, "key": key, "start": 0, "end": None}]
        return sidecar.warm(body, WARM_TTL_S, timeout_s=60.0 + size / 2**20)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=bench.settings.warmup_calls) as pool:
        answers = list(pool.map(lambda item: one(item.key, item.size), objects))
    seconds = time.monotonic() - started
    totals = {name: sum(int(answer.get(name, 0)) for answer in answers)
              for name in ("requested_blocks", "already_cached", "fetched", "failed",
                           "bytes_fetched")}
    return {
        "via": "direct",
        "calls": len(answers),
        "calls_in_flight": bench.settings.warmup_calls,
        "job_seconds": round(seconds, 3),
        "warm_stage_seconds": round(seconds, 3),
        "segments": len(objects),
        "planned_bytes": planned,
        "warmed_bytes": sum(item.size for item, answer in zip(objects, answers, strict=True)
                            if not answer.get("failed")),
        "bytes_fetched": totals["bytes_fetched"],
        "fetched_blocks": totals["fetched"],
        "already_cached_blocks": totals["already_cached"],
        "failed_segments": sum(1 for answer in answers if answer.get("failed")),
        "answers": totals,
    }


# --- the scenario ---------------------------------------------------------------------


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after.get(name, 0.0) - before.get(name, 0.0), 6)
            for name in sorted(set(before) | set(after))}


def _warm_once(bench: Bench, via: str, origin: NginxServer,
               sidecar: SidecarServer) -> dict[str, Any]:
    work = bench.work / f"warmup-{via}"
    work.mkdir(parents=True, exist_ok=True)
    bytes_before = sidecar.lane_samples()
    waits_before = sidecar.lane_samples("sidecar_ratelimit_wait_seconds_total")
    with LaneSampler(sidecar, "warm") as sampler:
        result = (warm_with_spark(bench, origin, sidecar, work) if via == "spark"
                  else warm_directly(bench, sidecar))
    result["warm_lane"] = lane_window(sampler.samples)
    result["origin_bytes_by_lane"] = _delta(bytes_before, sidecar.lane_samples())
    result["ratelimit_wait_seconds_by_lane"] = _delta(
        waits_before, sidecar.lane_samples("sidecar_ratelimit_wait_seconds_total"))
    result["sidecar_warm_blocks_total"] = sidecar.metric_samples("sidecar_warm_blocks_total")
    budget = bench.scenarios[SCENARIO]["warm_lane_budget_bytes_per_s"]
    rate = result["warm_lane"].get("bytes_per_s")
    result["warm_lane_vs_budget"] = rate / budget if rate else None
    steady = result["warm_lane"].get("steady_bytes_per_s")
    result["warm_lane_steady_vs_budget"] = steady / budget if steady else None
    stage = result.get("warm_stage_seconds")
    fetched = result.get("bytes_fetched")
    result["warm_stage_bytes_per_s"] = fetched / stage if fetched and stage else None
    result["warm_stage_vs_budget"] = (
        result["warm_stage_bytes_per_s"] / budget if result["warm_stage_bytes_per_s"] else None)
    print(f"  {SCENARIO}: warmed via {via}: {(fetched or 0) / 2**20:.0f} MiB fetched, warm lane "
          f"{(rate or 0) / 2**20:.1f} MiB/s over {result['warm_lane'].get('seconds')} s "
          f"({100 * (result['warm_lane_vs_budget'] or 0):.1f}% of "
          f"{budget / 2**20:.0f} MiB/s)", file=sys.stderr, flush=True)
    return result


def run_warmup(bench: Bench) -> None:
    settings = bench.settings
    bandwidth = parse_rate(settings.warmup_bandwidth)
    if bandwidth is None:
        raise ValueError(f"warmup_bandwidth {settings.warmup_bandwidth!r} is unlimited")
    budget = bandwidth * settings.warmup_share
    env = {"SIDECAR_WARM_SHARE": str(settings.warmup_share),
           "SIDECAR_WARM_CONCURRENCY": str(settings.warmup_concurrency)}
    extra = ("--origin-bandwidth", settings.warmup_bandwidth)
    available, why_not = spark_available()
    info = bench.scenarios.setdefault(SCENARIO, {"runs": {}})
    info.update({
        "bytes": bench.dataset.total_bytes, "segments": len(bench.dataset.objects),
        "origin_bandwidth": settings.warmup_bandwidth, "warm_share": settings.warmup_share,
        "warm_lane_budget_bytes_per_s": budget,
        "warm_concurrency": settings.warmup_concurrency,
        "calls_in_flight": settings.warmup_calls, "cache_size": settings.warmup_cache_size,
        "sidecar_env": env, "sidecar_flags": list(extra),
        "spark_available": available, "spark_unavailable_reason": why_not or None,
        "partitions": "all", "concurrency": settings.concurrency_4p,
    })
    print(f"{SCENARIO}: warm {bench.dataset.total_bytes / 2**20:.0f} MiB into a sidecar with a "
          f"{budget / 2**20:.0f} MiB/s warm lane, then replay it", file=sys.stderr, flush=True)
    servers: dict[str, Any] = {}

    with ExitStack() as outer:
        def warm() -> dict[str, Any]:
            for via in (["spark", "direct"] if available else ["direct"]):
                with ExitStack() as stack:
                    origin = stack.enter_context(bench.origin(f"warmup-{via}"))
                    sidecar = stack.enter_context(bench.sidecar(
                        origin, extra, env, settings.warmup_cache_size))
                    try:
                        result = _warm_once(bench, via, origin, sidecar)
                    except SparkUnusable as exc:
                        info["spark_failure"] = str(exc)[-2000:]
                        print(f"  {SCENARIO}: the Spark job could not run, warming directly: "
                              f"{str(exc)[-300:]}", file=sys.stderr, flush=True)
                        continue
                    outer.enter_context(stack.pop_all())  # keep them for the replay
                    servers.update(origin=origin, sidecar=sidecar)
                    info["warmed_via"] = via
                    return result
            raise RuntimeError("warm-up failed on every path")

        bench.attempt(SCENARIO, "warm", warm)
        if not servers:
            return

        def replay() -> dict[str, Any]:
            origin: NginxServer = servers["origin"]
            sidecar: SidecarServer = servers["sidecar"]
            before = sidecar.lane_samples()
            report = bench.replay(f"{SCENARIO}-replay", sidecar.data_url, "all",
                                  settings.concurrency_4p, origin, sidecar, list_via_origin=True)
            report["origin_bytes_by_lane"] = _delta(before, sidecar.lane_samples())
            return report

        bench.attempt(SCENARIO, "replay", replay)
