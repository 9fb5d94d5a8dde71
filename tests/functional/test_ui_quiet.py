"""/ui on a quiet sidecar, as a demo shows it before and after its first read,
in headless Chromium at 1,400 px: every tile label whole, legends that say what
is missing instead of dashes, and a value between two gaps drawn over its span,
not as a lone dot.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from sidecar.tools.local_s3 import LocalS3
from tests.support.chromium import Chromium, Page
from tests.support.installs import save_artifact
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

WIDTH = 1400
INTERVAL = "300ms"

# What a reader sees of the tiles and legends, and the horizontal extent of each
# chart's ink (pixels in a series' saturated colour) against its plot geometry.
QUIET_STATE = """(() => {
  const cut = [...document.querySelectorAll(".tile .label, .tile .value")]
    .filter((el) => el.scrollWidth > el.clientWidth + 0.5)
    .map((el) => el.textContent.trim());
  const legends = {};
  for (const legend of document.querySelectorAll(".legend")) {
    legends[legend.id.replace(/-legend$/, "")] = {
      text: legend.innerText.trim(),
      keys: [...legend.querySelectorAll(".key")]
        .filter((k) => getComputedStyle(k).display !== "none").map((k) => k.innerText.trim()),
      note: legend.querySelector(".note") ? legend.querySelector(".note").innerText.trim() : "",
    };
  }
  const charts = {};
  for (const c of document.querySelectorAll("canvas")) {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < d.length; i += 4) {
      const top = Math.max(d[i], d[i + 1], d[i + 2]), bottom = Math.min(d[i], d[i + 1], d[i + 2]);
      if (d[i + 3] > 128 && top - bottom > 60) {
        const x = (i / 4) % c.width;
        lo = Math.min(lo, x); hi = Math.max(hi, x);
      }
    }
    const ratio = c.width / c.clientWidth;
    charts[c.id] = {inkWidth: hi >= lo ? (hi - lo + 1) / ratio : 0,
                    plotW: c.chart.plotW, span: c.chart.t1 - c.chart.t0,
                    series: JSON.parse(c.dataset.series || "[]")};
  }
  return {width: window.innerWidth, cut, legends, charts,
          interval: Number(document.getElementById("status").textContent
            .match(/a point every ([\\d.]+) s/)[1]),
          latency: document.getElementById("tile-latency").innerText};
})()"""


def read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def history(sidecar: SidecarProcess) -> dict[str, Any]:
    with urllib.request.urlopen(sidecar.admin_url + "/api/v1/stats?history=1",
                                timeout=10) as response:
        result: dict[str, Any] = json.load(response)["history"]
        return result


async def quiet_page(page: Page, sidecar: SidecarProcess, name: str) -> dict[str, Any]:
    await page.load(sidecar.admin_url + "/ui?interval_ms=60000")  # no poll: the page as served
    state: dict[str, Any] = await page.evaluate(QUIET_STATE)
    save_artifact(name, await page.screenshot())
    assert state["width"] == WIDTH
    assert state["cut"] == [], f"tile text cut at {WIDTH} px: {state['cut']}"
    for chart, legend in state["legends"].items():
        assert "\u2013" not in legend["text"], (chart, legend)
        assert not any(key.endswith("none") for key in legend["keys"]), (chart, legend)
    assert page.exceptions() == []
    return state


async def test_quiet_ui_says_what_is_missing_and_draws_a_lone_value_over_its_span(
    chromium_installed: None, local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="orders-0/one.log", Body=b"x" * 4096)
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(local_s3.endpoint, cache, env={"SIDECAR_STATS_INTERVAL": INTERVAL}
                        ) as sidecar, Chromium(tmp_path / "profile") as browser:
        eventually(lambda: len(history(sidecar)["time"]) >= 2, "two quiet points")
        async with browser.page() as page:
            await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=900,
                            deviceScaleFactor=1, mobile=False)

            # Nothing read yet: the charts of ratios and latency have no value at all.
            before = await quiet_page(page, sidecar, "ui-quiet.png")
            for chart, what in (("chart-ratios", "no reads"), ("chart-latency", "no GETs")):
                legend = before["legends"][chart]
                assert legend["keys"] == [] and legend["note"].startswith(what + " since "), \
                    (chart, legend)
            assert "no GETs" in before["latency"] and "no hits" in before["latency"] \
                and "\u2013" not in before["latency"], \
                before["latency"]

            # One GET, then quiet again: its latency is one value between two gaps.
            assert len(await asyncio.to_thread(
                read, f"{sidecar.data_url}/{bucket}/orders-0/one.log")) == 4096

            def lone_then_quiet() -> bool:
                p50 = history(sidecar)["series"]["latency_s"]["p50"]
                valued = [i for i, v in enumerate(p50) if v is not None]
                return len(valued) == 1 and valued[0] < len(p50) - 1

            eventually(lone_then_quiet, "a point with the GET's latency and one after it")
            after = await quiet_page(page, sidecar, "ui-one-read.png")
            legend = after["legends"]["chart-latency"]
            assert legend["keys"] == [], legend
            assert legend["note"] == f"no GETs in the last {after['interval']:g} s", legend
            chart = after["charts"]["chart-latency"]
            assert [s["points"] for s in chart["series"]] == [1, 1], chart
            # Drawn over its span (one interval of the axis), not as a dot.
            span_px = chart["plotW"] * after["interval"] / chart["span"]
            assert span_px > 8, chart
            assert chart["inkWidth"] >= 0.9 * span_px, chart


async def test_an_interval_beyond_a_day_polls_once_a_day_not_in_a_loop(
    chromium_installed: None, local_s3: LocalS3, tmp_path: Path,
) -> None:
    """`interval_ms=Infinity` (meant as "do not poll") reached setTimeout, which
    takes it as 0: the page polled the admin port as fast as it answered."""
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(local_s3.endpoint, cache) as sidecar, \
            Chromium(tmp_path / "profile") as browser:
        async with browser.page() as page:
            for asked in ("Infinity", "1e12"):
                await page.load(f"{sidecar.admin_url}/ui?interval_ms={asked}")
                state = await page.evaluate(
                    "[document.getElementById('status').textContent,"
                    " document.body.dataset.samples]")
                assert "every 86400 s" in state[0], (asked, state)
                assert state[1] == "1", (asked, state)  # the page's own stats, no poll
            assert page.exceptions() == []


async def test_an_auto_memory_tier_that_came_out_as_none_says_why_in_its_tile(
    chromium_installed: None, local_s3: LocalS3, tmp_path: Path,
) -> None:
    """memory_tier = auto on a cache whose eighth is less than one chunk: the
    tile's figure says why in a few words, not a bare "off" (which reads as
    memory_tier = 0), whole at 1,400 px (``quiet_page``), and the start-up
    warning on hover."""
    cache = tmp_path / "cache"
    cache.mkdir()
    # An eighth of 256 KiB is half a chunk of 64 KiB.
    with SidecarProcess(local_s3.endpoint, cache, "--block-size", "64KiB",
                        "--cache-size", "256KiB", env={"SIDECAR_MEMORY_TIER": "auto"}
                        ) as sidecar, Chromium(tmp_path / "profile") as browser:
        async with browser.page() as page:
            await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=900,
                            deviceScaleFactor=1, mobile=False)
            await quiet_page(page, sidecar, "ui-memory-tier-auto-off.png")
            tile = await page.evaluate(
                "['memory-tier-hits', 'memory-tier-used'].map((id) => {"
                " const el = document.getElementById(id);"
                " return [el.innerText, el.title]; })")
    reason = ("memory_tier auto is an eighth of cache_size (32768 bytes), less than one "
              "chunk of 65536 bytes: the memory tier is off; give memory_tier a size of "
              "at least 65536 bytes to have one")
    assert tile == [
        ["off cache too small", reason],
        ["memory_tier = auto: off, an eighth of cache_size is less than one chunk", reason],
    ]


async def test_a_chart_s_time_axis_names_at_least_two_times(
    chromium_installed: None, local_s3: LocalS3, tmp_path: Path,
) -> None:
    """The axis takes the smallest round step that keeps its ticks within the
    room; a span between one such step and two may hold a single round time
    (9 s on 5 s steps: :55 alone), and one time says nothing of the scale.
    Seen on the page after a replay: the evictions chart with one time under
    it. The page's own tick function, over spans of every phase and length
    from two of its finest steps (1 s) up."""
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(local_s3.endpoint, cache) as sidecar, \
            Chromium(tmp_path / "profile") as browser:
        async with browser.page() as page:
            await page.load(sidecar.admin_url + "/ui?interval_ms=60000")
            found = await page.evaluate("""(() => {
              const out = [];
              for (const room of [2, 3, 4, 6, 10])
                for (const span of [2, 3, 4.5, 9, 14, 29, 50, 119, 299, 1799, 7000])
                  for (let phase = 0; phase < 1; phase += 0.05) {
                    const t0 = 1800000000 + phase * span, t1 = t0 + span;
                    const {ticks} = timeTicks(t0, t1, room);
                    out.push({room, span, phase, ticks,
                              inside: ticks.every((t) => t >= t0 && t <= t1)});
                  }
              return out;
            })()""")
            assert page.exceptions() == []
    assert len(found) == 5 * 11 * 20
    for case in found:
        assert len(case["ticks"]) >= 2 and case["inside"], case
        step = case["ticks"][1] - case["ticks"][0]
        assert all(tick % step == 0 for tick in case["ticks"]), case  # round times
