"""How the data port ends an answer whose body cannot be finished.

Once the headers (with a Content-Length) are out, a failure must cut the
connection: a second response written into the body, or a short body on a
connection kept alive, would hand the client wrong bytes. Such a cut-off is
counted by why it happened (sidecar_client_cutoffs_total{reason}), apart from a
client that hung up itself; a failure before the headers is answered, never
counted as a cut-off. The engine is scripted, or real over a real store (the
engine tests' rig) where a real fetch is stopped; the port is aiohttp's own
test server, read over a raw socket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from sidecar.engine import Engine, Piece, Source
from sidecar.errors import DownloadsPaused, FetchStopped, OriginUnavailable, Overloaded
from sidecar.model import ObjectInfo
from sidecar.origin.client import Origin
from sidecar.s3.dataport import DataPort
from sidecar.telemetry.access_log import AccessLog
from sidecar.telemetry.metrics import CUTOFF_REASONS, Metrics
from tests.support.waiting import eventually_async
from tests.unit import test_engine
from tests.unit.test_engine import BLOCK, MakeRig, hold_back_after_first_chunk

make_rig = test_engine.make_rig  # the engine tests' rig, as a fixture of this module too

SIZE = 4096
INFO = ObjectInfo(bucket="bkt", key="seg.log", size=SIZE, etag='"e1"',
                  last_modified=datetime(2026, 11, 1, tzinfo=UTC))


class _Origin:
    def __init__(self, info: ObjectInfo = INFO) -> None:
        self.info = info

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return self.info


class _FailingEngine:
    """Yields the first `before` bytes (1000 unless told), then fails with `failure`."""

    def __init__(self, failure: BaseException, before: int = 1000) -> None:
        self.failure = failure
        self.before = before

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return False

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None
                     ) -> AsyncGenerator[tuple[Piece, Source], None]:
        if self.before:
            yield b"a" * self.before, Source.ORIGIN
        raise self.failure


class _EndlessEngine:
    """Yields 64 KiB pieces as long as they are taken (of an object of 1 TiB),
    letting the loop run between them as a real engine's reads do."""

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return False

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None
                     ) -> AsyncGenerator[tuple[Piece, Source], None]:
        while True:
            yield b"a" * 65536, Source.ORIGIN
            await asyncio.sleep(0)


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




def _cutoffs(metrics: Metrics) -> dict[str, float]:
    """sidecar_client_cutoffs_total by reason, those above zero."""
    counted = {reason: metrics.value("sidecar_client_cutoffs_total", {"reason": reason})
               for reason in CUTOFF_REASONS}
    return {reason: value for reason, value in counted.items() if value}


def _disconnects(metrics: Metrics) -> float:
    return metrics.value("sidecar_client_disconnects_total")


