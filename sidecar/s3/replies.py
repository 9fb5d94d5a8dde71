"""Where the answer to a cached object read goes: the data port streams the
range's pieces (sidecar.s3.dataport) into a ``Reply``, which either aiohttp's
response carries (``AiohttpReply``) or the plain-range path writes on its
connection itself (sidecar.s3.plain_ranges).

One stream loop serves both, so a piece of the memory tier, a cut-off client
and a stalled one are handled, counted and logged the same way whichever way
the request came in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from sidecar.engine import TierSlice
from sidecar.s3.held_send import send_held
from sidecar.telemetry.access_log import BODY_BYTES


class Reply(Protocol):
    """A response's status and headers, then its body, on one connection."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport (None once aiohttp let it go)."""

    @property
    def prepared(self) -> bool:
        """Whether the status line and headers went out."""

    async def prepare(self) -> None:
        """Send the status line and headers."""

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data`, waiting while the transport holds more than its limit."""

    async def send_held(self, held: TierSlice, sent: int) -> None:
        """Send ``held`` from its byte ``sent`` on (what ``offer_held`` sent)."""

    def count(self, body_bytes: int) -> None:
        """Body bytes handed to the transport (the access log's body_bytes)."""


class AiohttpReply:
    """A ``Reply`` carried by aiohttp's StreamResponse for ``request``."""

    def __init__(self, request: web.Request, status: int, headers: Mapping[str, str],
                 content_length: int) -> None:
        self._request = request
        self.response = web.StreamResponse(status=status, headers=headers)
        self.response.content_length = content_length

    @property
    def transport(self) -> asyncio.Transport | None:
        transport = self._request.transport
        assert transport is None or isinstance(transport, asyncio.Transport)
        return transport

    @property
    def prepared(self) -> bool:
        return self.response.prepared

    async def prepare(self) -> None:
        await self.response.prepare(self._request)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self.response.write(data)

    async def send_held(self, held: TierSlice, sent: int) -> None:
        await send_held(self.transport, self.response.write, held, sent)

    def count(self, body_bytes: int) -> None:
        self._request[BODY_BYTES] = self._request.get(BODY_BYTES, 0) + body_bytes
