"""The report's broker section (bench/broker.py): consumers catching up through
a real Kafka broker, each remote storage path side by side, with the request
pattern its manager sent and what reached the origin."""

from __future__ import annotations

from typing import Any

from bench.report_format import (
    MiB,
    Results,
    broker_cpu,
    find_run,
    mbps,
    md_table,
    num,
    paragraph,
    pct,
    ratio_of,
    times,
)

_BROKER_ROWS = (
    ("local", "local log (`catchup-local`, never tiered): the ceiling"),
    ("direct", "manager → origin (direct)"),
    ("plugin_cache", "manager + its disk chunk cache → origin"),
    ("sidecar_cold", "manager → **sidecar, cold** → origin"),
    ("sidecar_warm", "manager → **sidecar, warmed** → origin"),
    ("sidecar_warm_tier", "manager → sidecar, warmed, memory_tier = auto → origin"),
    ("sidecar_warm_1m", "manager, 1 MiB chunks → **sidecar, warmed** → origin"),
)


def _mib(value: Any) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value / MiB:,.1f}"


def _size(value: Any) -> str:
    if not isinstance(value, int | float):
        return "n/a"
    if value < 1024:
        return f"{value:.0f} B"
    if value < MiB:
        return f"{value / 1024:.1f} KiB"
    return f"{value / MiB:.1f} MiB"


def _sizes(pattern: dict[str, Any]) -> str:
    sizes = pattern.get("sizes") or {}
    return " / ".join(_size(sizes.get(name)) for name in ("p10", "p50", "p90", "max"))


def broker_section(results: Results) -> list[str]:
    info = (results.get("scenarios") or {}).get("broker")
    if not info:
        return []
    out = ["## Catching up through a real Kafka broker\n", _intro(results, info) + "\n"]
    if info.get("spark_failure"):
        out.append(f"The Spark job could not run, so the warm calls were sent directly: "
                   f"`{' '.join(str(info['spark_failure']).split())[-400:]}`\n")
    return [*out, *_paths(results), *_endpoint_patterns(results), *_broker_threads(results),
            *_origin_patterns(results)]


def _intro(results: Results, info: dict[str, Any]) -> str:
    warm = find_run(results, "broker", "sidecar_warm") or {}
    warmed = warm.get("warm_up") or {}
    via = {"spark": "the Spark job (`--master local[2]`)",
           "direct": "direct `POST /api/v1/warm` calls"}.get(str(warmed.get("via")), "n/a")
    return paragraph(
        "broker", kafka_version=info.get("kafka_version", ""),
        java_version=info.get("java_version", "Java"), heap=info.get("broker_heap", "?"),
        chunk_mib=num((info.get("chunk_bytes") or 0) / MiB, 0),
        partitions=info.get("partitions", "?"),
        records=num(info.get("records_per_partition"), 0),
        record_bytes=info.get("record_bytes", "?"),
        segment_mib=num((info.get("segment_bytes") or 0) / MiB, 0),
        remote_segments=info.get("remote_segments", "?"),
        remote_mib=num((info.get("remote_log_bytes") or 0) / MiB, 1),
        value_mib=num((info.get("value_bytes") or 0) / MiB, 1),
        prefetch_mib=num((info.get("prefetch_bytes") or 0) / MiB, 0),
        cache_size=info.get("sidecar_cache_size"), via=via,
        warmed=(f" ({num(warmed.get('seconds'), 1)} s, "
                f"{num((warmed.get('bytes_fetched') or 0) / MiB, 0)} MiB fetched)"
                if warmed else ""))