@pytest.mark.parametrize(("failure", "reason"), [
    (OriginUnavailable("the origin went away"), "origin"),
    (Overloaded("max_buffered"), "overloaded"),
    (DownloadsPaused("cache-only mode", "cache-only"), "paused"),
    (FetchStopped("the fetch was stopped"), "stopped"),
    # The engine's own, never the client's: no client took too long or left.
    (TimeoutError("no answer in time"), "error"),
    (ConnectionResetError("an engine failure of that type"), "error"),
    (RuntimeError("the cache disk failed under sendfile"), "error"),
])
async def test_a_cut_off_says_why_and_no_client_is_blamed_for_the_engines_failure(
    failure: BaseException, reason: str
) -> None:
    """A TimeoutError or ConnectionError the engine raised after the headers
    was counted as the client's (a client_timeout cut-off, a hang-up)."""
    metrics = Metrics(CollectorRegistry())
    port = DataPort(cast(Engine, _FailingEngine(failure)), cast(Origin, _Origin()), metrics)
    async with TestServer(port.app()) as server:
        assert server.port is not None
        answer = await _raw_exchange(server.port, b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\n\r\n")
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"a" * 1000
    assert _cutoffs(metrics) == {reason: 1}
    assert _disconnects(metrics) == 0


@pytest.mark.parametrize(("failure", "status"), [
    (TimeoutError("no answer in time"), b"500 "),
    (ConnectionResetError("an engine failure of that type"), b"500 "),
    (FetchStopped("the fetch was stopped"), b"503 "),
])
async def test_a_failure_before_the_headers_is_answered_and_is_no_cut_off(
    failure: BaseException, status: bytes
) -> None:
    """A TimeoutError before any header went out was counted as a
    client_timeout cut-off (and the client got no answer at all); an engine's
    ConnectionError as a client that left (499, sent to a client still there)."""
    metrics = Metrics(CollectorRegistry())
    port = DataPort(cast(Engine, _FailingEngine(failure, before=0)), cast(Origin, _Origin()),
                    metrics)
    async with TestServer(port.app()) as server:
        assert server.port is not None
        answer = await _raw_exchange(server.port, b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\n"
                                     b"Connection: close\r\n\r\n")
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert b"<Error><Code>" in answer
    assert _cutoffs(metrics) == {} and _disconnects(metrics) == 0
    assert metrics.value("sidecar_requests_total",
                         {"op": "GetObject", "code": status.decode().strip()}) == 1


@asynccontextmanager
async def _served(port: DataPort) -> AsyncIterator[int]:
    """The data port as the sidecar serves it (aiohttp's TestServer cancels a
    handler whose client hangs up; the sidecar's runner lets it see the hang-up)."""
    runner = web.AppRunner(port.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_a_client_that_hangs_up_is_a_disconnect_not_a_cut_off() -> None:
    metrics = Metrics(CollectorRegistry())
    huge = ObjectInfo(bucket="bkt", key="seg.log", size=1 << 40, etag='"e1"',
                      last_modified=INFO.last_modified)
    port = DataPort(cast(Engine, _EndlessEngine()), cast(Origin, _Origin(huge)), metrics)
    async with _served(port) as server_port:
        reader, writer = await asyncio.open_connection("127.0.0.1", server_port)
        writer.write(b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()  # unread bytes and all: the sidecar's next write fails
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    assert _disconnects(metrics) == 1 and _cutoffs(metrics) == {}


async def _read_head_and(reader: asyncio.StreamReader, body_bytes: int) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(body_bytes)
    return head


async def _rest(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""


async def test_a_block_given_up_when_the_engine_stops_is_a_cut_off_not_a_hang_up(
    make_rig: MakeRig,
) -> None:
    """A real fetch stopped under a reader (Engine.close, as the sidecar's stop
    does) after its answer's first block went out: counted as the client
    hanging up, with no cut-off. Now it is a `stopped` cut-off."""
    rig = await make_rig(bytes(4 * BLOCK))
    hold_back_after_first_chunk(rig)
    port = DataPort(rig.engine, cast(Origin, rig.origin), rig.metrics)
    async with TestServer(port.app()) as server:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"GET /bkt/k HTTP/1.1\r\nHost: h\r\n\r\n")
            head = await asyncio.wait_for(_read_head_and(reader, BLOCK), 10)
            assert head.startswith(b"HTTP/1.1 200 ")
            await rig.engine.close()  # the rest of the run is never fetched
            assert await _rest(reader) == b""
        finally:
            writer.close()
        await eventually_async(lambda: rig.metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    assert _cutoffs(rig.metrics) == {"stopped": 1}
    assert _disconnects(rig.metrics) == 0


async def test_a_block_given_up_before_the_headers_is_answered_503(make_rig: MakeRig) -> None:
    """Stopped before a byte of its answer: a 503 to retry elsewhere, not a
    "client left" (499) written to a client still waiting."""
    rig = await make_rig(bytes(4 * BLOCK))
    rig.origin.delay = 60.0  # the fetch waits on the origin until it is stopped
    port = DataPort(rig.engine, cast(Origin, rig.origin), rig.metrics)
    async with TestServer(port.app()) as server:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
            await eventually_async(lambda: bool(rig.origin.calls), "the fetch under way")
            await rig.engine.close()
            answer = await _rest(reader)
        finally:
            writer.close()
        await eventually_async(lambda: rig.metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert b"<Code>ServiceUnavailable</Code>" in answer and b"Retry-After: 1" in answer
    assert _cutoffs(rig.metrics) == {} and _disconnects(rig.metrics) == 0


class _SilentOrigin:
    """A HEAD the origin never answers."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")


async def _stopped_while_held(
    port: DataPort, held: Callable[[asyncio.StreamReader], Awaitable[bytes]],
) -> bytes:
    """A GET the sidecar holds (`held` returns what the client read by then,
    which reads nothing more), and the sidecar's listener closed under it as a
    stop closes it: past its shutdown timeout aiohttp cancels the handler.
    What the client read."""
    runner = web.AppRunner(port.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
    except BaseException:
        await runner.cleanup()
        raise
    try:
        writer.write(b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\n\r\n")
        return await asyncio.wait_for(held(reader), 10)
    finally:
        await runner.cleanup()  # the client still there, holding its answer
        writer.close()


async def _one_line(access_log: AccessLog, path: Path) -> dict[str, Any]:
    await asyncio.to_thread(access_log.close)  # the writer thread's last lines written
    lines = (await asyncio.to_thread(path.read_text)).splitlines()
    assert len(lines) == 1, lines
    line: dict[str, Any] = json.loads(lines[0])
    return line


async def test_an_answer_cancelled_as_the_sidecar_stops_is_counted_and_logged(
    tmp_path: Path,
) -> None:
    """Its 200 went out and the client holds the rest: the handler cancelled
    at the stop left no sidecar_requests_total sample and no access log line."""
    metrics = Metrics(CollectorRegistry())
    path = tmp_path / "access.jsonl"
    access_log = AccessLog(str(path))
    huge = ObjectInfo(bucket="bkt", key="seg.log", size=1 << 40, etag='"e1"',
                      last_modified=INFO.last_modified)
    port = DataPort(cast(Engine, _EndlessEngine()), cast(Origin, _Origin(huge)), metrics,
                    access_log=access_log)
    head = await _stopped_while_held(port, lambda reader: reader.readuntil(b"\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 200 ")
    await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                           "the request counted")
    assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": "200"}) == 1
    assert _cutoffs(metrics) == {"stopped": 1} and _disconnects(metrics) == 0
    line = await _one_line(access_log, path)
    assert (line["status"], line["cut_off"]) == (200, "stopped")
    assert 0 < line["bytes"] < huge.size


async def test_a_request_cancelled_before_its_answer_as_the_sidecar_stops_is_a_503(
    tmp_path: Path,
) -> None:
    metrics = Metrics(CollectorRegistry())
    path = tmp_path / "access.jsonl"
    access_log = AccessLog(str(path))
    origin = _SilentOrigin()
    port = DataPort(cast(Engine, _EndlessEngine()), cast(Origin, origin), metrics,
                    access_log=access_log)

    async def asked(reader: asyncio.StreamReader) -> bytes:
        await origin.asked.wait()
        return b""

    await _stopped_while_held(port, asked)
    await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                           "the request counted")
    assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": "503"}) == 1
    assert _cutoffs(metrics) == {} and _disconnects(metrics) == 0
    line = await _one_line(access_log, path)
    assert (line["status"], line["cut_off"], line["bytes"]) == (503, None, 0)
