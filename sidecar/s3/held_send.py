"""A piece of the memory tier sent with sendfile(2), and a client's hang-up
told apart from a transport that cannot send a file.

The tier's bytes were verified when they entered it (sidecar.cache.memory_tier):
the kernel hands its pages to the socket, with no copy through Python and no
second hash.

The piece is first offered to the socket with one sendfile(2) made at once,
when nothing of the transport's own is queued ahead of it: what the socket
takes needs no more. ``loop.sendfile`` sends only what is left. Each call of
it takes the socket from its transport and gives it back (two epoll changes),
waits for the socket to be writable (two more, and a turn of the loop) even
when the first sendfile(2) sent everything, and seeks the file; with a
1 MiB range taking one or two calls, that was a good share of a tier hit's
cost (bench/ANALYSIS.md).

Two things asyncio (Python 3.11) reports in a way that would make
a hang-up look like something else, translated here at the boundary:

- ``loop.sendfile`` raises ``RuntimeError("Transport is closing")`` when the
  hang-up was seen since the last piece, and ``SendfileNotAvailableError``
  when the first sendfile(2) of a call fails, which is how a reset before
  this piece shows; both become ``ConnectionResetError``, what the data port
  counts as a client that went away.
- A transport that failed to write while ``loop.sendfile`` waited for its
  buffer to empty resolves that wait twice (``_SelectorSocketTransport``'s
  write error sets the waiter's exception, then ``_call_connection_lost``
  sets it again): the loop logs an ``InvalidStateError`` for a connection that
  was already let go properly. ``quiet_sendfile_hangups`` keeps that one case
  out of the error log.
"""

from __future__ import annotations

import asyncio
import errno
import io
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from sidecar.engine import TierSlice

log = logging.getLogger(__name__)

TCP_ESTABLISHED = 1  # linux/tcp.h (enum of tcpi_state)
# What sendfile(2) fails with when the peer is gone (sendfile(2), send(2)).
_HANG_UPS = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})


def offer_held(transport: asyncio.Transport | None, held: TierSlice, sent: int = 0) -> int:
    """How much of ``held`` from its byte ``sent`` on the socket takes now,
    with one sendfile(2) that does not wait: none while the transport has
    bytes queued (the headers, or a piece before this one), since those go
    first, and none on a transport that cannot send a file (TLS).

    Raises ConnectionResetError if the client is gone. Any other failure sends
    nothing: ``send_held`` then tries, and says what it cannot do."""
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away")
    if transport.get_write_buffer_size() or transport.get_extra_info("sslcontext"):
        return 0
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return os.sendfile(sock.fileno(), held.file, held.offset + sent, held.count - sent)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError as exc:
        if exc.errno in _HANG_UPS:
            raise ConnectionResetError("the client went away") from exc
        return 0


async def send_held(
    transport: asyncio.Transport | None,
    write: Callable[[bytes], Awaitable[None]],
    held: TierSlice,
    sent: int = 0,
) -> None:
    """``held`` to the client from its byte ``sent`` on (what ``offer_held``
    sent). The headers went out already (aiohttp's prepare() sends them at
    once, as the plain-range path does); loop.sendfile waits for the
    transport's buffer to empty before it starts, as aiohttp's own
    FileResponse relies on. The slice stays pinned until the caller releases
    it: the pages are handed over in several calls as the socket drains.

    A transport that cannot send a file (TLS) gets a copy of the bytes
    written instead (with ``write``, the response's own): a transport may
    keep what it is handed until the socket takes it (Python 3.12's do,
    without copying), and once the slice is released the region's pages may
    be punched out and refilled."""
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away")
    # A TLS transport cannot send a file (asyncio would refuse it with a
    # RuntimeError, given no fallback); nor can every loop (NotImplementedError).
    if transport.get_extra_info("sslcontext") is None:
        with io.FileIO(held.file, "rb", closefd=False) as file:
            try:
                # fallback=False: asyncio's fallback would seek and read the
                # shared file, racing other sends; the mapping needs neither.
                await asyncio.get_running_loop().sendfile(
                    transport, file, held.offset + sent, held.count - sent, fallback=False)
                return
            except (asyncio.SendfileNotAvailableError, NotImplementedError):
                if peer_gone(transport):
                    raise ConnectionResetError("the client went away") from None
    await write(bytes(held.view()[sent:]))


def peer_gone(transport: asyncio.BaseTransport) -> bool:
    """Whether the connection is past ESTABLISHED (the peer reset or closed it),
    from TCP_INFO's first field, tcpi_state (linux/tcp.h)."""
    if transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        state: int = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return True
    return state != TCP_ESTABLISHED


def is_sendfile_hangup_noise(context: dict[str, Any]) -> bool:
    """The loop's report of the doubly resolved sendfile wait (module docstring)."""
    handle = repr(context.get("handle", ""))
    return (isinstance(context.get("exception"), asyncio.InvalidStateError)
            and "_call_connection_lost" in handle)


def quiet_sendfile_hangups(loop: asyncio.AbstractEventLoop) -> None:
    """Have ``loop`` log that one report at DEBUG; everything else goes to the
    handler it had (asyncio's default when none)."""
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if is_sendfile_hangup_noise(context):
            log.debug("a client hung up while a sendfile waited: %s", context.get("message"))
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
