"""Pieces of the memory tier through the data port: sent with sendfile from the
memfd, or, where the transport cannot send a file (TLS), written from the
mapping; released either way. The engine is scripted over a real tier; the port
is aiohttp's own test server, read over a raw socket."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import ssl
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from sidecar.cache.ident import BlockIdent
from sidecar.cache.memory_tier import MemoryTier
from sidecar.engine import Engine, Piece, Source
from sidecar.model import ObjectInfo
from sidecar.origin.client import Origin
from sidecar.s3.dataport import DataPort
from sidecar.telemetry.metrics import Metrics
from tests.support.certificates import self_signed

REGION = 64 * 1024
FIRST, SECOND = (BlockIdent("bkt", "seg.log", '"e1"', block) for block in (0, 1))
MIDDLE = b"between the slices"


@pytest.fixture()
def tier() -> Iterator[MemoryTier]:
    held = MemoryTier(2 * REGION, REGION)
    yield held
    held.close()


class _TierEngine:
    """Yields a whole tier chunk, bytes of its own, then the tail of another chunk."""

    def __init__(self, tier: MemoryTier) -> None:
        self.tier = tier
        self.region = REGION
        self.handed: list[Any] = []

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return True

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None) -> AsyncGenerator[tuple[Piece, Source], None]:
        makers: list[Callable[[], Piece | None]] = [
            lambda: self.tier.slice((FIRST, 1, 0), 0, self.region),
            lambda: MIDDLE,
            lambda: self.tier.slice((SECOND, 1, 0), 100, self.region),
        ]
        for make in makers:
            piece = make()
            assert piece is not None
            self.handed.append(piece)
            yield piece, Source.CACHE


class _Origin:
    def __init__(self, size: int) -> None:
        self.info = ObjectInfo(bucket="bkt", key="seg.log", size=size, etag='"e1"',
                               last_modified=dt.datetime(2026, 11, 1, tzinfo=dt.UTC))

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return self.info




async def _get(port: int, tls: ssl.SSLContext | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        writer.write(b"GET /bkt/seg.log HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        await writer.drain()
        received = bytearray()
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            received += chunk
        return bytes(received)
    finally:
        writer.close()


class _SendfileSpy:
    """Every sendfile(2) of the tier's memfd: (offset in the memfd, bytes
    asked, bytes sent). Both ways of the port call it: at once, and through
    loop.sendfile for what the socket did not take."""

    def __init__(self, tier: MemoryTier, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int, int]] = []
        native = os.sendfile

        def sendfile(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
            done = native(out_fd, in_fd, offset, count)
            if in_fd == tier.fd and offset is not None:
                self.calls.append((offset, count, done))
            return done

        monkeypatch.setattr(os, "sendfile", sendfile)

    def of(self, held: Any) -> list[tuple[int, int, int]]:
        """The calls that sent bytes of ``held`` (a TierSlice)."""
        return [call for call in self.calls if held.offset <= call[0] < held.offset + held.count]

    def sent(self, held: Any) -> int:
        return sum(done for _, _, done in self.of(held))


@contextmanager
def large_slices(monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[tuple[_TierEngine, _SendfileSpy, bytes]]:
    """Two tier chunks of 4 MiB, more than a socket takes at once: the engine
    that yields them (bytes of its own between them), a spy on their
    sendfile(2) calls, and the body a client should get."""
    region = 4 * 1024 * 1024
    tier = MemoryTier(2 * region, region)
    try:
        first, second = os.urandom(region), os.urandom(region)
        assert tier.put((FIRST, 1, 0), first) and tier.put((SECOND, 1, 0), second)
        engine = _TierEngine(tier)
        engine.region = region
        yield engine, _SendfileSpy(tier, monkeypatch), first + MIDDLE + second[100:]
    finally:
        tier.close()


async def _serve(tier: MemoryTier, expected_size: int, tmp_path: Path, tls: bool,
                 engine: _TierEngine) -> bytes:
    port = DataPort(cast(Engine, engine), cast(Origin, _Origin(expected_size)),
                    Metrics(CollectorRegistry()))
    server = TestServer(port.app())
    client_tls = None
    if tls:
        cert, key = self_signed(tmp_path)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        client_tls = ssl.create_default_context(cafile=str(cert))
        await server.start_server(ssl=server_tls)
    else:
        await server.start_server()
    try:
        assert server.port is not None
        return await _get(server.port, client_tls)
    finally:
        await server.close()


@pytest.mark.parametrize("tls", [False, True], ids=["sendfile", "tls-writes-the-mapping"])
async def test_tier_pieces_reach_the_client_whole_and_are_released(
        tier: MemoryTier, tls: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = os.urandom(REGION), os.urandom(REGION)
    assert tier.put((FIRST, 1, 0), first) and tier.put((SECOND, 1, 0), second)
    expected = first + MIDDLE + second[100:]
    spy = _SendfileSpy(tier, monkeypatch)
    engine = _TierEngine(tier)
    answer = await _serve(tier, len(expected), tmp_path, tls, engine)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert body == expected
    # Both slices went out with sendfile(2), whole; over TLS the mapping was
    # written instead.
    first, _, second = engine.handed
    assert (spy.sent(first), spy.sent(second)) == ((0, 0) if tls else (REGION, REGION - 100))
    # Released: a purge frees every page at once (a pinned region would wait).
    tier.release(tier.forget_object("bkt", "seg.log"))
    assert tier.resident_bytes() == 0 and tier.used_bytes() == 0


async def test_what_the_socket_does_not_take_at_once_follows_from_where_it_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices larger than the socket takes at once (the port bounds a whole
    object's send buffer): the first sendfile(2) sends part, loop.sendfile the
    rest from that byte on, and the client gets every byte once, in order."""
    with large_slices(monkeypatch) as (engine, spy, expected):
        answer = await _serve(engine.tier, len(expected), tmp_path, False, engine)
        assert answer.partition(b"\r\n\r\n")[2] == expected
        for held in (engine.handed[0], engine.handed[2]):
            calls = spy.of(held)
            assert len(calls) > 1 and calls[0][2] < held.count, calls
            # Each call starts where the one before it stopped, and asks for the rest.
            assert [(offset, count) for offset, count, _ in calls] == [
                (held.offset + done, held.count - done)
                for done in (sum(call[2] for call in calls[:n]) for n in range(len(calls)))]
            assert spy.sent(held) == held.count

