"""The stats JSON (/api/v1/stats), as the admin port serves it, and its terminal
rendering (`sidecar stats`)."""

from __future__ import annotations

import re
from typing import Any, cast

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sidecar.admin.port import AdminPort
from sidecar.admin.stats import stats_snapshot
from sidecar.cache.ident import BlockIdent
from sidecar.cache.memory_tier import MemoryTier
from sidecar.cli import _format_stats
from sidecar.telemetry.metrics import Metrics
from tests.support.waiting import eventually_awaited


def busy_metrics() -> Metrics:
    metrics = Metrics(CollectorRegistry())
    metrics.cache_lookups.labels("hit").inc(9)
    metrics.cache_lookups.labels("miss").inc(1)
    metrics.served_bytes.labels("cache").inc(3 * 2**20)
    metrics.served_bytes.labels("origin").inc(2**20)
    metrics.origin_bytes.labels("foreground").inc(2**20)
    metrics.origin_bytes.labels("prefetch").inc(4 * 2**20)
    metrics.origin_requests.labels("foreground", "ok").inc(5)
    metrics.origin_requests.labels("prefetch", "error").inc(1)
    metrics.prefetch_blocks.labels("issued").inc(4)
    metrics.prefetch_blocks.labels("used").inc(3)
    metrics.prefetch_blocks.labels("wasted").inc(1)
    metrics.ratelimit_wait.labels("prefetch").inc(1.5)
    metrics.requests.labels("GetObject", "206").inc(10)
    metrics.requests.labels("GetObject", "404").inc(2)
    return metrics


def test_snapshot_ratios_and_totals() -> None:
    stats = stats_snapshot(busy_metrics())
    assert stats["block_hit_ratio"] == 0.9
    assert stats["byte_hit_ratio"] == 0.75
    assert stats["prefetch"]["accuracy"] == 0.75
    assert stats["origin_bytes"] == 5 * 2**20
    assert stats["origin"]["bytes"] == {"foreground": 2**20, "prefetch": 4 * 2**20, "warm": 0}
    assert stats["origin"]["requests"] == {"ok": 5, "not_found": 0, "error": 1}
    assert stats["origin"]["ratelimit_wait_seconds"]["prefetch"] == 1.5
    assert stats["requests"] == 12


def test_snapshot_breaks_down_what_the_page_shows() -> None:
    metrics = busy_metrics()
    metrics.evictions.labels("capacity").inc(4)
    metrics.evictions.labels("checksum").inc(1)
    metrics.disk_errors.labels("read").inc(2)
    stats = stats_snapshot(metrics)
    # The total stays an int under its old key; the breakdown is beside it.
    assert stats["cache"]["evictions"] == 5
    assert stats["cache"]["evictions_by_reason"] == {
        "capacity": 4, "checksum": 1, "invalidated": 0, "shrink": 0, "recovery": 0}
    assert stats["cache"]["disk_errors"] == {"read": 2, "write": 0}
    assert stats["origin"]["requests_by_lane"]["prefetch"] == {"ok": 0, "not_found": 0,
                                                               "error": 1}
    assert stats["origin"]["requests_by_lane"]["foreground"]["ok"] == 5


def test_snapshot_of_a_reading_is_the_snapshot_of_the_registry() -> None:
    metrics = busy_metrics()
    assert stats_snapshot(metrics.read()) == stats_snapshot(metrics)


def test_snapshot_of_an_idle_sidecar_has_no_ratios() -> None:
    stats = stats_snapshot(Metrics(CollectorRegistry()))
    assert stats["block_hit_ratio"] is None and stats["byte_hit_ratio"] is None
    assert stats["prefetch"]["accuracy"] is None
    assert stats["requests"] == 0


def rendered(stats: dict[str, Any]) -> dict[str, str]:
    lines = _format_stats(stats).splitlines()
    labels = [re.split(r"\s{2,}", line, maxsplit=1)[0] for line in lines]
    column = max(map(len, labels)) + 2
    # One column for the values.
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines)
    return {label: line[column:] for label, line in zip(labels, lines, strict=True)}


