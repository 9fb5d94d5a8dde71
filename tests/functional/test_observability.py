"""Observability proven against real tools: Debian's Prometheus scraping a sidecar
that serves a replay (every dashboard expression and recording rule returns
series), headless Chromium showing /ui, and the metric invariants.

Prometheus and Chromium are installed by the project's own scripts
(scripts/ensure-prometheus.sh, scripts/ensure-chromium.sh) when missing.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.kafka_segments import SegmentObject, generate_topic_segments
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.support.chromium import Chromium, Page
from tests.support.installs import save_artifact
from tests.support.processes import SidecarProcess
from tests.support.prometheus import Prometheus
from tests.support.recording_proxy import RecordingProxy
from tests.support.waiting import eventually, eventually_awaited

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "sidecar-dashboard.json"
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
BLOCK = 256 * 1024
SEGMENT_BYTES = 1536 * 1024

# Prometheus, Chromium and the page work on their own schedules (a scrape or a
# rule evaluation a second): generous waits, unhurried polls.
WAIT_S = 30.0
POLL_S = 0.2


@pytest.fixture(scope="module")
def segments() -> tuple[SegmentObject, ...]:
    return tuple(generate_topic_segments(
        topic="orders", partitions=2, segments_per_partition=3,
        segment_bytes=SEGMENT_BYTES, value_size=2048, seed=6,
    ))


@pytest.fixture()
def seeded(origin_s3: Any, bucket: str, segments: tuple[SegmentObject, ...]) -> str:
    for segment in segments:
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
    return bucket


def start_sidecar(origin: str, tmp_path: Path, *extra: str,
                  env: dict[str, str] | None = None) -> SidecarProcess:
    cache = tmp_path / "cache"
    cache.mkdir()
    return SidecarProcess(origin, cache, "--block-size", "256KiB",
                          "--cache-size", str(64 * (BLOCK + 4096)), *extra,
                          env={"SIDECAR_PREFETCH_MAX_WINDOW": "2MiB", **(env or {})})


def replay_args(sidecar: SidecarProcess, origin: str, bucket: str) -> list[str]:
    return [sys.executable, "-m", "sidecar", "replay", "--endpoint", sidecar.data_url,
            "--list-endpoint", origin, "--bucket", bucket, "--admin", sidecar.admin_url,
            "--fetch-bytes", "256KiB", "--concurrency", "2", "--json"]


def run_replay(sidecar: SidecarProcess, origin: str, bucket: str) -> dict[str, Any]:
    result = subprocess.run(replay_args(sidecar, origin, bucket), capture_output=True,
                            text=True, timeout=120, env=replay_env())
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["crc_errors"] == 0
    return report


def replay_env() -> dict[str, str]:
    return {**os.environ, **CREDENTIALS, "SIDECAR_LOG_LEVEL": "WARNING"}


# --- the dashboard and the rules --------------------------------------------------------


def dashboard() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return result


def panel_targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel."""
    return [(panel["title"], target["refId"], target["expr"])
            for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def concrete(expr: str, instance: str, job: str = "sidecar") -> str:
    """The expression as Grafana sends it with one job and one instance selected."""
    for variable, value in (("$__rate_interval", "1m"), ("${instance}", instance),
                            ("$instance", instance), ("${job}", job), ("$job", job)):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def test_dashboard_json_is_the_generators_output(tmp_path: Path) -> None:
    generator = ROOT / "deploy" / "grafana" / "generate_dashboard.py"
    result = subprocess.run([sys.executable, str(generator), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # The check can fail: a copy of the generator next to a stale JSON says so.
    copy = tmp_path / "generate_dashboard.py"
    copy.write_text(generator.read_text())
    (tmp_path / DASHBOARD.name).write_text("{}\n")
    stale = subprocess.run([sys.executable, str(copy), "--check"], capture_output=True,
                           text=True, timeout=60)
    assert stale.returncode == 1 and "is stale" in stale.stderr


def test_dashboard_is_importable_and_uses_its_variables() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["includeAll"] and variables[name]["multi"]
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    # "All" jobs are the jobs that have sidecars, never a match-everything regex.
    assert "allValue" not in variables["job"]
    assert variables["job"]["query"]["query"].startswith("label_values(sidecar_")
    # The instances offered are those of the chosen jobs.
    assert 'job=~"$job"' in variables["instance"]["query"]["query"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    contract = metrics_contract()
    used: set[str] = set()
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            # Every selector is narrowed to the chosen jobs and instances.
            selectors = re.findall(r"\b[a-z_:]+\{[^}]*\}", target["expr"])
            assert selectors, (panel["title"], target["expr"])
            for selector in selectors:
                assert 'job=~"$job"' in selector, (panel["title"], selector)
                assert 'instance=~"$instance"' in selector, (panel["title"], selector)
            used.update(re.findall(r"\b(sidecar_[a-z_]+?)(?:_bucket)?\{", target["expr"]))
    titles = " | ".join(panel["title"] for panel in board["panels"]).lower()
    for wanted in ("byte hit ratio", "block hit ratio", "served bytes by source",
                   "origin bytes by lane", "origin requests", "origin latency",
                   "request latency by hit / miss", "prefetch accuracy", "prefetch blocks",
                   "cache used vs capacity", "evictions", "checksum failures",
                   "rate-limit waits", "warm-up blocks", "mode", "origin circuit breaker",
                   "refused by the open breaker", "refused signatures", "answers cut off",
                   "process cpu",
                   "process memory"):
        assert wanted in titles, wanted
    assert used <= contract, used - contract
    # Every metric of the contract appears on the dashboard.
    assert contract <= used, contract - used


# What a query measures, and the units Grafana may show it in.
UNITS = {
    "duration": {"s"}, "ratio": {"percentunit"}, "cores": {"suffix: cores"},
    "bytes per second": {"Bps"}, "bytes": {"bytes"}, "seconds per second": {"s"},
    "events per second": {"reqps", "ops"}, "count or state": {"none"},
}


def quantity(expr: str) -> str:
    """What a dashboard query measures, from its metric names and functions."""
    # The process collectors' queries end with a filter to sidecar targets: not measured.
    measured = expr.split("\n  and on (", 1)[0]
    metrics = set(re.findall(r"\b((?:sidecar|process)_[a-z_]+)\{", measured))
    assert metrics, expr
    rated = "rate(" in measured
    if "histogram_quantile(" in measured:
        return "duration"
    if re.search(r"\)\s*/\s*sum", measured):
        return "ratio"
    if metrics <= {"process_cpu_seconds_total", "sidecar_thread_cpu_seconds_total"} and rated:
        return "cores"
    if rated and all(name.endswith("_bytes_total") for name in metrics):
        return "bytes per second"
    if all(name.endswith("_bytes") for name in metrics):
        return "bytes"
    if rated and all(name.endswith("_seconds_total") for name in metrics):
        return "seconds per second"
    return "events per second" if rated else "count or state"


def test_each_panel_shows_one_quantity_in_its_unit() -> None:
    """Grafana draws all of a panel's series on one axis in the panel's unit, so a
    panel holds one quantity, in a unit that fits it, and scales nothing by hand
    (Grafana shows bytes as KiB..TiB and seconds as ms..h by itself)."""
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            continue
        exprs = [target["expr"] for target in panel["targets"]]
        measured = {quantity(expr) for expr in exprs}
        assert len(measured) == 1, (panel["title"], measured)
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit in UNITS[measured.pop()], (panel["title"], unit)
        assert panel["fieldConfig"]["overrides"] == [], panel["title"]
        for expr in exprs:
            assert not re.search(r"[*/]\s*(\d+\s*\^|1024\b|1e\d|1000\b)", expr), \
                (panel["title"], expr)


def metrics_contract() -> set[str]:
    """The metric names docs/ARCHITECTURE.md promises the dashboards (its
    "Metrics" section, up to "Also exported")."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("### Metrics", 1)[1].split("Also exported", 1)[0]
    names = set(re.findall(r"`(sidecar_[a-z_]+)", section))
    assert len(names) >= 16, names
    return names


def test_rules_pass_promtool(prometheus_installed: None) -> None:
    checked = subprocess.run(["promtool", "check", "rules", *map(str, RULE_FILES)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    unit = subprocess.run(
        ["promtool", "test", "rules",
         *map(str, sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml")))],
        capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_every_panel_and_rule_returns_series_from_a_real_prometheus(
    prometheus_installed: None, local_s3: LocalS3, seeded: str,
    segments: tuple[SegmentObject, ...], tmp_path: Path,
) -> None:
    # Prometheus scrapes the token-free metrics listener, as in Kubernetes
    # (deploy/kubernetes: metrics_listen), where the admin port is guarded.
    with start_sidecar(local_s3.endpoint, tmp_path, "--metrics-listen", "127.0.0.1:0"
                       ) as sidecar, \
            Prometheus(tmp_path / "prometheus", sidecar.metrics_url.removeprefix("http://"),
                       RULE_FILES) as prom:
        instance = sidecar.metrics_url.removeprefix("http://")
        eventually(lambda: prom.query('up{job="sidecar"} == 1') or None, "the first scrape",
                   WAIT_S, POLL_S)
        report = run_replay(sidecar, local_s3.endpoint, seeded)
        assert report["bytes"] == sum(len(segment.data) for segment in segments)

        served = sidecar.metric("sidecar_served_bytes_total")
        assert served >= report["bytes"]

        replayed = time.time()

        def scraped_after_replay() -> bool | None:
            rows = prom.query("sum(sidecar_served_bytes_total)")
            done = rows and float(rows[0]["value"][1]) >= served
            # Two scrapes after the replay: a rate needs two samples of a series.
            last = prom.query('timestamp(up{job="sidecar"})')
            return True if done and float(last[0]["value"][1]) > replayed + 1.5 else None

        eventually(scraped_after_replay, "two scrapes after the replay", WAIT_S, POLL_S)
        groups = prom.api("rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        recording = [rule for rule in rules if rule["type"] == "recording"]
        alerting = [rule for rule in rules if rule["type"] == "alerting"]
        assert {group["file"] for group in groups} == {str(path) for path in RULE_FILES}
        assert len(recording) >= 5 and len(alerting) >= 5
        # Every recorded series exists once the rules have been evaluated after the replay.
        for rule in recording:
            eventually(lambda name=rule["name"]: prom.query(name) or None,
                       f"series of {rule['name']}", timeout=15, interval=POLL_S)
        for group in prom.api("rules")["groups"]:
            for rule in group["rules"]:
                assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        for rule in alerting:
            prom.query(rule["query"])  # parses and evaluates (firing or not)
            assert {"summary", "description"} <= set(rule["annotations"]), rule["name"]

        byte_ratio = prom.query(f'instance:sidecar_byte_hit_ratio:rate5m{{instance="{instance}"}}')
        assert 0.0 <= float(byte_ratio[0]["value"][1]) <= 1.0

        empty = []
        for title, ref, expr in panel_targets():
            if not prom.query(concrete(expr, instance)):
                empty.append(f"{title} [{ref}]: {expr}")
        assert not empty, "panel queries without series:\n" + "\n".join(empty)

        # The variables' label_values(series, label) as Grafana asks Prometheus for them.
        offered = {}
        for variable in dashboard()["templating"]["list"]:
            if variable["type"] != "query":
                continue
            parts = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
            assert parts, variable["query"]
            offered[variable["name"]] = prom.api(f"label/{parts[2]}/values",
                                                 **{"match[]": concrete(parts[1], instance)})
        assert offered == {"job": ["sidecar"], "instance": [instance]}


# --- metric invariants ------------------------------------------------------------------


@dataclass
class Reader:
    """A raw HTTP client that reads every body to its end and counts what it got."""

    url: str
    received: int = 0

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        self._connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)

    def get(self, bucket: str, key: str, range_header: str | None) -> bytes:
        headers = {"Range": range_header} if range_header else {}
        self._connection.request("GET", f"/{bucket}/{urllib.parse.quote(key)}", headers=headers)
        response = self._connection.getresponse()
        body = response.read()
        assert response.status in (200, 206), (response.status, body[:200])
        self.received += len(body)
        return body

    def close(self) -> None:
        self._connection.close()


def test_served_and_origin_bytes_add_up(
    proxy: RecordingProxy, seeded: str, segments: tuple[SegmentObject, ...], tmp_path: Path,
) -> None:
    sizes = {segment.key: len(segment.data) for segment in segments}
    with start_sidecar(proxy.endpoint, tmp_path) as sidecar:
        proxy.clear()
        counted_before = sidecar.metric("sidecar_origin_requests_total")
        reader = Reader(sidecar.data_url)
        try:
            # A replay as a broker reads it, partition by partition in segment order,
            # in fetch-sized bounded ranges that straddle block boundaries...
            for segment in segments:
                data, step, position = segment.data, 300 * 1024 + 7, 0
                while position < len(data):
                    end = min(position + step, len(data)) - 1
                    assert reader.get(seeded, segment.key, f"bytes={position}-{end}") \
                        == data[position:end + 1]
                    position = end + 1
            # ...then the other shapes of range: open-ended, suffix, whole object, and a
            # second pass over one segment (all hits).
            first, last = segments[0], segments[-1]
            assert reader.get(seeded, last.key, "bytes=1000000-") == last.data[1000000:]
            assert reader.get(seeded, last.key, "bytes=-5000") == last.data[-5000:]
            assert reader.get(seeded, first.key, None) == first.data
            assert reader.get(seeded, first.key, "bytes=10-700000") == first.data[10:700001]
        finally:
            reader.close()

        def settled() -> dict[str, float] | None:
            # Read-ahead may still be in flight: wait until every origin request
            # the proxy saw has been counted, and the counters stand still.
            before = {name: sidecar.metric(name) for name in
                      ("sidecar_origin_requests_total", "sidecar_origin_bytes_total",
                       "sidecar_served_bytes_total")}
            time.sleep(0.3)
            after = {name: sidecar.metric(name) for name in before}
            seen = len(proxy.requests)
            if before == after and after["sidecar_origin_requests_total"] - counted_before == seen:
                return after
            return None

        totals = eventually(settled, "origin reads to settle", WAIT_S, POLL_S)
        from_cache = sidecar.metric("sidecar_served_bytes_total", source="cache")
        from_origin = sidecar.metric("sidecar_served_bytes_total", source="origin")
        assert from_cache + from_origin == reader.received
        assert from_cache > 0 and from_origin > 0

        fetched = 0
        for request in proxy.gets():
            start, end = request.byte_range()
            size = sizes[request.key]
            assert start % BLOCK == 0, request.range
            assert (end + 1) % BLOCK == 0 or end >= size - 1, request.range
            fetched += min(end, size - 1) - start + 1
        assert totals["sidecar_origin_bytes_total"] == fetched
        # Every block of every segment was fetched once and only once.
        assert fetched == sum(sizes.values())

        stats = sidecar.stats()
        assert stats["served_bytes"] == {"cache": from_cache, "origin": from_origin}
        assert stats["origin_bytes"] == fetched
        assert sum(stats["origin"]["bytes"].values()) == fetched  # type: ignore[index]


# --- the built-in page in a real browser ------------------------------------------------


# What the page shows, read from its stable hooks (see sidecar/admin/ui.py).
PAGE_STATE = """(() => {
  // Pixels of a chart's canvas in a series' colour (saturated), not grid or text (grey).
  const ink = (canvas) => {
    const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
      if (d[i + 3] > 128 && hi - lo > 60) n++;
    }
    return n;
  };
  const figures = {};
  for (const el of document.querySelectorAll("[data-value]")) {
    figures[el.id] = {text: el.textContent.trim(), value: el.dataset.value};
  }
  const charts = {};
  for (const c of document.querySelectorAll("canvas")) {
    charts[c.id] = {points: Number(c.dataset.points || 0), draws: Number(c.dataset.draws || 0),
                    yTicks: JSON.parse(c.dataset.yTicks || "[]"),
                    xTicks: JSON.parse(c.dataset.xTicks || "[]"),
                    series: JSON.parse(c.dataset.series || "[]"), ink: ink(c),
                    hover: c.dataset.hover || "",
                    legend: [...document.querySelectorAll("#" + c.id + "-legend .key")]
                      .map((k) => k.dataset.series)};
  }
  return {
    samples: Number(document.body.dataset.samples), polls: Number(document.body.dataset.polls),
    error: document.body.dataset.error, status: document.getElementById("status").textContent,
    tileValues: [...document.querySelectorAll(".tile .value")].map((el) => el.textContent.trim()),
    figures, charts,
    warmCalls: [...document.querySelectorAll("#warm-calls tbody tr")]
      .map((tr) => [...tr.cells].map((td) => td.textContent)),
    text: document.body.innerText,
  };
})()"""


async def page_state_when(
    page: Page, condition: Callable[[dict[str, Any]], bool], what: str,
    timeout: float = WAIT_S,  # noqa: ASYNC109 (as eventually_awaited: it names what timed out)
) -> dict[str, Any]:
    """The page's state once `condition` holds; a timeout says the last state seen."""
    last: dict[str, Any] = {}

    async def probe() -> dict[str, Any] | None:
        nonlocal last
        try:
            last = await page.evaluate(PAGE_STATE)
        except AssertionError as exc:  # still navigating: no script yet
            last = {"evaluate": str(exc)}
            return None
        return last if condition(last) else None

    try:
        return await eventually_awaited(probe, what, timeout, interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the page's last state: {last}") from None


# When the page first painted anything a reader sees (text, a chart), and when its
# script had shown the embedded stats (performance.now() milliseconds); None until
# the browser reports that paint.
FIRST_PAINT = """(() => {
  const paint = performance.getEntriesByName("first-contentful-paint")[0];
  return paint ? {firstPaint: paint.startTime, shownAt: Number(document.body.dataset.shownAt)}
               : null;
})()"""


def shown(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{100 * ratio:.2f}%"


# Figures that are numbers once the sidecar has served reads, missed, read ahead and
# warmed in the last minute: "1.25", "93.75%", "1,024".
NUMERIC_FIGURES = (
    "byte-hit-ratio-1m", "block-hit-ratio-1m", "byte-hit-ratio", "block-hit-ratio",
    "latency-p50", "latency-p99", "latency-hit-p99", "latency-miss-p99",
    "throughput", "origin-read", "origin-foreground", "origin-prefetch", "origin-warm",
    "origin-errors", "ratelimit", "prefetch-accuracy", "cache-fill", "evictions",
    "warm-blocks", "checksum-failures", "in-flight", "breaker-rejected",
)
NUMBER = re.compile(r"^\d[\d,]*(\.\d+)?%?( ms)?$")
TIME_LABEL = re.compile(r"^\d\d:\d\d(:\d\d)?$")
CHART_UNITS = {
    "chart-ratios": "%", "chart-throughput": " MiB/s", "chart-origin": " MiB/s",
    "chart-latency": " ms", "chart-origin-requests": " req/s", "chart-ratelimit": " s/s",
    "chart-occupancy": " MiB", "chart-evictions": " blocks/s", "chart-warm": " blocks/s",
}


def assert_page_shows_traffic(state: dict[str, Any], warm_key: str,
                              warmed: dict[str, Any]) -> None:
    """What an operator must see on a sidecar that served cached reads, misses,
    read-ahead and a warm call within the last minute."""
    assert state["error"] == "", state["error"]
    assert state["status"].startswith("updated "), state["status"]
    assert "connecting" not in state["text"].lower()
    assert not [v for v in state["tileValues"] if v in ("", "n/a", "\u2013", "no reads")], \
        state["tileValues"]
    figures = state["figures"]
    for name in NUMERIC_FIGURES:
        assert NUMBER.match(figures[name]["text"]), (name, figures[name])
        assert figures[name]["value"] != "", name
    for lane in ("foreground", "prefetch", "warm"):
        assert float(figures[f"origin-{lane}"]["value"]) > 0, lane
    assert figures["mode"]["value"] == "normal"
    assert figures["disk"]["value"] == "ok" and figures["disk-errors"]["value"] == "0"
    assert figures["breaker"]["value"] == "closed"

    charts = state["charts"]
    assert set(charts) == set(CHART_UNITS)
    for chart_id, unit in CHART_UNITS.items():
        chart = charts[chart_id]
        assert chart["points"] >= 3, (chart_id, chart["points"])
        assert len(chart["yTicks"]) >= 3 and all(t.endswith(unit) for t in chart["yTicks"]), \
            (chart_id, chart["yTicks"])
        # Nice ticks: each label's number is 1, 2 or 5 times a power of ten apart.
        numbers = [float(t.removesuffix(unit).replace(",", "")) for t in chart["yTicks"]]
        step = numbers[1] - numbers[0]
        assert f"{step:.0e}"[0] in "125", (chart_id, numbers)
        assert len(chart["xTicks"]) >= 2 and all(TIME_LABEL.match(t) for t in chart["xTicks"]), \
            (chart_id, chart["xTicks"])
    assert charts["chart-ratios"]["yTicks"][-1] == "100%"
    by_lane = {s["label"]: s for s in charts["chart-origin"]["series"]}
    assert set(by_lane) == {"foreground", "prefetch", "warm"}
    assert charts["chart-origin"]["legend"] == ["foreground", "prefetch", "warm"]
    for lane, series in by_lane.items():
        assert series["points"] >= 3 and series["max"] > 0, (lane, series)
    for chart_id in ("chart-ratios", "chart-throughput", "chart-origin", "chart-latency",
                     "chart-occupancy", "chart-warm"):
        assert charts[chart_id]["ink"] > 50, (chart_id, charts[chart_id]["ink"])

    row = next(row for row in state["warmCalls"] if warm_key in row[3])
    assert row[1] == "200" and row[2] == "1", row
    assert row[4:8] == [f"{warmed[k]:,}" for k in
                        ("requested_blocks", "already_cached", "fetched", "failed")], row


async def test_ui_first_paint_has_the_figures_and_polls_keep_them_current(
    chromium_installed: None, local_s3: LocalS3, seeded: str,
    segments: tuple[SegmentObject, ...], tmp_path: Path,
) -> None:
    # A bandwidth budget stretches the reads over a few of the sidecar's samples,
    # and makes the lanes wait for it.
    with start_sidecar(local_s3.endpoint, tmp_path, "--origin-bandwidth", "6MiB/s",
                       env={"SIDECAR_STATS_INTERVAL": "250ms"}) as sidecar, \
            Chromium(tmp_path / "profile") as browser:
        # Traffic first: a warm call (the warm lane), then a replay of every segment,
        # which misses (foreground), reads ahead (prefetch) and hits the warmed one.
        warm_key = segments[0].key
        warmed = admin_post(sidecar.admin_url + "/api/v1/warm",
                            {"objects": [{"bucket": seeded, "key": warm_key}]},
                            sidecar.admin_token)
        assert warmed["fetched"] > 0 and warmed["failed"] == 0, warmed
        run_replay(sidecar, local_s3.endpoint, seeded)
        sidecar.wait_idle()
        stats: dict[str, Any] = sidecar.stats()
        assert stats["hits"] and stats["misses"]

        async with browser.page() as page:
            # The first paint: no poll for a minute, so all it shows came in the page.
            await page.load(sidecar.admin_url + "/ui?interval_ms=60000")
            save_artifact("ui-first-paint.png", await page.screenshot())
            first = await page.evaluate(PAGE_STATE)
            assert first["samples"] == 1 and first["polls"] == 0, first
            assert_page_shows_traffic(first, warm_key, warmed)
            assert first["figures"]["byte-hit-ratio"]["text"] \
                == shown(stats["byte_hit_ratio"])
            # Nothing was painted before the figures were in place.
            paints = await eventually_awaited(
                lambda: page.evaluate(FIRST_PAINT), "the first paint's timing", WAIT_S, 0.1)
            assert paints["firstPaint"] >= paints["shownAt"], paints

            # Polling: the page follows a second replay (all hits now) as it runs.
            await page.load(sidecar.admin_url + "/ui?interval_ms=200")
            before = await page.evaluate(PAGE_STATE)
            replay = await asyncio.create_subprocess_exec(
                *replay_args(sidecar, local_s3.endpoint, seeded),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=replay_env())
            out, err = await replay.communicate()
            assert replay.returncode == 0, err
            assert json.loads(out)["crc_errors"] == 0
            sidecar.wait_idle()
            settled: dict[str, Any] = sidecar.stats()

            # The page polls until it shows the sidecar's own figures, with new
            # points on its charts.
            grown = before["charts"]["chart-throughput"]["points"] + 4
            state = await page_state_when(
                page, lambda s: s["polls"] >= 3
                and s["charts"]["chart-throughput"]["points"] >= grown
                and s["figures"]["byte-hit-ratio"]["value"]
                == str(settled["byte_hit_ratio"])
                and s["figures"]["block-hit-ratio"]["value"]
                == str(settled["block_hit_ratio"]),
                "the page to poll the second replay's figures")
            assert_page_shows_traffic(state, warm_key, warmed)
            assert state["figures"]["byte-hit-ratio"]["text"] \
                == shown(settled["byte_hit_ratio"])
            assert state["figures"]["block-hit-ratio"]["text"] \
                == shown(settled["block_hit_ratio"])
            save_artifact("ui.png", await page.screenshot())

            # Pointing at a chart redraws it with the values of that moment.
            box = await page.evaluate(
                "(() => { const r = document.getElementById('chart-origin')"
                ".getBoundingClientRect();"
                " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
            await page.call("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
            await page_state_when(page, lambda s: s["charts"]["chart-origin"]["hover"] != "",
                                  "the chart to show the moment pointed at")
            assert page.exceptions() == []


def admin_post(url: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        result: dict[str, Any] = json.load(response)
        return result


def test_access_log_has_one_json_line_per_request(
    local_s3: Any, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    from tests.support.loopback_http import raw_request
    from tests.support.processes import SidecarProcess

    data = bytes(range(256)) * 4096  # 1 MiB
    origin_s3.put_object(Bucket=bucket, Key="a/seg.log", Body=data)
    log_path = tmp_path / "access.jsonl"
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(local_s3.endpoint, cache, "--access-log", str(log_path),
                        "--block-size", "64KiB", "--cache-size", str(32 * (65536 + 4096))
                        ) as sidecar:
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/a/seg.log",
                           {"Range": "bytes=0-99"})[2] == data[:100]
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/a/seg.log",
                           {"Range": "bytes=0-99"})[2] == data[:100]
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/nope")[0] == 404
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(line["status"], line["cache"], line["bytes"]) for line in lines] == [
        (206, "miss", 100), (206, "hit", 100), (404, "none", 0),
    ]
    assert lines[0]["bucket"] == bucket and lines[0]["key"] == "a/seg.log"
    assert lines[0]["range"] == "bytes=0-99" and lines[0]["duration_s"] > 0
