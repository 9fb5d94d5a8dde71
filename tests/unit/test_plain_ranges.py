"""The data port's plain-range path: which request heads it takes, and that a
request it answers gets the answer, the metrics and the cut-offs the handler
would give it, while everything else (and a failure before the first byte)
reaches the handler as if the path were not there.

The port is served as the sidecar serves it (the path in front of aiohttp's
own server, over loopback), read over raw sockets; the engine is scripted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import cast

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.engine import Engine, Piece, Source
from sidecar.errors import FetchStopped, OriginUnavailable
from sidecar.model import ObjectInfo
from sidecar.origin.client import Origin
from sidecar.s3.dataport import DataPort
from sidecar.s3.plain_ranges import PlainConnections, PlainRanges, parse_head
from sidecar.telemetry.metrics import Metrics
from tests.support.waiting import eventually_async
from tests.unit.test_data_port_tier import _Origin as _DataPortTierOrigin
from tests.unit.test_data_port_tier import large_slices

DATA = bytes(range(256)) * 64  # 16 KiB
INFO = ObjectInfo(bucket="bkt", key="seg.log", size=len(DATA), etag='"e1"',
                  last_modified=datetime(2026, 11, 1, tzinfo=UTC))
PIECE = 1000


class _Origin:
    """The HEAD memo's answer: remembered, unless told otherwise."""

    def __init__(self, remembered: bool = True) -> None:
        self.remembered = remembered

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return INFO

    def remembered_head(self, bucket: str, key: str) -> ObjectInfo | None:
        return INFO if self.remembered else None