def test_summary_is_aligned_and_complete() -> None:
    stats = stats_snapshot(busy_metrics())
    stats.update(mode="cache-only", requested_mode="cache-only", disk_problem=None)
    lines = rendered(stats)
    assert lines["mode"] == "cache-only"
    assert lines["byte hit ratio"] == "75.00%"
    assert lines["block hit ratio"] == "90.00%  (9 hits, 1 misses)"
    assert lines["prefetch"] == "accuracy 75.00%  (4 issued, 3 used, 1 wasted)"
    assert lines["origin requests"] == "6 (1 failed)"
    assert lines["rate-limit waits"].startswith("foreground 0.0s, prefetch 1.5s")
    assert "warm-up blocks" not in lines  # nothing warmed: no line


def test_summary_says_how_many_warmed_blocks_wait_for_their_reader() -> None:
    metrics = busy_metrics()
    metrics.warm_blocks.labels("fetched").inc(8)
    metrics.cache_protected_blocks.set(3)
    stats = stats_snapshot(metrics)
    assert stats["cache"]["protected_blocks"] == 3
    stats.update(mode="normal", requested_mode="normal", disk_problem=None)
    assert rendered(stats)["warm-up blocks"] == (
        "8 fetched, 0 already cached, 0 failed; 3 waiting for their reader")
    metrics.cache_protected_blocks.set(0)  # all read: the line says no more
    stats = {**stats_snapshot(metrics), "mode": "normal", "requested_mode": "normal",
             "disk_problem": None}
    assert rendered(stats)["warm-up blocks"] == "8 fetched, 0 already cached, 0 failed"


def test_summary_names_a_forced_bypass() -> None:
    stats = stats_snapshot(Metrics(CollectorRegistry()))
    stats.update(mode="bypass", requested_mode="normal", disk_problem="EIO: Input/output error")
    assert rendered(stats)["mode"] == ("bypass (requested normal) - cache disk: "
                                       "EIO: Input/output error")
    assert rendered(stats)["byte hit ratio"] == "n/a"


def test_summary_of_an_older_sidecar_without_the_new_fields() -> None:
    stats = stats_snapshot(Metrics(CollectorRegistry()))
    for key in ("origin", "warm_blocks", "requests"):
        del stats[key]
    assert rendered(stats)["origin read"] == "0.0 MiB"


def test_summary_shows_an_open_breaker_and_the_last_start() -> None:
    metrics = busy_metrics()
    metrics.origin_breaker_state.labels("open").set(1)
    metrics.origin_breaker_rejected.inc(7)
    stats = stats_snapshot(metrics)
    stats.update(mode="normal")
    stats["cache"]["recovery"] = {"blocks_recovered": 1200, "bytes_recovered": 3 * 2**30,
                                  "corrupt_headers": 2, "duplicates": 1, "file": "reused"}
    lines = rendered(stats)
    assert lines["origin breaker"] == "open (7 misses refused)"
    assert lines["last start"] == ("1,200 blocks reused (3,072.0 MiB), 3 dropped, "
                                   "reused cache file")
    assert "origin breaker" not in rendered(stats_snapshot(busy_metrics()) | {"mode": "normal"})
    stats["cache"]["recovery"] |= {"scanning": True, "slots_scanned": 4096,
                                   "slots_to_scan": 2_000_000}
    assert rendered(stats)["last start"] == (
        "1,200 blocks reused (3,072.0 MiB), 3 dropped, reused cache file, "
        "scanning (4,096 of 2,000,000 slots)")


class IdleEngine:
    def activity(self) -> dict[str, int | bool]:
        return {"blocks_in_flight": 0, "idle": True}


def admin_port(**options: Any) -> AdminPort:
    return AdminPort(Metrics(CollectorRegistry()), lambda: True, cast(Any, IdleEngine()),
                     cast(Any, None), token="secret", **options)


