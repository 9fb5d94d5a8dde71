"""The capacity analysis against real sidecars, real Spark and headless Chromium.

One workload with re-reads (a consumer group reading every partition, a second
group replaying an overlapping range later, a lagging consumer catching up
from the start) is served by two real sidecars: one with a small cache, one with a
larger one. `python -m spark_warmup.capacity` on the first run's access log
predicts the second run's byte hit ratio and origin bytes, as measured by the
second sidecar's own counters. The report it writes is loaded in Chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.capacity_accuracy import NODE as GRID_NODE
from bench.capacity_accuracy import run_cell
from sidecar.tools.kafka_segments import SegmentObject, generate_topic_segments
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from spark_warmup.capacity.__main__ import replay_settings
from spark_warmup.capacity.local import replay_log
from tests.support.chromium import Chromium
from tests.support.installs import ensure, save_artifact
from tests.support.processes import SidecarProcess
from tests.support.spark_cluster import StandaloneCluster

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 64 * 1024
SEGMENT_BYTES = 1024 * 1024
FETCH = 160 * 1024  # not block-aligned: fetches straddle blocks as Kafka's do
SMALL_BLOCKS, LARGE_BLOCKS = 40, 112
SMALL_CACHE = SMALL_BLOCKS * (BLOCK + 4096)
LARGE_CACHE = LARGE_BLOCKS * (BLOCK + 4096)
NODE = "broker-a"


@dataclass(frozen=True)
class Measured:
    log: Path
    served_cache: float
    served_origin: float
    origin_bytes: float
    origin_by_lane: dict[str, float]

    @property
    def byte_hit_ratio(self) -> float:
        return self.served_cache / (self.served_cache + self.served_origin)


def workload(segments: list[SegmentObject]) -> list[tuple[str, int, int]]:
    """(key, first byte, last byte) of each fetch, in order."""
    by_partition: dict[int, list[SegmentObject]] = {}
    for segment in segments:
        by_partition.setdefault(segment.partition, []).append(segment)
    for chain in by_partition.values():
        chain.sort(key=lambda s: s.start_offset)

    def consumer(partition: int, first_segment: int) -> Iterator[tuple[str, int, int]]:
        for segment in by_partition[partition][first_segment:]:
            size = len(segment.data)
            for start in range(0, size, FETCH):
                yield segment.key, start, min(size, start + FETCH) - 1

    def interleaved(*consumers: Iterator[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        out: list[tuple[str, int, int]] = []
        live = list(consumers)
        while live:
            for reader in list(live):
                fetch = next(reader, None)
                if fetch is None:
                    live.remove(reader)
                else:
                    out.append(fetch)
        return out

    partitions = sorted(by_partition)
    group_a = interleaved(*(consumer(p, 0) for p in partitions))
    # A second group replays an overlapping range later: the last two segments
    # of the first two partitions.
    group_b = interleaved(*(consumer(p, 1) for p in partitions[:2]))
    # A consumer that lagged catches up from the start of one partition.
    lagging = list(consumer(partitions[-1], 0))
    return group_a + group_b + lagging + group_b[: len(group_b) // 2]


def sidecar_config(path: Path) -> Path:
    """The configuration both runs share, and the analysis replays with: a
    read-ahead window of a few blocks, as for a cache of a few hundred blocks
    (sidecar.example.toml: the default window fills a share of large caches)."""
    path.write_text(f'cache_dir = "{path.parent / "unused"}"\n'
                    f'block_size = "{BLOCK // 1024}KiB"\n'
                    'prefetch_max_window = "256KiB"\n')
    return path


def serve(local_s3: LocalS3, bucket: str, fetches: list[tuple[str, int, int]],
          cache_bytes: int, config: Path, work: Path) -> Measured:
    cache = work / "cache"
    cache.mkdir(parents=True)
    log = work / "access.log"
    with SidecarProcess(local_s3.endpoint, cache, "--config", str(config),
                        "--cache-size", str(cache_bytes), "--access-log", str(log),
                        env={"SIDECAR_NODE_NAME": NODE}) as sidecar:
        for key, first, last in fetches:
            request = urllib.request.Request(f"{sidecar.data_url}/{bucket}/{key}",
                                             headers={"Range": f"bytes={first}-{last}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert len(response.read()) == last - first + 1
            # One fetch at a time, its read-ahead landed before the next: the
            # same order of events in both runs.
            sidecar.wait_idle()
        measured = Measured(
            log, sidecar.metric("sidecar_served_bytes_total", source="cache"),
            sidecar.metric("sidecar_served_bytes_total", source="origin"),
            sidecar.metric("sidecar_origin_bytes_total"),
            {lane: sidecar.metric("sidecar_origin_bytes_total", lane=lane)
             for lane in ("foreground", "prefetch", "warm")})
    # Stopped: every line is written (the background fetches' ones too).
    assert log.read_text().count('"method":"GET"') == len(fetches)
    return measured


def run_capacity(*args: str, env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_warmup.capacity", *args],
        capture_output=True, text=True, timeout=600, cwd=cwd,
        env={**os.environ, **CREDENTIALS, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})})


@dataclass(frozen=True)
class Analysed:
    small: Measured
    large: Measured
    summary: dict[str, Any]
    report: Path
    config: Path


@pytest.fixture(scope="module")
def analysed(local_s3: LocalS3, origin_s3: Any, tmp_path_factory: pytest.TempPathFactory
             ) -> Analysed:
    work = tmp_path_factory.mktemp("capacity")
    bucket = "capacity-" + os.urandom(4).hex()
    origin_s3.create_bucket(Bucket=bucket)
    segments = list(generate_topic_segments(
        topic="orders", partitions=3, segments_per_partition=3, segment_bytes=SEGMENT_BYTES,
        value_size=1024, seed=18))
    for segment in segments:
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
    fetches = workload(segments)
    config = sidecar_config(work / "sidecar.toml")
    # Two sidecars of their own, each taking the fetches one at a time: the runs
    # go side by side, and each keeps its own order of events.
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(serve, local_s3, bucket, fetches, size, config, work / name)
                for size, name in ((SMALL_CACHE, "small"), (LARGE_CACHE, "large"))]
        small, large = (run.result() for run in runs)
    # Lines the analysis must count and skip, not die of.
    with small.log.open("a") as log:
        log.write("{not json\n")
        log.write(json.dumps({"node": NODE, "time": "yesterday"}) + "\n")
    report = work / "report"
    result = run_capacity("--logs", str(small.log), "--logs", str(work / "missing-*.log"),
                          "--report", str(report), "--master", "local[2]",
                          "--sizes", f"{SMALL_CACHE},{LARGE_CACHE},{2 * LARGE_CACHE}",
                          "--sidecar-config", str(config), "--conf", "spark.ui.enabled=false")
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"report: {report / 'report.html'}" in result.stdout
    summary: dict[str, Any] = json.loads((report / "summary.json").read_text())
    return Analysed(small, large, summary, report, config)


def point_at(summary: dict[str, Any], size: int) -> dict[str, Any]:
    curve = summary["nodes"][NODE]["curve"]
    found: dict[str, Any] = next(p for p in curve if p["cache_bytes"] == size)
    return found


def test_the_curve_from_one_run_predicts_another_cache_size(analysed: Analysed) -> None:
    large = analysed.large
    predicted = point_at(analysed.summary, LARGE_CACHE)
    assert abs(predicted["byte_hit_ratio"] - large.byte_hit_ratio) <= 0.02, \
        (predicted, large.byte_hit_ratio)
    served = large.served_cache + large.served_origin
    predicted_origin = predicted["origin_bytes_per_served_byte"] * served
    assert abs(predicted_origin - large.origin_bytes) <= 0.10 * large.origin_bytes, \
        (predicted_origin, large.origin_bytes)
    # The same replay at the first run's own size agrees with what it measured.
    own = point_at(analysed.summary, SMALL_CACHE)
    assert abs(own["byte_hit_ratio"] - analysed.small.byte_hit_ratio) <= 0.02
    # The sizes differ enough for the curve to mean something: the small cache
    # misses more and reads far more from the origin (read-ahead evicted unread).
    assert large.byte_hit_ratio - analysed.small.byte_hit_ratio > 0.02
    assert analysed.small.origin_bytes > 1.3 * large.origin_bytes


def test_the_spark_job_replays_as_the_accuracy_benchmark_does(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    """One replay, two ways of running it: the job's (a Spark partition per
    size, after one that replays the log at its own size for the origin's
    load) gives the curve bench/capacity_accuracy.py replays in its own process.
    On a grid cell where that load moves with the size: 16 partitions, two
    groups, a cache of a quarter of them and one that holds them all, where the
    second group's reads are hits and leave the origin to the first's."""
    rows = run_cell(local_s3.endpoint, origin_s3, 16, "groups", (0.25, 1.0), tmp_path, bucket)
    sizes = [row["cache_bytes"] for row in rows]
    log = tmp_path / "groups-16-0.25-0" / "access.log"
    report = tmp_path / "report"
    result = run_capacity("--logs", str(log), "--report", str(report), "--master", "local[2]",
                          "--sizes", ",".join(map(str, sizes)),
                          "--sidecar-config", str(tmp_path / "sidecar.toml"),
                          "--conf", "spark.ui.enabled=false")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((report / "summary.json").read_text())
    local = replay_log(log, replay_settings(tmp_path / "sidecar.toml"), sizes)
    curve = {point["cache_bytes"]: point for point in summary["nodes"][GRID_NODE]["curve"]}
    # summary.json keeps six decimals: a figure may be 5e-7 off the replay's own,
    # more than approx's default 1e-6 of it (0.474782 against 0.4747815134).
    for size in sizes:
        assert curve[size]["byte_hit_ratio"] == pytest.approx(
            local[size].byte_hit_ratio, abs=1e-6), size
        assert curve[size]["origin_bytes_per_served_byte"] == pytest.approx(
            local[size].origin_per_served, abs=1e-6), size


def test_the_reports_origin_figures_are_the_sidecars_own_counters(analysed: Analysed) -> None:
    """One set of origin figures: what the access log records of every lane adds
    up to what the sidecar counted over the same run (`sidecar stats` reads the
    same counters)."""
    node = analysed.summary["nodes"][NODE]
    small = analysed.small
    assert small.origin_by_lane["prefetch"] > 0, "the workload reads ahead"
    assert node["origin_bytes"] == small.origin_bytes
    assert node["origin_bytes_by_lane"] == small.origin_by_lane
    assert analysed.summary["topics"]["orders"]["origin_bytes"] == small.origin_bytes
    page = (analysed.report / "report.html").read_text()
    mib = f"{small.origin_bytes / 2 ** 20:.3g} MiB"
    assert page.count(f"<td>{mib}</td>") >= 2, "the Nodes and Topics tables agree"


def test_the_summary_keeps_its_contract_and_the_logs_figures(analysed: Analysed) -> None:
    summary = analysed.summary
    assert summary["target_hit_ratio"] == 0.99
    node = summary["nodes"][NODE]
    small = analysed.small
    assert node["served_bytes"] == small.served_cache + small.served_origin
    # The access log says of each block how it was found; the counters agree.
    assert node["byte_hit_ratio"] == pytest.approx(small.byte_hit_ratio, abs=1e-9)
    assert node["current_cache_bytes"] == SMALL_CACHE
    assert [p["cache_bytes"] for p in node["curve"]] == \
        [SMALL_CACHE, LARGE_CACHE, 2 * LARGE_CACHE]
    ratios = [p["byte_hit_ratio"] for p in node["curve"]]
    assert ratios == sorted(ratios)
    # A cache holding everything misses only first reads: no size on the curve passes it.
    assert max(ratios) - 0.005 <= node["hit_ratio_bound"] < 1
    assert node["best_predicted_cache_bytes"] in [p["cache_bytes"] for p in node["curve"]]
    # How far to trust the curve: the benchmark's cell nearest this node's regime
    # (3 partitions read at once at most; the small cache's share of the footprint).
    assert 1 <= node["regime"]["streams"] <= 3, node["regime"]
    assert 0 < node["regime"]["cache_share"] < 1
    assert node["accuracy"]["streams"] in (1, 4) and "hit_error" in node["accuracy"]
    assert "How far to trust this curve" in (analysed.report / "report.html").read_text()
    recommended = node["recommended_cache_bytes"]
    assert recommended is None or recommended <= 2 * LARGE_CACHE
    assert node["origin_bytes"] > 0 and node["requests"] > 0
    assert set(summary["topics"]) == {"orders"}
    orders = summary["topics"]["orders"]
    assert orders["served_bytes"] == node["served_bytes"]
    assert set(orders) >= {"served_bytes", "byte_hit_ratio", "origin_bytes"}
    assert summary["lines"]["malformed"] == 2
    reasons = [p["reason"] for p in summary["problems"]]
    assert "not JSON" in reasons and any("missing-*.log" in r for r in reasons)
    for table in ("breakdown", "curves", "nodes", "topics"):
        assert list((analysed.report / f"{table}.parquet").glob("*.parquet")), table


@pytest.fixture(scope="session")
def chromium_installed() -> None:
    ensure("ensure-chromium.sh")


# What the report draws, read from its stable hooks (spark_warmup/capacity/report.py):
# every chart, the laid-out size of its series, its legend's swatches, and every
# label that does not lie wholly inside its chart.
CHARTS = """(() => {
  const charts = {};
  for (const svg of document.querySelectorAll("svg.chart")) {
    const frame = svg.getBoundingClientRect();
    const drawn = [...svg.querySelectorAll(".series, .bar")].map((el) => {
      const box = el.getBBox();
      return {series: el.dataset.series, width: box.width, height: box.height};
    });
    const clipped = [...svg.querySelectorAll("text")].filter((el) => {
      const box = el.getBoundingClientRect();
      return box.left < frame.left - 0.5 || box.right > frame.right + 0.5 ||
             box.top < frame.top - 0.5 || box.bottom > frame.bottom + 0.5;
    }).map((el) => el.textContent);
    const swatches = [...svg.querySelectorAll(".legend .swatch")].map((el) => ({
      series: el.dataset.series, fill: el.getAttribute("fill")}));
    const strokes = Object.fromEntries([...svg.querySelectorAll(".series")].map(
      (el) => [el.dataset.series, el.getAttribute("stroke")]));
    const ticks = [...svg.querySelectorAll("text.tick")].map((el) => el.textContent);
    charts[svg.dataset.chart] = {points: Number(svg.dataset.points), drawn, clipped,
                                 swatches, strokes, ticks, left: frame.left,
                                 right: frame.right, top: frame.top, width: frame.width};
  }
  return {charts, scripts: document.scripts.length,
          external: [...document.querySelectorAll("[src], link[href]")].length,
          text: document.body.innerText, viewport: window.innerWidth,
          scrolls: document.documentElement.scrollWidth > window.innerWidth};
})()"""
REPORT_WIDTH = 1400  # the window the report is read in


async def test_the_report_draws_its_charts_in_chromium(
    analysed: Analysed, chromium_installed: None, tmp_path: Path,
) -> None:
    with Chromium(tmp_path / "profile") as browser:
        async with browser.page() as page:
            await page.call("Emulation.setDeviceMetricsOverride", width=REPORT_WIDTH,
                            height=900, deviceScaleFactor=1, mobile=False)
            await page.load((analysed.report / "report.html").as_uri())
            save_artifact("capacity-report.png", await page.screenshot())
            state = await page.evaluate(CHARTS)
            assert page.exceptions() == []
    charts = state["charts"]
    assert state["viewport"] == REPORT_WIDTH and not state["scrolls"]
    assert state["scripts"] == 0 and state["external"] == 0, "self-contained, nothing fetched"
    # One quantity a chart: the hit ratio (0-1) and origin bytes per served byte apart.
    curve, origin = charts[f"curve:{NODE}"], charts[f"origin:{NODE}"]
    assert curve["points"] == 3 and [d["series"] for d in curve["drawn"]] == ["byte hit ratio"]
    assert {d["series"] for d in origin["drawn"]} == {
        "origin bytes per served byte", "of which read-ahead evicted unread"}
    assert all(d["width"] > 100 for d in curve["drawn"] + origin["drawn"]), (curve, origin)
    # Side by side, together using the page's width.
    assert abs(curve["top"] - origin["top"]) < 1 and origin["left"] > curve["right"]
    assert origin["right"] - curve["left"] > 0.9 * (REPORT_WIDTH - 48)
    over_time = charts["hit-ratio-over-time"]
    assert [d["series"] for d in over_time["drawn"]] == [NODE] and over_time["points"] >= 1
    assert over_time["width"] > 0.9 * (REPORT_WIDTH - 48)
    assert len(set(over_time["ticks"])) == len(over_time["ticks"]) >= 1, over_time["ticks"]
    for name, chart in charts.items():
        assert chart["clipped"] == [], (name, chart["clipped"])
        assert chart["right"] <= REPORT_WIDTH, name
        # A legend swatch in each line's own colour.
        assert {s["series"]: s["fill"] for s in chart["swatches"]} == chart["strokes"], name
    bars = charts["top-missing-topics"]["drawn"]
    assert [d["series"] for d in bars] == ["orders"] and bars[0]["width"] > 10
    assert NODE in state["text"] and "not JSON" in state["text"]


def test_bad_arguments_exit_2_naming_them(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text("{not json\n")
    for args, named in (
        (["--sizes", "12 parsecs"], "--sizes"),
        (["--target-hit-ratio", "1.5"], "--target-hit-ratio"),
    ):
        result = run_capacity("--logs", str(log), "--report", str(tmp_path / "r"), *args)
        assert result.returncode == 2 and named in result.stderr, result.stderr
    # Logs without a single object read: nothing to analyse, said so.
    result = run_capacity("--logs", str(log), "--report", str(tmp_path / "r"),
                          "--master", "local[1]", "--conf", "spark.ui.enabled=false")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no object read in the logs" in result.stderr and "1 malformed" in result.stderr


def test_a_report_or_logs_that_cannot_be_used_exit_2_before_spark_starts(
    tmp_path: Path,
) -> None:
    log = tmp_path / "access.log"
    log.write_text("{not json\n")
    taken = tmp_path / "report"
    taken.write_text("a file, not a directory")
    started = time.monotonic()
    result = run_capacity("--logs", str(log), "--report", str(taken / "run"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == (f"spark_warmup.capacity: error: --report {taken / 'run'}: "
                                     f"cannot be created: {taken} is not a directory")
    missing = [str(tmp_path / "gone.log"), str(tmp_path / "nope-*.log")]
    result = run_capacity("--logs", missing[0], "--logs", missing[1],
                          "--report", str(tmp_path / "r"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == ("spark_warmup.capacity: error: --logs: no such file, "
                                     f"directory or match: {missing[0]}, {missing[1]}")
    assert not (tmp_path / "r").exists()
    assert time.monotonic() - started < 15  # no JVM was started for either


def test_a_standalone_clusters_executors_read_the_logs_in_the_object_store(
    analysed: Analysed, spark_standalone: StandaloneCluster, executor_venv: Path,
    local_s3: LocalS3, origin_s3: Any, tmp_path: Path,
) -> None:
    """Executors without the project installed (the job ships what the replay
    imports) read the logs from the object store: the same findings as the
    local run of the same log, and a prefix holding nothing named as a problem.

    One cluster run shows a second thing (each costs a JVM): a report that
    fails at the end keeps the findings. The directory passes the check
    before Spark starts, but a former run's summary.json is a directory now,
    so writing fails after the analysis ran; the whole summary goes to stdout."""
    bucket = "logs-" + os.urandom(4).hex()
    origin_s3.create_bucket(Bucket=bucket)
    origin_s3.put_object(Bucket=bucket, Key="sidecar/broker-a/access.log",
                         Body=analysed.small.log.read_bytes())
    report = tmp_path / "report"
    (report / "summary.json").mkdir(parents=True)
    result = run_capacity(
        "--logs", f"s3://{bucket}/sidecar/", "--logs", f"s3://{bucket}/nothing-here/",
        "--report", str(report), "--master", spark_standalone.url,
        "--sizes", f"{SMALL_CACHE},{LARGE_CACHE},{2 * LARGE_CACHE}",
        "--sidecar-config", str(analysed.config),
        "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        # The store the executors read, as an operator names it to a cluster.
        "--conf", f"spark.executorEnv.AWS_ENDPOINT_URL={local_s3.endpoint}",
        env={"PYSPARK_PYTHON": str(executor_venv), "AWS_ENDPOINT_URL": local_s3.endpoint})
    assert result.returncode == 1, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"spark_warmup.capacity: error: cannot write the report under {report}: "
        f"{report / 'summary.json'}: Is a directory")
    findings, _, document = result.stdout.partition("summary.json (not written):\n")
    assert findings.startswith(f"{NODE}: ") and "report: " not in result.stdout
    summary = json.loads(document)
    assert summary["nodes"] == analysed.summary["nodes"]
    assert any(f"s3://{bucket}/nothing-here/" in p["reason"] for p in summary["problems"])


@pytest.mark.parametrize("module", ["spark_warmup.capacity", "spark_warmup"])
def test_a_master_that_is_no_spark_url_is_one_line_before_spark_starts(
    tmp_path: Path, module: str
) -> None:
    """Spark refuses it with a JVM stack trace and then a Python one (exit 1)."""
    log = tmp_path / "access.log"
    log.write_text("{not json\n")
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    args = ([str(plan)] if module == "spark_warmup"
            else ["--logs", str(log), "--report", str(tmp_path / "r")])
    result = subprocess.run(
        [sys.executable, "-m", module, *args, "--master", "sparkk://m:7077"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"{module}: error: --master: not a Spark master URL: 'sparkk://m:7077' (local[*], "
        "local[N], spark://HOST:PORT, yarn or k8s://HOST:PORT)")


def test_a_node_with_only_warm_up_fetches_is_in_the_report_with_its_origin_bytes(
    tmp_path: Path,
) -> None:
    """A broker being warmed before it serves has FETCH lines only: no curve, but
    its origin bytes are the fleet's, as the sidecar's counters say."""
    from datetime import UTC, datetime

    from sidecar.model import FOREGROUND, WARM, FetchDone, ObjectInfo
    from sidecar.tally import FETCHED, ReadTally
    from sidecar.telemetry.access_log import (
        NodeFacts,
        ReadFacts,
        entry,
        fetch_entry,
        format_entry,
    )

    mib = 1024 * 1024
    key = "orders-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
    tally = ReadTally()
    tally.add(0, FETCHED, FOREGROUND)
    tally.origin_bytes = mib
    read = format_entry(entry(
        now=1_790_000_000.0, request_id="R", method="GET", raw_path=f"/tiered/{key}",
        range_header="bytes=0-", status=206, body_bytes=mib, cache="miss", duration_s=0.01,
        node=NodeFacts("serving", mib, 64 * mib),
        read=ReadFacts('"e"', mib, 0, mib - 1, tally)))
    info = ObjectInfo("tiered", key, 2 * mib, '"e"', datetime(2026, 9, 1, tzinfo=UTC))
    warmed = format_entry(fetch_entry(
        now=1_790_000_001.0, node=NodeFacts("warming", mib, 64 * mib),
        done=FetchDone(WARM, info, 0, 1, 2 * mib, 0.02, ok=True)))
    log = tmp_path / "access.jsonl"
    log.write_text(read + "\n" + warmed + "\n")
    report = tmp_path / "report"
    result = run_capacity("--logs", str(log), "--report", str(report), "--master", "local[1]",
                          "--conf", "spark.ui.enabled=false")
    assert result.returncode == 0, result.stderr[-2000:]
    nodes = json.loads((report / "summary.json").read_text())["nodes"]
    assert set(nodes) == {"serving", "warming"}
    warming = nodes["warming"]
    assert (warming["requests"], warming["origin_bytes"], warming["curve"],
            warming["recommended_cache_bytes"]) == (0, 2 * mib, [], None)
    assert warming["origin_bytes_by_lane"] == {"foreground": 0, "prefetch": 0, "warm": 2 * mib}
    assert nodes["serving"]["curve"] and nodes["serving"]["requests"] == 1
    assert "warming: no object reads" in result.stdout
    page = (report / "report.html").read_text()
    assert "warming: no object reads in its log" in page and "curve:warming" not in page
