"""Writes sidecar-dashboard.json next to this file: `python deploy/grafana/generate_dashboard.py`.

The dashboard is generated so that every panel follows the same rules: the
datasource is the `$datasource` variable, every selector carries
`job=~"$job",instance=~"$instance"` (the instances offered are those of the
chosen jobs), rates use `$__rate_interval`, each quantity is shown fleet-wide
(summed over the selected instances) and per instance, and each series is drawn
in its unit (one unit per panel: CPU and memory are two panels). The test suite
checks the committed JSON is this script's output and runs every expression
against a real Prometheus scraping a sidecar.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job",instance=~"$instance"'
# The process collectors' metrics carry no sidecar_ prefix, and other targets of
# a job may export them too: keep only the instances that are sidecars.
ONLY_SIDECARS = f"and on (job, instance) group by (job, instance) (sidecar_mode{{{SEL}}})"
# CPU seconds per second, i.e. cores busy (Grafana's custom-unit syntax).
CORES = "suffix: cores"
RATE = "$__rate_interval"
OUTPUT = Path(__file__).with_name("sidecar-dashboard.json")


def rate(metric: str, matchers: str = "") -> str:
    inner = f"{SEL},{matchers}" if matchers else SEL
    return f"rate({metric}{{{inner}}}[{RATE}])"


def ratio(metric: str, part: str, whole: str = "", by: str = "") -> str:
    """sum(rate(part)) / sum(rate(whole)), optionally `by` labels."""
    grouping = f" by ({by})" if by else ""
    return (f"sum{grouping} ({rate(metric, part)})\n  / sum{grouping} ({rate(metric, whole)})")


def quantile(q: float, metric: str, by: str, matchers: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) ({rate(metric + '_bucket', matchers)}))"


def target(expr: str, legend: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows top to bottom."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = 0
        self._y = 0
        self._row_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self._add({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)

    def panel(
        self, kind: str, title: str, description: str, targets: list[dict[str, Any]],
        unit: str, width: int, height: int = 8, **defaults: Any,
    ) -> None:
        if self._x + width > 24:
            self._newline()
        for ref, item in zip("ABCDEFGH", targets, strict=False):
            item["refId"] = ref
        options: dict[str, Any] = (
            {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
             "colorMode": "value", "graphMode": "area", "textMode": "auto"}
            if kind == "stat" else
            {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
             "tooltip": {"mode": "multi", "sort": "desc"}}
        )
        self._add({
            "type": kind, "title": title, "description": description, "datasource": DS,
            "fieldConfig": {"defaults": {"unit": unit, **defaults}, "overrides": []},
            "options": options, "targets": targets,
        }, width, height)

    def _add(self, panel: dict[str, Any], width: int, height: int) -> None:
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"h": height, "w": width, "x": self._x, "y": self._y}
        self.panels.append(panel)
        self._x += width
        self._row_height = max(self._row_height, height)

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_height
        self._x, self._row_height = 0, 0


def build() -> dict[str, Any]:
    served = "sidecar_served_bytes_total"
    lookups = "sidecar_cache_lookups_total"
    prefetch = "sidecar_prefetch_blocks_total"
    layout = Layout()

    layout.row("Fleet (selected instances)")
    layout.panel("stat", "Byte hit ratio",
                 "Share of bytes sent to clients that came from the cache.",
                 [target(ratio(served, 'source="cache"'), "bytes")], "percentunit", 4, 5,
                 min=0, max=1)
    layout.panel("stat", "Block hit ratio", "Share of block lookups by clients found in the cache.",
                 [target(ratio(lookups, 'result="hit"'), "blocks")], "percentunit", 4, 5,
                 min=0, max=1)
    layout.panel("stat", "Prefetch accuracy",
                 "Of read-ahead blocks whose fate is known, the share a reader used.",
                 [target(ratio(prefetch, 'outcome="used"', 'outcome=~"used|wasted"'), "accuracy")],
                 "percentunit", 4, 5, min=0, max=1)
    layout.panel("stat", "Served to clients", "Bytes per second sent to clients, all sources.",
                 [target(f"sum ({rate(served)})", "served")], "Bps", 4, 5)
    layout.panel("stat", "Cache used", "Cached bytes over capacity, summed over instances.",
                 [target(f"sum (sidecar_cache_used_bytes{{{SEL}}})\n"
                         f"  / sum (sidecar_cache_capacity_bytes{{{SEL}}})", "used")],
                 "percentunit", 4, 5, min=0, max=1)
    layout.panel("stat", "Instances not in normal mode",
                 "Sidecars in no-prefetch, cache-only or bypass "
                 "(a failing cache disk forces bypass).",
                 [target(f'count (sidecar_mode{{{SEL},mode!="normal"}} == 1) or vector(0)',
                         "instances")], "none", 4, 5)

    layout.row("Hit ratios")
    for title, part, metric in (("Byte hit ratio", 'source="cache"', served),
                                ("Block hit ratio", 'result="hit"', lookups)):
        layout.panel("timeseries", title,
                     "Fleet-wide (all selected instances) and per instance.",
                     [target(ratio(metric, part), "fleet"),
                      target(ratio(metric, part, by="instance"), "{{instance}}")],
                     "percentunit", 12, min=0, max=1)

    layout.row("Traffic")
    layout.panel("timeseries", "Served bytes by source",
                 "Bytes per second sent to clients, from the cache or straight from the origin.",
                 [target(f"sum by (source) ({rate(served)})", "fleet {{source}}"),
                  target(f"sum by (instance, source) ({rate(served)})",
                         "{{instance}} {{source}}")], "Bps", 12, min=0)
    layout.panel("timeseries", "Client requests by operation and status",
                 "Requests per second answered on the data port.",
                 [target(f"sum by (op, code) ({rate('sidecar_requests_total')})",
                         "{{op}} {{code}}"),
                  target(f"sum by (instance) ({rate('sidecar_requests_total')})",
                         "{{instance}}")], "reqps", 12, min=0)
    layout.panel("timeseries", "Origin bytes by lane",
                 "Bytes per second read from the object store: "
                 "foreground misses, read-ahead, warm-up.",
                 [target(f"sum by (lane) ({rate('sidecar_origin_bytes_total')})", "fleet {{lane}}"),
                  target(f"sum by (instance, lane) ({rate('sidecar_origin_bytes_total')})",
                         "{{instance}} {{lane}}")], "Bps", 12, min=0)
    layout.panel("timeseries", "Origin requests by lane and outcome",
                 "Object store requests per second; outcome is ok, not_found or error.",
                 [target(f"sum by (lane, outcome) ({rate('sidecar_origin_requests_total')})",
                         "{{lane}} {{outcome}}"),
                  target(f"sum by (instance, lane) ({rate('sidecar_origin_requests_total')})",
                         "{{instance}} {{lane}}")], "reqps", 12, min=0)

    layout.row("Latency")
    origin_duration = "sidecar_origin_request_duration_seconds"
    layout.panel("timeseries", "Origin latency percentiles",
                 "Object store request duration until the last byte, by lane (fleet), "
                 "and p99 per instance.",
                 [target(quantile(0.5, origin_duration, "lane"), "p50 {{lane}}"),
                  target(quantile(0.9, origin_duration, "lane"), "p90 {{lane}}"),
                  target(quantile(0.99, origin_duration, "lane"), "p99 {{lane}}"),
                  target(quantile(0.99, origin_duration, "instance"), "p99 {{instance}}")],
                 "s", 12, min=0)
    request_duration = "sidecar_request_duration_seconds"
    layout.panel("timeseries", "Request latency by hit / miss",
                 "GetObject duration until the last byte: served from the cache (hit), "
                 "partly (partial) or from the origin (miss).",
                 [target(quantile(0.5, request_duration, "cache", 'op="GetObject"'),
                         "p50 {{cache}}"),
                  target(quantile(0.99, request_duration, "cache", 'op="GetObject"'),
                         "p99 {{cache}}"),
                  target(quantile(0.99, request_duration, "instance", 'op="GetObject"'),
                         "p99 {{instance}}")], "s", 12, min=0)

    layout.row("Read-ahead and warm-up")
    layout.panel("timeseries", "Prefetch blocks: issued, used, wasted",
                 "Read-ahead blocks per second: fetched ahead, "
                 "then read by a client or evicted unread.",
                 [target(f"sum by (outcome) ({rate(prefetch)})", "fleet {{outcome}}"),
                  target(f"sum by (instance, outcome) ({rate(prefetch)})",
                         "{{instance}} {{outcome}}")], "ops", 6, min=0)
    layout.panel("timeseries", "Prefetch accuracy",
                 "used / (used + wasted): "
                 "below ~80% read-ahead costs more origin bytes than it saves.",
                 [target(ratio(prefetch, 'outcome="used"', 'outcome=~"used|wasted"'), "fleet"),
                  target(ratio(prefetch, 'outcome="used"', 'outcome=~"used|wasted"',
                               by="instance"), "{{instance}}")], "percentunit", 6, min=0, max=1)
    layout.panel("timeseries", "Warm-up blocks",
                 "Blocks asked for by warm-up calls per second: fetched, already cached or failed.",
                 [target(f"sum by (outcome) ({rate('sidecar_warm_blocks_total')})",
                         "fleet {{outcome}}"),
                  target(f"sum by (instance, outcome) ({rate('sidecar_warm_blocks_total')})",
                         "{{instance}} {{outcome}}")], "ops", 6, min=0)
    layout.panel("timeseries", "Warmed blocks waiting for their reader",
                 "Blocks a warm-up protects on the cache disk until they are read or its ttl_s "
                 "passes. They rise with a warm-up and fall as the planned replay reads them; "
                 "still high long after it, the warm-up fetched what was not read.",
                 [target(f"sum by (instance) (sidecar_cache_protected_blocks{{{SEL}}})",
                         "{{instance}}")], "none", 6, min=0)

    layout.row("Cache")
    layout.panel("timeseries", "Cache used vs capacity",
                 "Cached bytes and usable capacity (capacity drops when the cache disk runs low).",
                 [target(f"sum (sidecar_cache_used_bytes{{{SEL}}})", "fleet used"),
                  target(f"sum (sidecar_cache_capacity_bytes{{{SEL}}})", "fleet capacity"),
                  target(f"sum by (instance) (sidecar_cache_used_bytes{{{SEL}}})",
                         "{{instance}} used"),
                  target(f"sum by (instance) (sidecar_cache_capacity_bytes{{{SEL}}})",
                         "{{instance}} capacity")], "bytes", 6, min=0)
    layout.panel("timeseries", "Cached blocks", "Blocks held in the cache.",
                 [target(f"sum (sidecar_cache_blocks{{{SEL}}})", "fleet"),
                  target(f"sum by (instance) (sidecar_cache_blocks{{{SEL}}})", "{{instance}}")],
                 "none", 6, min=0)
    layout.panel("timeseries", "Evictions by reason",
                 "Blocks dropped per second: capacity (LRU), checksum, invalidated (DELETE/purge), "
                 "shrink (low disk space).",
                 [target(f"sum by (reason) ({rate('sidecar_cache_evictions_total')})",
                         "fleet {{reason}}"),
                  target(f"sum by (instance, reason) ({rate('sidecar_cache_evictions_total')})",
                         "{{instance}} {{reason}}")], "ops", 6, min=0)
    layout.panel("timeseries", "Checksum failures and disk errors",
                 "Cached blocks whose data did not match their checksum (dropped and refetched), "
                 "and reads and writes the cache disk failed (EIO, ENOSPC). Any is a sign of a "
                 "failing cache disk; three failed reads within a minute, or a failed write, "
                 "put the node in bypass.",
                 [target(f"sum (increase(sidecar_cache_checksum_failures_total{{{SEL}}}[{RATE}]))",
                         "fleet"),
                  target(f"sum by (instance) "
                         f"(increase(sidecar_cache_checksum_failures_total{{{SEL}}}[{RATE}]))",
                         "{{instance}}"),
                  target(f"sum by (instance, op) "
                         f"(increase(sidecar_cache_disk_errors_total{{{SEL}}}[{RATE}]))",
                         "{{instance}} disk {{op}} errors")], "none", 6, min=0)

    layout.row("Memory tier")
    tier = "sidecar_memory_tier"
    hits, misses = rate(tier + "_hits_total"), rate(tier + "_misses_total")
    layout.panel("timeseries", "Memory tier used vs size",
                 "Verified chunks held in the memory tier (a sealed memfd, sent with sendfile) "
                 "and its size; of those, the chunks a warm-up put there, kept until read. It "
                 "is shared memory: it counts toward a container's memory limit, not toward "
                 "the process's RSS (deploy/README.md).",
                 [target(f"sum by (instance) ({tier}_used_bytes{{{SEL}}})", "{{instance}} used"),
                  target(f"sum by (instance) ({tier}_protected_bytes{{{SEL}}})",
                         "{{instance}} warmed, not yet read"),
                  target(f"sum by (instance) ({tier}_resident_bytes{{{SEL}}})",
                         "{{instance}} resident"),
                  target(f"sum by (instance) ({tier}_size_bytes{{{SEL}}})",
                         "{{instance}} size")], "bytes", 8, min=0)
    layout.panel("timeseries", "Memory tier hit ratio",
                 "Share of chunk lookups answered from the memory tier: sent with no disk read "
                 "and no second hash.",
                 [target(f"sum ({hits})\n  / sum ({hits} + {misses})", "fleet"),
                  target(f"sum by (instance) ({hits})\n  / sum by (instance) ({hits} + {misses})",
                         "{{instance}}")], "percentunit", 8, min=0, max=1)
    layout.panel("timeseries", "Memory tier inserts and evictions",
                 "Verified chunks entering the tier (from the origin or a read of the disk) "
                 "and leaving it to make room (their pages released), per second; and chunks "
                 "it did not take: declined (the tier full, the chunk not read again soon "
                 "enough: a working set larger than the tier) or refused (admitted, but every "
                 "region was being filled or sent from).",
                 [target(f"sum by (instance) ({rate(tier + '_inserts_total')})",
                         "{{instance}} inserts"),
                  target(f"sum by (instance) ({rate(tier + '_evictions_total')})",
                         "{{instance}} evictions"),
                  target(f"sum by (instance) ({rate(tier + '_declined_total')})",
                         "{{instance}} declined"),
                  target(f"sum by (instance) ({rate(tier + '_refused_total')})",
                         "{{instance}} refused")], "ops", 8, min=0)

    layout.row("Origin breaker, refused and cut-off requests")
    layout.panel("state-timeline", "Origin circuit breaker",
                 "The breaker's state per instance. Open: the object store kept failing, and "
                 "uncached reads get 503 at once; half-open: one probe is let through after "
                 "each cool-down, and its success closes the breaker.",
                 [target(f"max by (instance, state) (sidecar_origin_breaker_state{{{SEL}}}) == 1",
                         "{{instance}} {{state}}")], "none", 6)
    layout.panel("timeseries", "Origin calls refused by the open breaker",
                 "Origin calls per second answered 503 at once because the breaker was open.",
                 [target(f"sum ({rate('sidecar_origin_breaker_rejected_total')})", "fleet"),
                  target(f"sum by (instance) ({rate('sidecar_origin_breaker_rejected_total')})",
                         "{{instance}}")], "reqps", 6, min=0)
    layout.panel("timeseries", "Refused signatures by reason",
                 "Data-port requests per second refused with a 403 by the SigV4 check: "
                 "unsigned, an unknown key, a bad signature, an expired or skewed request. "
                 "A steady rate after a rollout means a client signs with a key the sidecar "
                 "does not know ([auth] keys).",
                 [target(f"sum by (reason) ({rate('sidecar_auth_failures_total')})",
                         "fleet {{reason}}"),
                  target(f"sum by (instance, reason) ({rate('sidecar_auth_failures_total')})",
                         "{{instance}} {{reason}}")], "reqps", 6, min=0)
    layout.panel("timeseries", "Answers cut off by reason",
                 "Answers per second the sidecar cut off after their 200 or 206 went out "
                 "(sidecar_requests_total counts them by that status): the client took no "
                 "bytes for client_timeout, a mode paused the origin reads the rest needed, "
                 "max_buffered refused them, the origin failed, or another error. A client "
                 "that hangs up itself is not counted here.",
                 [target(f"sum by (reason) ({rate('sidecar_client_cutoffs_total')})",
                         "fleet {{reason}}"),
                  target(f"sum by (instance, reason) ({rate('sidecar_client_cutoffs_total')})",
                         "{{instance}} {{reason}}")], "reqps", 6, min=0)

    layout.row("Isolation")
    layout.panel("timeseries", "Rate-limit waits by lane",
                 "Seconds per second origin reads waited for the bandwidth budget (1 = one read "
                 "always waiting).",
                 [target(f"sum by (lane) ({rate('sidecar_ratelimit_wait_seconds_total')})",
                         "fleet {{lane}}"),
                  target("sum by (instance, lane) "
                         f"({rate('sidecar_ratelimit_wait_seconds_total')})",
                         "{{instance}} {{lane}}")], "s", 6, min=0)
    layout.panel("state-timeline", "Mode",
                 "The mode in force per instance: normal, no-prefetch, cache-only or bypass.",
                 [target(f"max by (instance, mode) (sidecar_mode{{{SEL}}}) == 1",
                         "{{instance}} {{mode}}")], "none", 6)
    layout.panel("timeseries", "Process CPU",
                 "Cores busy (CPU seconds per second) of each sidecar process.",
                 [target(f"{rate('process_cpu_seconds_total')}\n  {ONLY_SIDECARS}",
                         "{{instance}}")], CORES, 6, min=0)
    layout.panel("timeseries", "CPU by thread",
                 "Cores busy per kind of sidecar thread: the event loop (HTTP, the cache "
                 "index, every send to a reader), origin (block GETs: receiving, hashing and "
                 "writing each block), io (the cache disk), access-log, other. A cold replay "
                 "is event loop and origin; one served from the cache is event loop and io.",
                 [target(f"sum by (instance, thread) "
                         f"({rate('sidecar_thread_cpu_seconds_total')})",
                         "{{instance}} {{thread}}")], CORES, 6, min=0)
    layout.panel("timeseries", "Process memory",
                 "Resident memory of each sidecar process (the slab's page cache is not in "
                 "it: see the cgroup's memory in deploy/README.md), and apart from it the "
                 "memory tier's shared memory, which a container's limit counts too.",
                 [target(f"process_resident_memory_bytes{{{SEL}}}\n  {ONLY_SIDECARS}",
                         "{{instance}} RSS"),
                  target(f"sidecar_memory_tier_resident_bytes{{{SEL}}}",
                         "{{instance}} memory tier (shared, not in RSS)")], "bytes", 6, min=0)

    return {
        "title": "Kafka cold-segment sidecar",
        "uid": "kafka-cold-sidecar",
        "description": "Hit rates, origin traffic, read-ahead, cache and isolation of the "
                       "tiered-storage read sidecars (metrics: docs/ARCHITECTURE.md).",
        "tags": ["kafka", "tiered-storage", "sidecar"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1,
             "options": [], "regex": "", "includeAll": False, "multi": False},
            # All jobs means every job that has sidecars (no allValue: Grafana sends
            # the listed values), so a query never reaches other jobs' targets.
            {"type": "query", "name": "job", "label": "Job", "datasource": DS,
             "query": {"query": "label_values(sidecar_build_info, job)", "refId": "job"},
             "definition": "label_values(sidecar_build_info, job)",
             "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
             "includeAll": True, "multi": True, "refresh": 2,
             "sort": 1, "hide": 0, "options": [], "regex": ""},
            # The instances of the chosen jobs.
            {"type": "query", "name": "instance", "label": "Instance", "datasource": DS,
             "query": {"query": 'label_values(sidecar_build_info{job=~"$job"}, instance)',
                       "refId": "instance"},
             "definition": 'label_values(sidecar_build_info{job=~"$job"}, instance)',
             "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
             "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2,
             "sort": 1, "hide": 0, "options": [], "regex": ""},
        ]},
        "panels": layout.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Write the dashboard JSON; with --check, only say whether it is current (exit 1 if
    not), as the test suite does."""
    if argv not in ([], ["--check"]):
        print("usage: generate_dashboard.py [--check]", file=sys.stderr)
        return 2
    wanted = render()
    if argv == ["--check"]:
        if OUTPUT.read_text() != wanted:
            print(f"{OUTPUT} is stale: run `python deploy/grafana/generate_dashboard.py` "
                  "and commit it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
    print(f"wrote {OUTPUT}", file=sys.stderr)
