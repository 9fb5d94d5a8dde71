"""`GET /ui`: the built-in hit-rate page, one self-contained HTML document.

No external assets (the Content-Security-Policy below forbids them): inline CSS,
inline JavaScript drawing on <canvas>. The page polls `/api/v1/stats` every
`interval_ms` (default 2000, a query parameter) and keeps the last HISTORY
samples in memory, so charts start empty when it is opened and fill as it runs.

Stable hooks for tests and scripts: every figure is an element with an id whose
`data-value` holds the raw number from the stats JSON (empty when n/a); each
chart's <canvas> carries `data-points` (samples drawn) and `data-draws`; <body>
carries `data-samples` (successful polls) and `data-error` (the last failure).
"""

from __future__ import annotations

# Same-origin fetches and inline code only: an asset the page tried to load from
# elsewhere would be blocked, which keeps "self-contained" true by construction.
CSP = (
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sidecar: cache hit rates</title>
<style>
  :root { --bg: #f6f7f9; --card: #fff; --ink: #1d2330; --muted: #667085; --grid: #e4e7ec;
          --cache: #12b76a; --origin: #f79009; --block: #2e90fa; --cap: #98a2b3; }
  * { box-sizing: border-box; }
  body { margin: 0; padding: 16px 20px; background: var(--bg); color: var(--ink);
         font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; }
  header { display: flex; align-items: baseline; gap: 16px; flex-wrap: wrap; }
  h1 { font-size: 18px; margin: 0 0 12px; }
  #status { color: var(--muted); }
  #status.error { color: #d92d20; }
  .tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr));
           gap: 10px; margin-bottom: 12px; }
  .tile { background: var(--card); border-radius: 8px; padding: 10px 12px;
          box-shadow: 0 1px 2px rgba(16, 24, 40, .08); }
  .tile .label { color: var(--muted); font-size: 12px; }
  .tile .value { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
  .charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(380px, 1fr)); gap: 12px; }
  .chart { background: var(--card); border-radius: 8px; padding: 10px 12px;
           box-shadow: 0 1px 2px rgba(16, 24, 40, .08); }
  .chart h2 { font-size: 14px; margin: 0 0 6px; }
  canvas { width: 100%; height: 220px; display: block; }
</style>
</head>
<body data-samples="0" data-error="">
<header>
  <h1>Cold-segment sidecar</h1>
  <span id="status">connecting&hellip;</span>
</header>
<section class="tiles">
  <div class="tile"><div class="label">byte hit ratio</div>
    <div class="value" id="byte-hit-ratio" data-value="">n/a</div></div>
  <div class="tile"><div class="label">block hit ratio</div>
    <div class="value" id="block-hit-ratio" data-value="">n/a</div></div>
  <div class="tile"><div class="label">prefetch accuracy</div>
    <div class="value" id="prefetch-accuracy" data-value="">n/a</div></div>
  <div class="tile"><div class="label">served now, cache / origin (MiB/s)</div>
    <div class="value" id="throughput" data-value="">&ndash;</div></div>
  <div class="tile"><div class="label">cache used / capacity (MiB)</div>
    <div class="value" id="cache-used" data-value="">&ndash;</div></div>
  <div class="tile"><div class="label">hits / misses</div>
    <div class="value" id="lookups" data-value="">&ndash;</div></div>
  <div class="tile"><div class="label">mode</div>
    <div class="value" id="mode" data-value="">&ndash;</div></div>
  <div class="tile"><div class="label">checksum failures</div>
    <div class="value" id="checksum-failures" data-value="">&ndash;</div></div>
</section>
<section class="charts">
  <div class="chart"><h2>Hit ratios (%)</h2>
    <canvas id="chart-ratios" data-points="0" data-draws="0"></canvas></div>
  <div class="chart"><h2>Served to clients by source (MiB/s)</h2>
    <canvas id="chart-throughput" data-points="0" data-draws="0"></canvas></div>
  <div class="chart"><h2>Cache occupancy (MiB)</h2>
    <canvas id="chart-occupancy" data-points="0" data-draws="0"></canvas></div>
</section>
<script>
"use strict";
const params = new URLSearchParams(location.search);
const INTERVAL_MS = Math.max(100, Number(params.get("interval_ms")) || 2000);
const HISTORY = 600;
const MIB = 1048576;
const samples = [];  // one entry per poll, the newest last
let previous = null;

function pct(v) { return v === null || v === undefined ? "n/a" : (100 * v).toFixed(2) + "%"; }
function mib(v) { return (v / MIB).toFixed(1); }
function show(id, text, raw) {
  const el = document.getElementById(id);
  el.textContent = text;
  el.dataset.value = raw === null || raw === undefined ? "" : String(raw);
}

