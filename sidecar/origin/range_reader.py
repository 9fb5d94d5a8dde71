"""Ranged GETs of the origin, read by worker threads straight into a sink.

Why threads, and not the event loop: a cold block's 8 MiB would otherwise reach
Python as aiohttp's chunks, each a fresh bytes object joined, copied into a
block buffer and handed between the loop and the disk executor piece by piece.
Here one worker thread sends the GET, reads the body with `recv_into` into a
chunk buffer it reuses for every request (MSG_WAITALL on plain TCP: one system
call per chunk, the GIL released while the kernel fills it) and hands each full
chunk to the sink in the same thread; the caller's sink hashes it and writes it
to the cache (xxhash and pwrite release the GIL too). The event loop only hears
that a chunk landed.

One call is one attempt: `RangeReader.read` sends `GET` with `Range` and
`If-Match` (RFC 9110 sections 14.2 and 13.1.1) over HTTP/1.1 (RFC 9112) to a
URL the caller presigned, checks the answer before any byte is used (status,
ETag, Content-Range and Content-Length must be those of the range asked, see
sidecar.origin.policy.range_answer_problem), and advances `Progress.position`
after each chunk the sink took. Retries, the deadline, the breaker and lane
budgets are the caller's (sidecar.origin.client), which resumes at
`Progress.position` (a chunk boundary) after a failure.

Chunks are aligned to `chunk_size` in object offsets: the cache's checksum
chunks, so a chunk is hashed while it is in hand and never read back for it.
A request on a kept-alive connection that the origin had already closed fails
before the first byte of the answer; that request is sent once more on a new
connection without counting as a failure (as HTTP clients' pools do).
"""

from __future__ import annotations

import errno
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sidecar.aligned import page_aligned_buffer
from sidecar.errors import OriginBadBody, OriginObjectChanged
from sidecar.origin.http1 import (
    MAX_HEAD_BYTES,
    MalformedAnswer,
    ResponseHead,
    head_end,
    parse_head,
    request_head,
    s3_error_code,
)
from sidecar.origin.policy import range_answer_problem

# Bytes of an error answer's body kept for its S3 code; the rest is not read.
_MAX_ERROR_BODY = 64 * 1024
_USER_AGENT = "kafka-cold-sidecar"
# The connection dropped before the answer began: a stale kept-alive socket.
_STALE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)

Sink = Callable[[int, memoryview], None]
"""Takes one chunk: (object offset of its first byte, its bytes). Called in the
worker thread; the view is valid only during the call."""


class OriginAnswered(Exception):
    """The origin answered with an error status; `code` is S3's error code, if any."""

    def __init__(self, status: int, code: str, head: ResponseHead) -> None:
        super().__init__(f"{status} {code}".strip())
        self.status = status
        self.code = code
        self.head = head


class SinkFailed(Exception):
    """The sink refused a chunk (the cache disk failed): not the origin's fault."""


@dataclass
class Progress:
    """How far a read got, across its attempts.

    `position`: the first byte no sink has taken yet (a chunk boundary);
    `partial`: the bytes of the chunk from there that did arrive before an
    attempt broke off, kept so the next attempt resumes at the exact byte;
    `received`: body bytes received so far, by every attempt.

    `stop()` is the read's caller giving up on it (its fetch was cancelled):
    the thread stops before its next chunk, rather than reading the rest of
    the range into a sink whose cache slots may be handed on.
    """

    position: int
    partial: bytes = b""
    received: int = 0
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopped: bool = False
    _sinking: bool = False

    def stop(self) -> bool:
        """No chunk goes to the sink from now on; whether one is being handed
        to it at this moment (its caller must then wait for the thread to
        leave before giving the sink's cache slots back). Held only for a
        flag's change by either side, so the event loop may take the guard."""
        with self._guard:
            self._stopped = True
            return self._sinking

    def check(self) -> None:
        if self._stopped:
            raise ConnectionAbortedError("the fetch was stopped")

    def enter_sink(self) -> None:
        with self._guard:
            self.check()
            self._sinking = True

    def left_sink(self) -> None:
        with self._guard:
            self._sinking = False


@dataclass(frozen=True)
class Target:
    """Where a presigned URL points."""

    tls: bool
    host: str
    port: int
    netloc: str
    path: str  # path and query, as signed

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url[:80]!r}")
        tls = parts.scheme == "https"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(tls, parts.hostname, parts.port or (443 if tls else 80), parts.netloc, path)


