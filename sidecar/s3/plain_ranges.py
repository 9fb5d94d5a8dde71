"""Plain ranged reads: the data port's connections start here, and a plain ranged
read of a cached object is answered on the connection itself, without
aiohttp's request machinery; every other request, and the rest of its
connection, goes to aiohttp's handler (sidecar.s3.dataport.DataPort.handle).

What a warm hit costs is mostly per request (and per connection, for a
client that opens one for each fetch), since a tier hit's bytes go out with
sendfile(2): aiohttp's request object, its handler task, its response and
payload writer and its keep-alive bookkeeping were a good share of that cost
(bench/ANALYSIS.md).

Which requests it takes: ``GET <path> HTTP/1.1`` whose head is plain
ASCII, each field once, with a Range and no body, no expectation, no upgrade,
no precondition and no checksum mode; let through by its signature (or the
anonymous policy) and the access policy, of an object whose HEAD the
sidecar remembers; its Range satisfiable
(``DataPort.plain_plan``). Anything else, and anything it does not parse
(folded or malformed fields, a head past ``HEAD_LIMIT``), is handed to
aiohttp with every byte received so far, as if it had come there first: the
request is answered, refused or counted exactly as before. A connection
handed over stays with aiohttp, whose answers then say ``Connection:
close`` (``DataPort.close_handled``): a client that pools its connections
(the AWS SDK under Aiven's plugin) sends its next request on a new one,
which starts here again.

The answer is the handler's own (``DataPort.body_answer`` and
``DataPort.stream``): the same headers, the same pieces, the same cut-offs,
metrics and access log line. A failure before its first byte hands the
request to aiohttp too, which answers it afresh with the S3 error it knows.

HTTP/1.1 (RFC 9112): a connection is kept alive unless the request says
``Connection: close``; pipelined requests are answered in order, the next
head parsed once the answer before it is sent. A connection idle for
``idle_timeout_s`` (client_timeout, aiohttp's keep-alive timeout here) or
trickling a head that long is closed, as aiohttp closes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus

from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict

from sidecar.engine import TierSlice
from sidecar.s3.dataport import DataPort, PlainPlan
from sidecar.s3.held_send import offer_held, send_held

log = logging.getLogger(__name__)

# A request head larger than this goes to aiohttp, which applies its own limits
# (S3 itself takes at most 8 KiB of headers).
HEAD_LIMIT = 16 * 1024
# RFC 9112 section 3: request-line; only an origin-form target of visible ASCII.
_REQUEST_LINE = re.compile(rb"GET (/[!-~]*) HTTP/1\.1")
# RFC 9110 section 5.1 and 5.5: field-name token ":" OWS field-value OWS, the
# value visible ASCII, spaces and tabs (no obs-fold, no obs-text).
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[!-~]|[ \t]+[!-~])*)[ \t]*")
# Fields whose presence makes a request the handler's: a body or its framing,
# an expectation, an upgrade, preconditions and checksums (decided there).
_HANDLER_FIELDS = frozenset({
    "transfer-encoding", "content-length", "expect", "upgrade", "te", "trailer",
    "if-match", "if-none-match", "if-modified-since", "if-unmodified-since", "if-range",
    "x-amz-checksum-mode",
})
_CONNECTION_OPTIONS = frozenset({"keep-alive", "close"})


def parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]] | None:
    """The target and fields of a request head (without its blank line) the
    path takes; None for any other (aiohttp's to parse and answer)."""
    lines = head.split(b"\r\n")
    line = _REQUEST_LINE.fullmatch(lines[0])
    if line is None:
        return None
    fields: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in lines[1:]:
        field = _FIELD.fullmatch(raw)
        if field is None:
            return None
        name = field.group(1).decode("ascii")
        lowered = name.lower()
        value = field.group(2).decode("ascii")
        if lowered in seen or lowered in _HANDLER_FIELDS or (
                # Any other option may name a field (RFC 9110 section 7.6.1),
                # which the handler checks against the signed ones.
                lowered == "connection" and value.lower() not in _CONNECTION_OPTIONS):
            return None
        seen.add(lowered)
        fields.append((name, value))
    if "range" not in seen or "host" not in seen:
        return None
    return line.group(1).decode("ascii"), fields


class _DateField:
    """The Date field's value (RFC 9110 section 6.6.1), formatted once a second
    (as aiohttp does)."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second, self._value = second, formatdate(second, usegmt=True)
        return self._value


_DATE = _DateField()


def status_line(status: int) -> str:
    return f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"


class PlainConnections:
    """The plain-range path's connections of one listener, for the stop to drain."""

    def __init__(self) -> None:
        self.open: set[PlainRanges] = set()
        self.closing = False  # a stop began: no request is started any more

    async def close(self, timeout_s: float) -> None:
        """Idle connections closed at once; answers under way given up to
        `timeout_s` to end, then cancelled (logged as stopped)."""
        self.closing = True
        for connection in list(self.open):
            connection.close_if_idle()
        answering = [connection.task for connection in self.open if connection.task is not None]
        if answering:
            _, late = await asyncio.wait(answering, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for connection in list(self.open):
            connection.close()


class PlainReply:
    """A ``Reply`` written on the connection itself."""

    def __init__(self, connection: PlainRanges, plan: PlainPlan, keep_alive: bool) -> None:
        self._connection = connection
        self._plan = plan
        self._keep_alive = keep_alive
        self.body_bytes = 0
        self._prepared = False

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._connection.transport

    @property
    def prepared(self) -> bool:
        return self._prepared

    async def prepare(self) -> None:
        answer = self._plan.answer
        lines = [status_line(answer.status),
                 *(f"{name}: {value}" for name, value in answer.headers.items()),
                 f"Content-Length: {answer.length}",
                 f"Date: {_DATE.now()}",
                 f"Server: {SERVER_SOFTWARE}"]
        if not self._keep_alive:
            lines.append("Connection: close")
        self._prepared = True
        await self.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        transport = self._connection.writable()
        transport.write(data)
        await self._connection.drained()

    async def send_held(self, held: TierSlice, sent: int) -> None:
        """The rest of ``held``, a sendfile(2) each time the socket has room.

        When it has none, the next byte is copied into the transport, with
        the transport's flow control at zero (paused while anything is
        queued): its resume says the socket took that byte and has room
        again. ``loop.sendfile`` (aiohttp's way, held_send.send_held) takes
        the socket from its transport and gives it back on every call, with
        an fstat and a seek: a good share of a tier hit's cost
        (bench/ANALYSIS.md). The byte is a copy, so nothing queued refers to
        the tier's pages once the slice is released."""
        connection = self._connection
        transport = connection.writable()
        if transport.get_extra_info("sslcontext") is not None:
            await send_held(transport, self.write, held, sent)  # never here: no TLS
            return
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            while sent < held.count:
                transport = connection.writable()
                taken = offer_held(transport, held, sent)
                if taken:
                    sent += taken
                    continue
                # Read with pread(2), not through the tier's mapping: a page
                # touched there would count in the process's RSS.
                transport.write(os.pread(held.file, 1, held.offset + sent))
                sent += 1
                await connection.drained()
        finally:
            if connection.transport is not None:
                connection.transport.set_write_buffer_limits(high=high, low=low)

    def count(self, body_bytes: int) -> None:
        self.body_bytes += body_bytes


class PlainRanges(asyncio.Protocol):
    """One data port connection while its requests are plain ranged reads."""

    def __init__(self, port: DataPort, handler: Callable[[], asyncio.Protocol],
                 connections: PlainConnections, idle_timeout_s: float) -> None:
        self._port = port
        self._handler = handler
        self._connections = connections
        self._idle_timeout_s = idle_timeout_s
        self._received = bytearray()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._connections.open.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self._received += data
        if self.task is None:
            self._next()
        elif len(self._received) > HEAD_LIMIT and self.transport is not None:
            # Pipelined heads wait for the answer under way, a bounded amount.
            self.transport.pause_reading()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        # As aiohttp does: a transport that called this may not be aborted
        # (asyncio's, closed by the client's EOF once its buffer drained,
        # has let go of its loop), so none is handed out after.
        self.transport = None
        self._connections.open.discard(self)
        self._stop_idle()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client went away"))

    # the answers

    def writable(self) -> asyncio.Transport:
        """The transport, or ConnectionResetError once the client is gone."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client went away")
        return self.transport

    async def drained(self) -> None:
        """Return once the transport is under its high-water mark again."""
        if self._paused:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    def _next(self) -> None:
        """Answer the next request received, if its head is whole."""
        end = self._received.find(b"\r\n\r\n")
        if end < 0:
            if len(self._received) > HEAD_LIMIT:
                self._hand_over()
            return
        parsed = parse_head(bytes(self._received[:end]))
        if parsed is None:
            self._hand_over()
            return
        target, fields = parsed
        headers = CIMultiDict(fields)
        plan = self._port.plain_plan(target, headers, fields)
        if plan is None:
            self._hand_over()
            return
        self._stop_idle()
        head = bytes(self._received[:end + 4])
        del self._received[:end + 4]
        keep_alive = headers.get("Connection", "").lower() != "close"
        self.task = asyncio.get_running_loop().create_task(
            self._answer(plan, head, target, headers["Range"], keep_alive))

    async def _answer(self, plan: PlainPlan, head: bytes, target: str, range_header: str,
                      keep_alive: bool) -> None:
        reply = PlainReply(self, plan, keep_alive)
        try:
            answered = await self._port.answer_plain(plan, reply, target, range_header,
                                                    lambda: reply.body_bytes)
        except Exception:
            # answer_plain answers or cuts off whatever the answer meets; a
            # failure of its own must not leave the connection open for ever.
            log.exception("the plain-range answer to %s failed", target)
            self.close()
            return
        finally:
            self.task = None
        if not answered:
            # Nothing went out: the handler answers it as if it came there first.
            self._received[:0] = head
            self._hand_over()
            return
        if not keep_alive or self._connections.closing or self.transport is None \
                or self.transport.is_closing():
            self.close()
            return
        self.transport.resume_reading()
        self._wait_idle()
        if self._received:
            self._next()

    def _hand_over(self) -> None:
        """The connection, with every byte received and not answered, to aiohttp."""
        self._stop_idle()
        self._connections.open.discard(self)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        handler = self._handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._paused:
            handler.pause_writing()
        transport.resume_reading()
        if self._received:
            received, self._received = bytes(self._received), bytearray()
            handler.data_received(received)

    # idle connections

    def _wait_idle(self) -> None:
        self._stop_idle()
        self._idle = asyncio.get_running_loop().call_later(self._idle_timeout_s,
                                                           self.close_if_idle)

    def _stop_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def close_if_idle(self) -> None:
        if self.task is None:
            self.close()

    def close(self) -> None:
        self._stop_idle()
        self._connections.open.discard(self)
        if self.transport is not None:
            self.transport.close()
