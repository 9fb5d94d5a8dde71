"""How the data port ends an answer whose body cannot be finished.

Once the headers (with a Content-Length) are out, a failure must cut the
connection: a second response written into the body, or a short body on a
connection kept alive, would hand the client wrong bytes. The engine is
scripted; the port is aiohttp's own test server, read over a raw socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import cast

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from sidecar.engine import Engine, Piece, Source
from sidecar.errors import OriginUnavailable
from sidecar.model import ObjectInfo
from sidecar.origin.client import Origin
from sidecar.s3.dataport import DataPort
from sidecar.telemetry.metrics import Metrics

SIZE = 4096
INFO = ObjectInfo(bucket="bkt", key="seg.log", size=SIZE, etag='"e1"',
                  last_modified=datetime(2026, 11, 1, tzinfo=UTC))


class _Origin:
    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return INFO


class _FailingEngine:
    """Yields the first 1000 bytes, then fails with `failure`."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return False

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None
                     ) -> AsyncGenerator[tuple[Piece, Source], None]:
        yield b"a" * 1000, Source.ORIGIN
        raise self.failure


async def _raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        received = bytearray()
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            received += chunk
        return bytes(received)
    except ConnectionResetError:
        return bytes(received)
    finally:
        writer.close()


@pytest.mark.parametrize("failure", [
    RuntimeError("the cache disk failed under sendfile"),
    OSError(5, "Input/output error"),
    OriginUnavailable("the origin went away"),
    ConnectionAbortedError("the engine gave up on a block at shutdown"),
])
async def test_a_failure_after_the_headers_cuts_the_connection(failure: BaseException) -> None:
    metrics = Metrics(CollectorRegistry())
    port = DataPort(cast(Engine, _FailingEngine(failure)), cast(Origin, _Origin()), metrics)
    async with TestServer(port.app()) as server:
        assert server.port is not None
        # Two requests on one keep-alive connection: the second must never be read
        # as the rest of the first body.
        one = b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\n\r\n"
        answer = await _raw_exchange(server.port, one + one)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 4096" in head
    assert body == b"a" * 1000, "the body must stop short, with nothing after it"
    assert b"HTTP/1.1" not in body
    assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": "500"}) == 0


