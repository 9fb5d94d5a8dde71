"""The built-in page is self-contained and exposes the hooks scripts and tests read."""

from __future__ import annotations

import re
from typing import Any, cast

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sidecar.admin import ui
from sidecar.admin.port import AdminPort
from sidecar.telemetry.metrics import Metrics


def test_page_loads_nothing_from_elsewhere() -> None:
    assert not re.search(r"""\b(?:src|href)\s*=""", ui.PAGE)
    assert "<link" not in ui.PAGE and "@import" not in ui.PAGE and "url(" not in ui.PAGE
    assert not re.search(r"https?://", ui.PAGE)
    assert "default-src 'none'" in ui.CSP and "connect-src 'self'" in ui.CSP


def test_page_has_the_stable_hooks() -> None:
    for element_id in ("byte-hit-ratio", "block-hit-ratio", "prefetch-accuracy", "mode",
                       "cache-used", "chart-ratios", "chart-throughput", "chart-occupancy"):
        assert f'id="{element_id}"' in ui.PAGE
    assert 'fetch("/api/v1/stats"' in ui.PAGE
    assert 'data-samples="0"' in ui.PAGE


class IdleEngine:
    def activity(self) -> dict[str, int | bool]:
        return {"blocks_in_flight": 0, "idle": True}


async def test_admin_port_serves_the_page() -> None:
    admin = AdminPort(Metrics(CollectorRegistry()), lambda: True, cast(Any, IdleEngine()),
                      cast(Any, None), token="secret")
    async with TestClient(TestServer(admin.app())) as client:
        # Read-only: no admin token needed.
        response = await client.get("/ui")
        assert response.status == 200
        assert response.content_type == "text/html"
        assert response.headers["Content-Security-Policy"] == ui.CSP
        assert await response.text() == ui.PAGE
        stats = await (await client.get("/api/v1/stats")).json()
        assert stats["mode"] == "normal" and stats["time"] > 0
        assert stats["engine"]["idle"] is True
