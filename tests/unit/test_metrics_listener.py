"""`metrics_listen`'s app: on loopback it answers only under a loopback Host (a
page rebinding its own name to 127.0.0.1 must not read the counters), off
loopback under any Host a scraper may use."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sidecar.admin.port import metrics_app
from sidecar.telemetry.metrics import Metrics


async def status_under(loopback_host: str | None, host: str) -> tuple[int, str]:
    app = metrics_app(Metrics(CollectorRegistry()), loopback_host)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.get("/metrics", headers={"Host": host})
        return response.status, await response.text()


@pytest.mark.parametrize("host", ["127.0.0.1:9332", "localhost:9332", "[::1]:9332",
                                  "127.0.0.1", "LOCALHOST", "metrics.node.internal:9332"])
async def test_on_loopback_the_loopback_names_and_the_configured_one_are_served(
        host: str) -> None:
    status, body = await status_under("metrics.node.internal", host)
    assert status == 200 and "sidecar_requests_total" in body, host


@pytest.mark.parametrize("host", ["rebind.attacker.example:9332", "10.0.0.7:9332",
                                  "::1", "127.0.0.1:x"])
async def test_on_loopback_any_other_host_is_misdirected(host: str) -> None:
    status, body = await status_under("127.0.0.1", host)
    assert status == 421, host
    assert "sidecar_" not in body and "loopback Host" in body


async def test_off_loopback_any_host_is_served() -> None:
    status, body = await status_under(None, "rebind.attacker.example:9332")
    assert status == 200 and "sidecar_requests_total" in body