class RangeReader:
    """Blocking ranged GETs over a small pool of kept-alive connections.

    Thread safe: any number of threads may call `read` at once; each uses one
    connection at a time. `close` makes every read in progress fail promptly
    (its socket is shut down) and later ones fail at once.
    """

    def __init__(
        self, *, connect_timeout_s: float, stall_timeout_s: float, max_chunk_size: int,
        max_idle: int = 64, tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout_s
        self._stall = stall_timeout_s
        self._max_chunk = max_chunk_size
        self._max_idle = max_idle
        self._tls = tls_context
        self._lock = threading.Lock()
        self._idle: dict[tuple[bool, str, int], list[socket.socket]] = {}
        self._active: set[socket.socket] = set()
        self._closed = False
        self._buffers = threading.local()

    def read(
        self, url: str, end: int, etag: str, size: int, sink: Sink, progress: Progress,
        chunk_size: int, pace: Callable[[int], None] = lambda amount: None,
    ) -> None:
        """Bytes [progress.position, end) of the object at `url` (of `size`
        bytes, version `etag`) to `sink` in chunks of `chunk_size` (at most
        `max_chunk_size`) aligned in object offsets. Blocking.

        `pace(n)` is called before each chunk of n bytes is read (it may sleep:
        a bandwidth lane's budget)."""
        if not 0 < chunk_size <= self._max_chunk:
            raise ValueError(f"chunks of {chunk_size} bytes; at most {self._max_chunk}")
        target = Target.of(url)
        start = progress.position + len(progress.partial)
        fields = [("Range", f"bytes={start}-{end - 1}"), ("If-Match", etag),
                  ("User-Agent", _USER_AGENT)]
        request = request_head(target.path, target.netloc, fields)
        for reused in (True, False):
            connection, was_idle = self._connection(target, reuse=reused)
            keep = False
            try:
                try:
                    connection.sendall(request)
                    head, rest = self._head(connection)
                except _STALE:
                    if was_idle:
                        continue  # the origin had closed it meanwhile: once more, afresh
                    raise
                keep = self._body(connection, head, rest, start, end, etag, size, sink,
                                  progress, chunk_size, pace)
                return
            finally:
                self._release(target, connection, keep)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = [*self._active, *(s for idle in self._idle.values() for s in idle)]
            self._idle.clear()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
            except OSError:
                pass

    # --- connections -------------------------------------------------------------

    def _connection(self, target: Target, reuse: bool) -> tuple[socket.socket, bool]:
        key = (target.tls, target.host, target.port)
        with self._lock:
            if self._closed:
                raise ConnectionAbortedError("the origin reader is closed")
            idle = self._idle.get(key)
            if reuse and idle:
                sock = idle.pop()
                self._active.add(sock)
                return sock, True
        sock = socket.create_connection((target.host, target.port), self._connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Blocking from here on, with the stall limit in the kernel: a recv
            # that gets no byte for that long fails with EAGAIN.
            sock.settimeout(None)
            stall = _timeval(self._stall)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, stall)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, stall)
            if target.tls:
                context = self._tls or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=target.host)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            if self._closed:
                sock.close()
                raise ConnectionAbortedError("the origin reader is closed")
            self._active.add(sock)
        return sock, False

    def _release(self, target: Target, sock: socket.socket, keep: bool) -> None:
        with self._lock:
            self._active.discard(sock)
            idle = self._idle.setdefault((target.tls, target.host, target.port), [])
            if keep and not self._closed and len(idle) < self._max_idle:
                idle.append(sock)
                return
        sock.close()

    # --- one answer --------------------------------------------------------------

    def _head(self, sock: socket.socket) -> tuple[ResponseHead, bytearray]:
        """The response head, and the body bytes that came with it."""
        buffer = bytearray()
        while True:
            data = _recv(sock, 16 * 1024)
            if not data:
                if not buffer:
                    raise ConnectionResetError("the origin closed the connection")
                raise OriginBadBody("the origin's answer ended inside its head")
            buffer += data
            end = head_end(buffer)
            if end >= 0:
                try:
                    return parse_head(buffer[:end]), buffer[end:]
                except MalformedAnswer as exc:
                    raise OriginBadBody(f"malformed answer: {exc}") from None
            if len(buffer) > MAX_HEAD_BYTES:
                raise OriginBadBody("the origin's answer head is too long")

    def _body(
        self, sock: socket.socket, head: ResponseHead, rest: bytearray, start: int, end: int,
        etag: str, size: int, sink: Sink, progress: Progress, chunk_size: int,
        pace: Callable[[int], None],
    ) -> bool:
        """Read the body into the sink; whether the connection may be reused."""
        if head.status not in (200, 206):
            raise OriginAnswered(head.status, s3_error_code(self._error_body(sock, head, rest)),
                                 head)
        answered_etag = head.get("etag")
        if answered_etag is not None and answered_etag != etag:
            # An origin that ignores If-Match (RFC 9110 section 13.1.1 makes it
            # a MUST, not every S3 clone does it) sends the new version.
            raise OriginObjectChanged(f"ETag {answered_etag} where {etag} was expected")
        try:
            length = head.content_length
        except MalformedAnswer as exc:
            raise OriginBadBody(str(exc)) from None
        if head.chunked:
            raise OriginBadBody("a chunked body for a ranged GET")
        problem = range_answer_problem(head.get("content-range"), length, start, end, size)
        if problem is not None:
            raise OriginBadBody(problem)
        if len(rest) > end - start:
            raise OriginBadBody(f"body longer than the {end - start} bytes asked")
        progress.received += len(rest)
        pending = memoryview(rest)  # body bytes that came with the head
        view = self._buffer()
        plain_tcp = not isinstance(sock, ssl.SSLSocket)
        position = progress.position
        while position < end:
            # Chunks end on multiples of chunk_size in object offsets.
            want = min(end, (position // chunk_size + 1) * chunk_size) - position
            filled = len(progress.partial)
            view[:filled] = progress.partial
            progress.check()
            pace(want - filled)
            taken = min(len(pending), want - filled)
            view[filled:filled + taken] = pending[:taken]
            pending = pending[taken:]
            filled += taken
            try:
                while filled < want:
                    got = _recv_into(sock, view[filled:want], plain_tcp)
                    if got == 0:
                        raise OriginBadBody(f"body ended {end - position - filled} bytes short")
                    filled += got
                    progress.received += got
            except BaseException:
                progress.partial = bytes(view[:filled])  # the next attempt goes on from here
                raise
            # Close-delimited (RFC 9112 section 6.3): the body must end here,
            # before its last chunk is handed on; an answer that runs long is
            # not trusted for any byte of that chunk.
            if position + want == end and length is None and _recv(sock, 1):
                raise OriginBadBody(f"body longer than the {end - start} bytes asked")
            progress.enter_sink()
            try:
                sink(position, view[:want])
            except Exception as exc:
                raise SinkFailed(str(exc)) from exc
            finally:
                progress.left_sink()
            position += want
            progress.position = position
            progress.partial = b""
        return length is not None and head.keeps_alive

    def _error_body(self, sock: socket.socket, head: ResponseHead, rest: bytearray) -> bytes:
        """What an error answer says, bounded; the connection is not reused after it."""
        try:
            length = head.content_length
        except MalformedAnswer:
            length = None
        body = bytearray(rest)
        limit = min(length if length is not None else _MAX_ERROR_BODY, _MAX_ERROR_BODY)
        try:
            while len(body) < limit:
                data = _recv(sock, limit - len(body))
                if not data:
                    break
                body += data
        except OSError:
            pass  # the status says enough
        return bytes(body)

    def _buffer(self) -> memoryview:
        """This thread's chunk buffer, made once and reused for every request.
        It starts on a page boundary, so the sink may write whole pages of it
        past the page cache (O_DIRECT, see sidecar.cache.slab)."""
        view: memoryview | None = getattr(self._buffers, "view", None)
        if view is None:
            view = page_aligned_buffer(self._max_chunk)
            self._buffers.view = view
        return view


def _timeval(seconds: float) -> bytes:
    """A struct timeval (socket(7) SO_RCVTIMEO): seconds and microseconds, C longs."""
    whole = int(seconds)
    return struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))


def _recv(sock: socket.socket, size: int) -> bytes:
    try:
        return sock.recv(size)
    except BlockingIOError as exc:  # SO_RCVTIMEO passed without a byte
        raise TimeoutError("no byte from the origin within the stall limit") from exc


def _recv_into(sock: socket.socket, view: memoryview, plain_tcp: bool) -> int:
    try:
        if plain_tcp:
            # The kernel fills the whole view, or returns early at the stall limit.
            return sock.recv_into(view, len(view), socket.MSG_WAITALL)
        return sock.recv_into(view, len(view))  # TLS records come one at a time
    except BlockingIOError as exc:
        raise TimeoutError("no byte from the origin within the stall limit") from exc
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            raise TimeoutError("no byte from the origin within the stall limit") from exc
        raise