class _Engine:
    """Serves DATA in pieces of PIECE bytes; fails with `failure` after
    `before` bytes if told; `endless` pieces (a reader that stops reading)."""

    def __init__(self, failure: BaseException | None = None, before: int = 0,
                 endless: bool = False, piece: int = PIECE) -> None:
        self.failure = failure
        self.before = before
        self.endless = endless
        self.piece = piece

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return True

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None) -> AsyncGenerator[tuple[Piece, Source], None]:
        at = start
        while at <= end or self.endless:
            if self.failure is not None and at - start >= self.before:
                raise self.failure
            piece = (DATA * (1 + self.piece // len(DATA)))[:self.piece] if self.endless \
                else DATA[at:end + 1][:self.piece]
            yield piece, Source.CACHE
            at += len(piece)
            await asyncio.sleep(0)


@asynccontextmanager
async def _served(port: DataPort, plain: bool = True,
                  idle_timeout_s: float = 30.0) -> AsyncIterator[tuple[int, PlainConnections]]:
    """The data port as the sidecar serves it: with the plain-range path in
    front of aiohttp's server, or aiohttp's alone (`plain` False)."""
    port.close_handled = plain  # as the sidecar sets it
    runner = web.AppRunner(port.app())
    await runner.setup()
    handler = runner.server
    assert handler is not None
    connections = PlainConnections()
    loop = asyncio.get_running_loop()
    if plain:
        listener = await loop.create_server(
            lambda: PlainRanges(port, handler, connections, idle_timeout_s), "127.0.0.1", 0)
    else:
        listener = await loop.create_server(handler, "127.0.0.1", 0)
    try:
        yield listener.sockets[0].getsockname()[1], connections
    finally:
        listener.close()
        await connections.close(1.0)
        await runner.cleanup()


def _port(engine: _Engine | None = None, origin: _Origin | None = None,
          metrics: Metrics | None = None) -> DataPort:
    return DataPort(cast(Engine, engine or _Engine()), cast(Origin, origin or _Origin()),
                    metrics or Metrics(CollectorRegistry()))


async def _exchange(port: int, request: bytes, timeout_s: float = 5.0) -> bytes:
    """Send `request`, read until the server closes (or resets) the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()
    try:
        writer.write(request)
        await writer.drain()
        while chunk := await asyncio.wait_for(reader.read(65536), timeout_s):
            received += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return bytes(received)


def _answers(received: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """The responses in `received`, each its status line, headers and body."""
    answers = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        answers.append((lines[0], headers, rest[:length]))
        received = rest[length:]
    return answers


def _get(range_value: str = "bytes=100-1999", *extra: str, close: bool = False) -> bytes:
    fields = ["Host: h", f"Range: {range_value}", *extra]
    if close:
        fields.append("Connection: close")
    return ("GET /bkt/seg.log HTTP/1.1\r\n" + "".join(f"{f}\r\n" for f in fields)
            + "\r\n").encode("latin-1")


def _plain(metrics: Metrics) -> float:
    return metrics.value("sidecar_plain_range_requests_total")


# --- which heads it takes ------------------------------------------------------------------

def test_a_plain_ranged_get_is_taken() -> None:
    parsed = parse_head(b"GET /bkt/a%20b?x-id=GetObject HTTP/1.1\r\nHost: h\r\n"
                        b"Range: bytes=0-\r\nx-amz-date:  20261130T000000Z \t")
    assert parsed == ("/bkt/a%20b?x-id=GetObject",
                      [("Host", "h"), ("Range", "bytes=0-"), ("x-amz-date", "20261130T000000Z")])


@pytest.mark.parametrize("head", [
    b"GET /bkt/k HTTP/1.1\r\nHost: h",  # no Range: the handler's (a 200)
    b"GET /bkt/k HTTP/1.1\r\nRange: bytes=0-9",  # no Host
    b"HEAD /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9",
    b"GET /bkt/k HTTP/1.0\r\nHost: h\r\nRange: bytes=0-9",
    b"GET http://h/bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nRange: bytes=5-9",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nrange: bytes=0-9\r\nRANGE: bytes=5-9",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n folded",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange : bytes=0-9",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nX-Meta: caf\xc3\xa9",
    b"GET /bkt/k\xff HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nX-Bad: a\x00b",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nContent-Length: 0",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nTransfer-Encoding: chunked",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nExpect: 100-continue",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nUpgrade: h2c",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nIf-Match: \"e1\"",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nIf-Range: \"e1\"",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nx-amz-checksum-mode: ENABLED",
    b"GET /bkt/k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nConnection: x-amz-date",
])
def test_any_other_head_is_the_handlers(head: bytes) -> None:
    assert parse_head(head) is None


# --- answers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("range_value", ["bytes=100-1999", "bytes=15000-", "bytes=-300",
                                         "bytes=0-0", "bytes=16000-99999"])
async def test_a_plain_answer_is_the_handlers_answer(range_value: str) -> None:
    answers = {}
    for plain in (False, True):
        metrics = Metrics(CollectorRegistry())
        async with _served(_port(metrics=metrics), plain=plain) as (port, _):
            answers[plain] = _answers(await _exchange(port, _get(range_value, close=True)))
        assert _plain(metrics) == (1 if plain else 0)
        assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": "206"}) == 1
    [(status, headers, body)] = answers[True]
    [(status_h, headers_h, body_h)] = answers[False]
    assert (status, body) == (status_h, body_h)
    assert status == "HTTP/1.1 206 Partial Content"
    first = int(headers["content-range"].split()[1].split("-")[0])
    assert body == DATA[first:first + len(body)] and len(body) == int(headers["content-length"])
    different = {"date", "x-amz-request-id", "x-amz-id-2"}
    assert {k: v for k, v in headers.items() if k not in different} == \
        {k: v for k, v in headers_h.items() if k not in different}
    assert different <= set(headers)


async def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    metrics = Metrics(CollectorRegistry())
    async with _served(_port(metrics=metrics)) as (port, _):
        received = await _exchange(port, _get("bytes=0-99") + _get("bytes=200-5199")
                                   + _get("bytes=16300-", close=True))
    bodies = [body for _, _, body in _answers(received)]
    assert bodies == [DATA[0:100], DATA[200:5200], DATA[16300:]]
    assert _plain(metrics) == 3


async def test_a_request_it_does_not_take_hands_the_connection_to_the_handler() -> None:
    """A plain read, then one without a Range (a 200): the second is the
    handler's, on the same connection, answered with Connection: close (a
    pooled client's next request then starts on the plain-range path again),
    and nothing pipelined after it is answered there."""
    metrics = Metrics(CollectorRegistry())
    whole = b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\n\r\n"
    async with _served(_port(metrics=metrics)) as (port, _):
        received = await _exchange(port, _get("bytes=0-99") + whole + _get("bytes=5-9"))
        again = await _exchange(port, _get("bytes=5-9", close=True))
    answers = _answers(received)
    assert [status for status, _, _ in answers] == [
        "HTTP/1.1 206 Partial Content", "HTTP/1.1 200 OK"]
    assert [body for _, _, body in answers] == [DATA[:100], DATA]
    assert "connection" not in answers[0][1] and answers[1][1]["connection"] == "close"
    assert [body for _, _, body in _answers(again)] == [DATA[5:10]]
    assert _plain(metrics) == 2
    assert metrics.total("sidecar_requests_total") == 3


async def test_an_object_whose_head_is_not_remembered_is_the_handlers() -> None:
    metrics = Metrics(CollectorRegistry())
    async with _served(_port(origin=_Origin(remembered=False), metrics=metrics)) as (port, _):
        [(status, _, body)] = _answers(await _exchange(port, _get(close=True)))
    assert status == "HTTP/1.1 206 Partial Content" and body == DATA[100:2000]
    assert _plain(metrics) == 0


@pytest.mark.parametrize(("failure", "status"), [
    (OriginUnavailable("the origin went away"), "503"),
    (FetchStopped("the fetch was stopped"), "503"),
    (RuntimeError("the cache disk failed"), "500"),
])
async def test_a_failure_before_the_first_byte_is_answered_by_the_handler_once(
        failure: BaseException, status: str) -> None:
    metrics = Metrics(CollectorRegistry())
    async with _served(_port(_Engine(failure), metrics=metrics)) as (port, _):
        received = await _exchange(port, _get(close=True))
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    [(line, _, body)] = _answers(received)
    assert line.startswith(f"HTTP/1.1 {status} ") and b"<Error><Code>" in body
    assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": status}) == 1
    assert _plain(metrics) == 0


async def test_a_failure_after_the_headers_cuts_the_connection_and_says_why() -> None:
    metrics = Metrics(CollectorRegistry())
    engine = _Engine(OriginUnavailable("the origin went away"), before=PIECE)
    async with _served(_port(engine, metrics=metrics)) as (port, _):
        # A second request behind it must never be read as the rest of the body.
        received = await _exchange(port, _get() + _get())
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 206 ") and b"Content-Length: 1900" in head
    assert body == DATA[100:100 + PIECE]
    assert metrics.value("sidecar_client_cutoffs_total", {"reason": "origin"}) == 1
    assert _plain(metrics) == 1


async def test_a_client_that_hangs_up_mid_body_is_a_disconnect() -> None:
    metrics = Metrics(CollectorRegistry())
    async with _served(_port(_Engine(endless=True), metrics=metrics)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get("bytes=0-"))
        await reader.readexactly(64 * 1024)
        writer.transport.abort()
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    assert metrics.value("sidecar_client_disconnects_total") == 1
    assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": "206"}) == 1


async def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    async with _served(_port(), idle_timeout_s=0.2) as (port, connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get("bytes=0-9"))
        [(_, _, body)] = _answers(await asyncio.wait_for(reader.read(), 10))
        writer.close()
    assert body == DATA[:10]
    assert not connections.open


async def test_a_stop_cancels_an_answer_its_reader_does_not_take_and_counts_it() -> None:
    metrics = Metrics(CollectorRegistry())
    async with _served(_port(_Engine(endless=True), metrics=metrics)) as (port, connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get("bytes=0-"))
        await reader.readexactly(1024)  # the answer is under way; nothing more is read
        await eventually_async(lambda: any(c.task for c in connections.open),
                               "the answer under way")
        await connections.close(0.1)
        writer.close()
    assert metrics.value("sidecar_client_cutoffs_total", {"reason": "stopped"}) == 1
    assert metrics.value("sidecar_requests_total", {"op": "GetObject", "code": "206"}) == 1


async def test_a_client_that_half_closes_after_its_request_is_let_go_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """The client's EOF mid-answer closes the connection (as aiohttp's handler
    does): once what was queued drained, the answer under way finds it gone,
    and a transport that is gone is not aborted (asyncio's has let go of its
    loop by then)."""
    metrics = Metrics(CollectorRegistry())
    engine = _Engine(endless=True, piece=1024 * 1024)
    async with _served(_port(engine, metrics=metrics)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get("bytes=0-"))
        await reader.readexactly(256 * 1024)  # the answer is under way, bytes queued
        writer.write_eof()
        while await reader.read(65536):
            pass  # everything queued, until the sidecar closes
        writer.close()
        await eventually_async(lambda: metrics.total("sidecar_requests_total") == 1,
                               "the request counted")
    assert metrics.value("sidecar_client_disconnects_total") == 1
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


class _TierOrigin(_DataPortTierOrigin):
    def remembered_head(self, bucket: str, key: str) -> ObjectInfo | None:
        return self.info


async def test_tier_pieces_go_out_with_sendfile_from_where_the_socket_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices larger than the socket takes at once, to a client that reads
    slowly: each sendfile(2) starts after what went before it (a sendfile,
    or the one byte copied into the transport while the socket was full),
    every byte arrives once and in order, and the slices are released."""
    with large_slices(monkeypatch) as (engine, spy, expected):
        metrics = Metrics(CollectorRegistry())
        port = DataPort(cast(Engine, engine), cast(Origin, _TierOrigin(len(expected))), metrics)
        async with _served(port) as (number, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", number, limit=65536)
            writer.write(_get("bytes=0-", close=True))
            received = bytearray()
            while chunk := await asyncio.wait_for(reader.read(65536), 5):
                received += chunk
                await asyncio.sleep(0.001)  # slower than the socket fills
            writer.close()
        assert _plain(metrics) == 1
        assert received.partition(b"\r\n\r\n")[2] == expected
        for held in (engine.handed[0], engine.handed[2]):
            calls = spy.of(held)
            assert len(calls) > 1 and calls[0] == (held.offset, held.count, calls[0][2])
            ends = [offset + done for offset, _, done in calls]
            # Each call asks for the rest, from the end of the one before it or
            # the byte after it (the byte the transport took).
            for (offset, count, _), end in zip(calls[1:], ends, strict=False):
                assert offset in (end, end + 1) and offset + count == held.offset + held.count
            copied = sum(offset - end for (offset, _, _), end in zip(calls[1:], ends,
                                                                    strict=False))
            assert copied > 0 and spy.sent(held) + copied == held.count
        engine.tier.release(engine.tier.forget_object("bkt", "seg.log"))
        assert engine.tier.resident_bytes() == 0 and engine.tier.used_bytes() == 0