async def test_stats_carry_a_window_and_give_history_when_asked() -> None:
    admin = admin_port(sample_interval_s=0.05)
    async with TestClient(TestServer(admin.app())) as client:
        plain = await (await client.get("/api/v1/stats")).json()
        assert plain["mode"] == "normal" and plain["time"] > 0
        assert plain["engine"]["idle"] is True
        assert "history" not in plain  # `sidecar stats` and scripts get a small answer
        assert set(plain["window"]) >= {"seconds", "hit_ratio", "served_bytes_per_s",
                                        "origin_bytes_per_s", "latency_s"}

        async def history_of_three() -> dict[str, Any] | None:
            answer = await (await client.get("/api/v1/stats?history=1")).json()
            history: dict[str, Any] = answer["history"]
            return history if len(history["time"]) >= 3 else None

        history = await eventually_awaited(history_of_three, "three points of history", 10)
        assert history["series"]["origin_bytes_per_s"]["prefetch"][:3] == [0.0] * 3
        since = history["time"][1]
        newer = (await (await client.get(f"/api/v1/stats?since={since}")).json())["history"]
        assert newer["time"] and min(newer["time"]) > since
        for bad in ("yesterday", "nan", "inf"):
            response = await client.get(f"/api/v1/stats?since={bad}")
            assert response.status == 400, bad
            assert "since" in (await response.json())["error"]


async def test_warm_calls_are_remembered_rejected_ones_too() -> None:
    admin = admin_port()
    async with TestClient(TestServer(admin.app())) as client:
        response = await client.post("/api/v1/warm", data=b"{not json",
                                     headers={"Authorization": "Bearer secret",
                                              "Content-Type": "application/json"})
        assert response.status == 400
        # Without the token the call is refused before it is a warm call.
        assert (await client.post("/api/v1/warm", data=b"{}")).status == 401
        calls = (await (await client.get("/api/v1/stats")).json())["warm_calls"]
        assert len(calls) == 1
        assert calls[0]["status"] == 400 and calls[0]["objects"] == 0
        assert calls[0]["error"].startswith("body: not JSON")
        assert calls[0]["seconds"] >= 0 and calls[0]["result"] is None


async def test_a_wrong_method_or_path_gets_a_json_error() -> None:
    """Scripts and `sidecar mode|purge` read {"error": ...} from every refusal; the
    router's own 404 and 405 were plain text."""
    admin = admin_port()
    async with TestClient(TestServer(admin.app())) as client:
        for method, path, status in (("POST", "/api/v1/mode", 405),
                                     ("GET", "/api/v1/warm", 405),
                                     ("DELETE", "/api/v1/stats", 405),
                                     ("GET", "/api/v1/nothing", 404)):
            response = await client.request(method, path, headers={
                "Authorization": "Bearer secret", "Content-Type": "application/json"})
            assert response.status == status, (method, path)
            assert response.content_type == "application/json", (method, path)
            error = (await response.json())["error"]
            assert error and "secret" not in error
            if status == 405:
                assert method in error
                assert response.headers["Allow"]  # still says what is allowed


def test_summary_counts_origin_not_found_apart_from_failures() -> None:
    """A 404 from the origin (a deleted segment) is no origin failure: /ui and the
    error-ratio alert count only `error`, and so does the summary."""
    metrics = busy_metrics()
    metrics.origin_requests.labels("foreground", "not_found").inc(3)
    lines = rendered(stats_snapshot(metrics))
    assert lines["origin requests"] == "9 (1 failed, 3 not found)"


def test_the_memory_tiers_refused_and_declined_chunks_are_exported() -> None:
    """A full tier of one region: a chunk offered once is declined (not read
    again soon enough); offered again while the region is being sent from, it is
    admitted but refused (no region to take). Both are counters of the tier's
    family, read from its own counts at each scrape."""
    metrics = Metrics(CollectorRegistry())
    tier = MemoryTier(4096, 4096)
    try:
        metrics.memory_tier.watch(tier.figures)
        first = (BlockIdent("b", "k", "e", 0), 1, 0)
        second = (BlockIdent("b", "k", "e", 1), 1, 0)
        assert tier.put(first, b"a" * 100)
        sending = tier.slice(first, 0, 100)
        assert sending is not None
        assert not tier.put(second, b"b" * 100)  # declined
        assert not tier.put(second, b"b" * 100)  # admitted, but the one region is pinned
        sending.release()
        reading = metrics.read()
        assert reading.value("sidecar_memory_tier_declined_total") == 1
        assert reading.value("sidecar_memory_tier_refused_total") == 1
        snapshot = stats_snapshot(reading)["memory_tier"]
        assert snapshot["declined"] == 1 and snapshot["refused"] == 1
    finally:
        tier.close()
