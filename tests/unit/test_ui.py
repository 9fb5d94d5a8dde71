"""The built-in page is self-contained, comes with its first figures in it and
exposes the hooks scripts and tests read."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from sidecar.admin import ui
from tests.unit.test_stats import admin_port


def test_page_loads_nothing_from_elsewhere() -> None:
    assert not re.search(r"""\b(?:src|href)\s*=""", ui.PAGE)
    assert "<link" not in ui.PAGE and "@import" not in ui.PAGE and "url(" not in ui.PAGE
    assert not re.search(r"https?://", ui.PAGE)
    assert "default-src 'none'" in ui.CSP and "connect-src 'self'" in ui.CSP


def test_page_has_the_stable_hooks() -> None:
    for element_id in (
        "byte-hit-ratio", "block-hit-ratio", "byte-hit-ratio-1m", "block-hit-ratio-1m",
        "prefetch-accuracy", "mode", "disk", "disk-errors", "breaker", "cache-used",
        "cache-fill", "latency-p50", "latency-p99", "throughput", "origin-read",
        "origin-foreground", "origin-prefetch", "origin-warm", "origin-errors", "ratelimit",
        "evictions", "warm-blocks", "checksum-failures", "warm-calls", "memory-tier-hits",
        "memory-tier-used",
        "chart-ratios", "chart-throughput", "chart-origin", "chart-latency",
        "chart-origin-requests", "chart-ratelimit", "chart-occupancy", "chart-evictions",
        "chart-warm", "initial-stats", "status",
    ):
        assert f'id="{element_id}"' in ui.PAGE, element_id
    assert 'fetch("/api/v1/stats"' in ui.PAGE
    assert 'data-samples="0"' in ui.PAGE and 'data-polls="0"' in ui.PAGE
    assert "connecting" not in ui.PAGE
    assert ui.PAGE.count(ui.INITIAL_STATS_MARK) == 1


def initial_stats(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="initial-stats">(.*?)</script>',
                      page, re.S)
    assert match is not None
    stats: dict[str, Any] = json.loads(match.group(1))
    return stats


def test_the_stats_in_the_page_cannot_end_its_script_element() -> None:
    hostile = {"cache": {}, "warm_calls": [
        {"first_object": "b/</script><script>alert(1)</script><!--&"}]}
    page = ui.render(hostile)
    assert "alert(1)</script>" not in page and "<!--&" not in page
    # The same string once JSON.parse (here json.loads) reads it back.
    assert initial_stats(page) == hostile


async def test_the_page_says_why_an_auto_memory_tier_is_off() -> None:
    """memory_tier = auto on a cache too small for one chunk: the page says
    so (auto, too small), as the start-up warning does, not "memory_tier = 0"."""
    reason = "memory_tier auto is an eighth of cache_size (1024 bytes), less than one chunk"
    admin = admin_port(memory_tier_off=reason)
    async with TestClient(TestServer(admin.app())) as client:
        page = await (await client.get("/ui")).text()
        assert initial_stats(page)["memory_tier"]["off_reason"] == reason
        stats = await (await client.get("/api/v1/stats")).json()
        assert stats["memory_tier"]["off_reason"] == reason
    # What the page makes of it in a browser: tests/functional/test_ui_quiet.py.
    assert "autoOff ?" in ui.PAGE and "memory_tier = auto: off" in ui.PAGE
    assert '"cache too small"' in ui.PAGE
    async with TestClient(TestServer(admin_port().app())) as client:
        stats = await (await client.get("/api/v1/stats")).json()
        assert stats["memory_tier"]["off_reason"] is None


async def test_admin_port_serves_the_page_with_its_first_figures() -> None:
    admin = admin_port()
    async with TestClient(TestServer(admin.app())) as client:
        # Read-only: no admin token needed.
        response = await client.get("/ui")
        assert response.status == 200
        assert response.content_type == "text/html"
        assert response.headers["Content-Security-Policy"] == ui.CSP
        page = await response.text()
        assert ui.INITIAL_STATS_MARK not in page
        stats = initial_stats(page)
        assert stats["mode"] == "normal" and stats["time"] > 0
        assert stats["hits"] == 0 and stats["cache"]["capacity_bytes"] == 0
        # The sample taken when the port started: a window and a history from the start.
        assert stats["window"]["seconds"] > 0
        assert stats["history"]["capacity"] == 450 and stats["history"]["interval_s"] == 2.0
        assert stats["warm_calls"] == []
