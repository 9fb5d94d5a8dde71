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
        self.handed: list[Any] = []

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return True

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None) -> AsyncGenerator[tuple[Piece, Source], None]:
        makers: list[Callable[[], Piece | None]] = [
            lambda: self.tier.slice((FIRST, 1, 0), 0, REGION),
            lambda: MIDDLE,
            lambda: self.tier.slice((SECOND, 1, 0), 100, REGION),
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


@pytest.mark.parametrize("tls", [False, True], ids=["sendfile", "tls-writes-the-mapping"])
async def test_tier_pieces_reach_the_client_whole_and_are_released(
        tier: MemoryTier, tls: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = os.urandom(REGION), os.urandom(REGION)
    assert tier.put((FIRST, 1, 0), first) and tier.put((SECOND, 1, 0), second)
    expected = first + MIDDLE + second[100:]
    engine = _TierEngine(tier)
    port = DataPort(cast(Engine, engine), cast(Origin, _Origin(len(expected))),
                    Metrics(CollectorRegistry()))
    loop = asyncio.get_running_loop()
    sent: list[tuple[int, int, bool]] = []
    native = loop.sendfile

    async def sendfile(transport: asyncio.Transport, file: Any, offset: int = 0,
                       count: int | None = None, *, fallback: bool = True) -> int:
        try:
            done = await native(transport, file, offset, count, fallback=fallback)
        except asyncio.SendfileNotAvailableError:
            sent.append((offset, count or 0, False))
            raise
        sent.append((offset, count or 0, True))
        return done

    monkeypatch.setattr(loop, "sendfile", sendfile)
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
        answer = await _get(server.port, client_tls)
    finally:
        await server.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert body == expected
    # Both slices went to sendfile; over TLS the mapping was written instead.
    assert [(offset % REGION, count, native_ok) for offset, count, native_ok in sent] == (
        [] if tls else [(0, REGION, True), (100, REGION - 100, True)])
    # Released: a purge frees every page at once (a pinned region would wait).
    tier.forget_object("bkt", "seg.log")
    assert tier.resident_bytes() == 0 and tier.used_bytes() == 0