function ingest(s) {
  const sample = { t: s.time, byte: s.byte_hit_ratio, block: s.block_hit_ratio,
                   cacheRate: null, originRate: null,
                   used: s.cache.used_bytes, capacity: s.cache.capacity_bytes };
  if (previous !== null && s.time > previous.time) {
    const dt = s.time - previous.time;
    sample.cacheRate = Math.max(0, s.served_bytes.cache - previous.served_bytes.cache) / dt;
    sample.originRate = Math.max(0, s.served_bytes.origin - previous.served_bytes.origin) / dt;
  }
  previous = s;
  samples.push(sample);
  if (samples.length > HISTORY) samples.shift();
  return sample;
}

function showTiles(s, sample) {
  show("byte-hit-ratio", pct(s.byte_hit_ratio), s.byte_hit_ratio);
  show("block-hit-ratio", pct(s.block_hit_ratio), s.block_hit_ratio);
  show("prefetch-accuracy", pct(s.prefetch.accuracy), s.prefetch.accuracy);
  show("throughput", sample.cacheRate === null ? "\\u2013"
       : mib(sample.cacheRate) + " / " + mib(sample.originRate), sample.cacheRate);
  const cap = s.cache.capacity_bytes;
  show("cache-used", mib(s.cache.used_bytes) + " / " + mib(cap)
       + (cap ? " (" + (100 * s.cache.used_bytes / cap).toFixed(1) + "%)" : ""),
       s.cache.used_bytes);
  show("lookups", s.hits + " / " + s.misses, s.hits);
  show("mode", s.mode + (s.disk_problem ? " (" + s.disk_problem + ")" : ""), s.mode);
  show("checksum-failures", String(s.cache.checksum_failures), s.cache.checksum_failures);
}

// A line chart of `series` ({label, color, values}) over the samples.
// Null values leave gaps. `max` fixes the y range, otherwise it fits the data.
function drawChart(canvas, series, opts) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const left = 48, right = 8, top = 18, bottom = 20;
  const plotW = width - left - right, plotH = height - top - bottom;
  let max = opts.max;
  if (max === undefined) {
    max = 0;
    for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
    max = max > 0 ? max * 1.1 : 1;
  }
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = top + plotH - (plotH * i) / 4;
    ctx.strokeStyle = "#e4e7ec";
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + plotW, y); ctx.stroke();
    ctx.fillStyle = "#667085";
    ctx.textAlign = "right";
    ctx.fillText(((max * i) / 4).toFixed(max >= 10 ? 0 : 1), left - 6, y);
  }
  const n = series.length ? series[0].values.length : 0;
  const step = n > 1 ? plotW / (n - 1) : 0;
  // The first series is the headline figure: drawn last, so a close second
  // line (block vs byte hit ratio) never hides it.
  for (const s of [...series].reverse()) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      const x = left + i * step, y = top + plotH - (Math.min(v, max) / max) * plotH;
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  }
  let x = left;
  ctx.textAlign = "left";
  for (const s of series) {
    ctx.fillStyle = s.color;
    ctx.fillRect(x, 4, 10, 10);
    ctx.fillStyle = "#1d2330";
    ctx.fillText(s.label, x + 14, 9);
    x += ctx.measureText(s.label).width + 30;
  }
  canvas.dataset.points = String(n);
  canvas.dataset.draws = String(Number(canvas.dataset.draws) + 1);
}

function drawCharts() {
  const col = (f) => samples.map(f);
  const scaled = (v, k) => (v === null || v === undefined ? null : v * k);
  drawChart(document.getElementById("chart-ratios"), [
    { label: "bytes", color: "#12b76a", values: col((h) => scaled(h.byte, 100)) },
    { label: "blocks", color: "#2e90fa", values: col((h) => scaled(h.block, 100)) },
  ], { max: 100 });
  drawChart(document.getElementById("chart-throughput"), [
    { label: "cache", color: "#12b76a", values: col((h) => scaled(h.cacheRate, 1 / MIB)) },
    { label: "origin", color: "#f79009", values: col((h) => scaled(h.originRate, 1 / MIB)) },
  ], {});
  drawChart(document.getElementById("chart-occupancy"), [
    { label: "used", color: "#2e90fa", values: col((h) => h.used / MIB) },
    { label: "capacity", color: "#98a2b3", values: col((h) => h.capacity / MIB) },
  ], {});
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("/api/v1/stats", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const stats = await response.json();
    const sample = ingest(stats);
    showTiles(stats, sample);
    drawCharts();
    document.body.dataset.samples = String(Number(document.body.dataset.samples) + 1);
    document.body.dataset.error = "";
    status.className = "";
    status.textContent = "updated " + new Date(stats.time * 1000).toLocaleTimeString()
      + ", every " + INTERVAL_MS / 1000 + " s";
  } catch (error) {
    document.body.dataset.error = String(error);
    status.className = "error";
    status.textContent = "cannot read /api/v1/stats: " + error;
  } finally {
    setTimeout(poll, INTERVAL_MS);
  }
}

window.addEventListener("resize", drawCharts);
poll();
</script>
</body>
</html>
"""
