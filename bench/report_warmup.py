"""The report's warm-up section (bench/warmup.py): the whole data set warmed
through the warm lane, then replayed through the warmed sidecar."""

from __future__ import annotations

from typing import Any

from bench.report_format import (
    MiB,
    Results,
    Run,
    find_run,
    mbps,
    md_table,
    num,
    paragraph,
    pct,
)


def warmup_section(results: Results) -> list[str]:
    info = (results.get("scenarios") or {}).get("warmup")
    if not info:
        return []
    budget = info.get("warm_lane_budget_bytes_per_s") or 0
    out = [
        "## Warm-up ahead of a replay\n",
        paragraph("warmup", bandwidth=info.get("origin_bandwidth"),
                  warm_share=info.get("warm_share"), budget_mib=num(budget / MiB, 0),
                  concurrency=info.get("warm_concurrency"), cache_size=info.get("cache_size"),
                  segments=info.get("segments"), mib=num((info.get("bytes") or 0) / MiB, 0),
                  calls=info.get("calls_in_flight")) + "\n",
    ]
    if info.get("spark_failure"):
        out.append(f"The Spark job could not run, so the warm calls were sent directly: "
                   f"`{' '.join(str(info['spark_failure']).split())[-400:]}`\n")
    elif not info.get("spark_available", True):
        out.append(f"The Spark job was not used: {info.get('spark_unavailable_reason')}.\n")
    warm = find_run(results, "warmup", "warm")
    if warm is None:
        out.append("Warm-up failed / not run.\n")
    else:
        out += _warm_table(warm)
    replay = find_run(results, "warmup", "replay")
    if replay is None:
        out.append("Replay after the warm-up failed / not run.\n")
        return out
    return out + _replay_table(replay, info)


def _warm_table(warm: Run) -> list[str]:
    lane = warm.get("warm_lane") or {}
    via = ("Spark job, `--master local[2]`" if warm.get("via") == "spark"
           else "direct `POST /api/v1/warm`")
    waits = (warm.get("ratelimit_wait_seconds_by_lane") or {}).get("warm")
    held = ("the budget, not the connections, is what held it back"
            if isinstance(waits, int | float) and waits > 0.5 else
            "so what held it back was not the budget (connections, the sidecar's CPU)")
    return [
        md_table(
            ["warmed via", "bytes fetched", "warm lane s", "warm lane MiB/s", "vs budget",
             "steady MiB/s", "warm stage s", "warm stage MiB/s", "whole job s",
             "failed segments"],
            [[via, f"{num((warm.get('bytes_fetched') or 0) / MiB, 1)} MiB",
              num(lane.get("seconds"), 2), num((lane.get("bytes_per_s") or 0) / MiB),
              pct(warm.get("warm_lane_vs_budget"), 1),
              num((lane.get("steady_bytes_per_s") or 0) / MiB),
              num(warm.get("warm_stage_seconds"), 2),
              num((warm.get("warm_stage_bytes_per_s") or 0) / MiB),
              num(warm.get("job_seconds"), 1), str(warm.get("failed_segments", "?"))]]),
        "",
        paragraph("warmup-stage", waits=num(waits, 1), held=held) + "\n",
    ]


def _replay_table(replay: Run, info: dict[str, Any]) -> list[str]:
    stats = replay.get("sidecar") or {}
    latency = replay.get("fetch_latency_ms") or {}
    by_lane = replay.get("origin_bytes_by_lane") or {}
    return [
        md_table(
            ["replay after warm-up", "MB/s", "fetch p50 ms", "fetch p99 ms", "block hit ratio",
             "byte hit ratio", "foreground origin bytes", "prefetch origin bytes",
             "CRC errors"],
            [[f"partitions `{info.get('partitions')}`, concurrency {info.get('concurrency')}",
              num(mbps(replay)), num(latency.get("p50")), num(latency.get("p99")),
              pct(stats.get("block_hit_ratio")), pct(stats.get("byte_hit_ratio")),
              f"{int(by_lane.get('foreground', 0)):,}", f"{int(by_lane.get('prefetch', 0)):,}",
              str(replay.get("crc_errors", "n/a"))]]),
        "",
    ]