def _paths(results: Results) -> list[str]:
    direct, local = find_run(results, "broker", "direct"), find_run(results, "broker", "local")
    rows = []
    for run_name, label in _BROKER_ROWS:
        data = find_run(results, "broker", run_name)
        if data is None:
            rows.append([label, "failed / not run", *[""] * 12])
            continue
        latency = data.get("fetch_latency_ms") or {}
        traffic = data.get("origin_traffic") or {}
        rows.append([
            label, num(mbps(data)), times(ratio_of(mbps(data), mbps(direct))),
            times(ratio_of(mbps(data), mbps(local))),
            f"{data.get('records', 0):,} of {data.get('records_expected', 0):,}",
            num(latency.get("p50")), num(latency.get("p99")),
            num(broker_cpu(data, "broker_cpu_per_gib"), 2),
            num(broker_cpu(data, "sidecar_cpu_per_gib"), 2)
            if data.get("sidecar_cpu_per_gib") else "-",
            num(broker_cpu(data, "consumer_cpu_per_gib"), 2),
            f"{traffic.get('get_requests', 0):,}", _mib(traffic.get("body_bytes")),
            times(data.get("origin_body_bytes_per_consumed_byte")),
            num((data.get("foreign_cpu") or {}).get("cores"), 2),
        ])
    return [md_table(["path", "MB/s", "x direct", "x local", "records verified",
                      "fetch p50 ms", "fetch p99 ms", "broker CPU-s/GiB",
                      "sidecar CPU-s/GiB", "consumer CPU-s/GiB", "origin GETs",
                      "origin MiB", "origin bytes / consumed", "other processes"], rows), ""]


def _endpoint_patterns(results: Results) -> list[str]:
    """What the manager asked of its endpoint."""
    out = [paragraph("broker-pattern") + "\n"]
    histogram_labels: list[str] = []
    rows = []
    for run_name, label in _BROKER_ROWS:
        pattern = (find_run(results, "broker", run_name) or {}).get("endpoint_pattern")
        if not pattern:
            continue
        kinds = pattern.get("by_kind") or {}
        ranges = pattern.get("ranges") or {}
        histogram = pattern.get("histogram") or {}
        histogram_labels = histogram_labels or list(histogram)
        rows.append([
            label, f"{pattern.get('requests', 0):,}",
            " / ".join(f"{(kinds.get(kind) or {}).get('gets', 0):,} "
                       f"({pct((kinds.get(kind) or {}).get('share'), 0)})"
                       for kind in ("rsm-manifest", "indexes", "log")),
            " / ".join(str(ranges.get(form, 0)) for form in ("closed", "open", "none")),
            _sizes(pattern),
            " / ".join(str(histogram.get(name, 0)) for name in histogram_labels),
            str(pattern.get("connections") or "n/a"),
            num(pattern.get("requests_per_connection")),
        ])
    if rows:
        out += [md_table(["path", "requests", "GETs: manifest / indexes / log",
                          "ranges closed / open / none", "GET size p10 / p50 / p90 / max",
                          "GETs " + " / ".join(histogram_labels), "connections",
                          "requests per connection"], rows), ""]
    return out


def _broker_threads(results: Results) -> list[str]:
    rows = []
    for run_name, label in _BROKER_ROWS:
        split = ((find_run(results, "broker", run_name) or {})
                 .get("broker_threads_per_gib") or {})
        if split:
            top = sorted(split.items(), key=lambda item: -item[1])[:6]
            rows.append([label, ", ".join(f"`{kind}` {value:.2f}" for kind, value in top)])
    if not rows:
        return []
    return [paragraph("broker-threads") + "\n",
            md_table(["path", "broker CPU-s/GiB by thread"], rows), ""]


def _origin_patterns(results: Results) -> list[str]:
    rows = []
    for run_name, label in _BROKER_ROWS:
        data = find_run(results, "broker", run_name)
        pattern = (data or {}).get("origin_pattern")
        if not pattern:
            continue
        methods = pattern.get("methods") or {}
        kinds = pattern.get("by_kind") or {}
        rows.append([
            label, f"{methods.get('GET', 0):,}", f"{methods.get('HEAD', 0):,}",
            " / ".join(f"{(kinds.get(kind) or {}).get('gets', 0):,}"
                       for kind in ("rsm-manifest", "indexes", "log")),
            _sizes(pattern), _mib(pattern.get("bytes")),
            str(pattern.get("connections") or "-"),
            num(pattern.get("requests_per_connection")),
        ])
    return [paragraph("broker-origin") + "\n",
            md_table(["path", "GETs", "HEADs", "GETs: manifest / indexes / log",
                      "GET size p10 / p50 / p90 / max", "MiB sent", "connections",
                      "requests per connection"], rows), ""]
