"""`python -m bench.floor_server`: what serving a Kafka replay costs a Python
server that does nothing else, the floor under the sidecar's warm replay.

It answers `GET /BUCKET/KEY` with `Range: bytes=POS-` (or `bytes=A-B`) from the
files under `--root` (the data set, in the page cache after its first read),
206 with Content-Length and Content-Range, and nothing more: no cache index, no
checksums, no signatures, no metrics, no access log. `--mode`:

- `aiohttp`: a `web.StreamResponse`, the body read from the file 1 MiB at a
  time into a buffer taken from a pool (`os.preadv`: no allocation and no
  page faults per read) and, for an open-ended read, written 128 KiB at a
  time, the socket's send buffer set to 128 KiB: the data port's way;
- `protocol`: the same preads and writes from a bare `asyncio.Protocol` (the
  request head split by hand, the transport's flow control awaited);
- `sendfile`: a bare `asyncio.Protocol` that hands the range to
  `loop.sendfile` (sendfile(2): the page cache's pages go to the socket, no
  copy in the process);
- `protocol-verified` and `sendfile-verified`: the same two, with what a cache
  that checks every byte against its checksum before serving it must do at
  least: read each 1 MiB chunk the range touches whole and hash it (xxh3, as
  the sidecar's chunk checksums), then write it, or sendfile the same range;
- `direct-verified`: as `protocol-verified`, the chunk read past the page
  cache (O_DIRECT, into a page-aligned pooled buffer) and hashed in a worker
  thread, as a read that may wait for the disk must be;
- `aiohttp-direct-verified`: the `aiohttp` way with the reads of
  `direct-verified`: the data port's way with a hit, and nothing else;
- `aiohttp-sendfile`: aiohttp's response, then the range sent one
  READ_CHUNK-aligned slice at a time, each offered to the socket with one
  sendfile(2) at once and the rest handed to `loop.sendfile`: the data port's
  way with a hit in the memory tier (a region a chunk), and nothing else.

The bare protocols end the connection with each answer, as the light client
drops it. The aiohttp floors keep it alive, as the data port does (wrk's
warm 1 MiB ranges), and send a bounded range 1 MiB at a time with the
kernel's send buffer; an open-ended one goes out as the data port's does. Binds
127.0.0.1 on a free port and prints `{"event": "ready", "port": N}`; runs
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import re
import select
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlsplit

import xxhash
from aiohttp import web

MODES = ("aiohttp", "protocol", "sendfile", "protocol-verified", "sendfile-verified",
         "direct-verified", "aiohttp-direct-verified", "aiohttp-sendfile")
# Worker threads of the direct-verified floor: the sidecar's io_threads default.
DIRECT_THREADS = 4
SEND_PIECE = 128 * 1024  # the data port's SEND_BUFFER_BYTES for an open-ended read
READ_CHUNK = 1024 * 1024  # the cache's chunk
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
# Read buffers in use give the transport what it could not send at once as a
# copy (asyncio's write buffer), so one is free again once its writes return.
_POOL: list[bytearray] = []
_ALIGNED_POOL: list[mmap.mmap] = []


def read_chunk(fd: int, position: int, last: int, buffer: bytearray | mmap.mmap,
               verify: bool) -> memoryview:
    """The bytes from `position` on, at most to `last` and to the end of a
    READ_CHUNK, read into `buffer`. `verify`: the READ_CHUNK-aligned chunk is
    read whole and hashed, as a cache checks a chunk's checksum before serving
    any byte of it (and O_DIRECT wants aligned reads)."""
    lo = position - position % READ_CHUNK if verify else position
    with memoryview(buffer) as whole:
        view = whole[:READ_CHUNK if verify else min(READ_CHUNK, last + 1 - lo)]
    got = os.preadv(fd, [view], lo)
    if got <= position - lo:
        raise ConnectionAbortedError(f"the file ended at {position}")
    if verify:
        xxhash.xxh3_64_intdigest(view[:got])
    return view[position - lo:min(got, last + 1 - lo)]


def _take_buffer(direct: bool) -> bytearray | mmap.mmap:
    """A pooled READ_CHUNK buffer; page-aligned (a mapping's) for O_DIRECT."""
    if direct:
        return _ALIGNED_POOL.pop() if _ALIGNED_POOL else mmap.mmap(-1, READ_CHUNK)
    return _POOL.pop() if _POOL else bytearray(READ_CHUNK)


def _give_back(buffer: bytearray | mmap.mmap) -> None:
    if isinstance(buffer, mmap.mmap):
        _ALIGNED_POOL.append(buffer)
    else:
        _POOL.append(buffer)


def ready_port(process: subprocess.Popen[str], timeout_s: float = 30.0) -> int | None:
    """The port a started floor server printed on its ready line (its stdout a
    text pipe); None if it printed none within `timeout_s` or exited."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout_s)
    line = process.stdout.readline() if readable else ""
    try:
        return int(json.loads(line)["port"]) if line else None
    except (ValueError, KeyError, TypeError):
        return None


class BadRequest(ValueError):
    pass


def resolve(root: Path, target: str, range_value: str | None) -> tuple[Path, int, int, int]:
    """The file, first and last byte, and size of a `GET /BUCKET/KEY` with a Range."""
    path = (root / unquote(urlsplit(target).path).lstrip("/")).resolve()
    if root not in path.parents or not path.is_file():
        raise BadRequest(f"no such object: {target}")
    size = path.stat().st_size
    match = _RANGE.match(range_value or "")
    if match is None:
        raise BadRequest(f"not a single byte range: {range_value!r}")
    first = int(match.group(1))
    last = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
    if first > last:
        raise BadRequest(f"range {range_value} outside {size} bytes")
    return path, first, last, size


def _prepare_socket(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_PIECE)
    if isinstance(transport, asyncio.WriteTransport):
        transport.set_write_buffer_limits(high=SEND_PIECE // 2)


def aiohttp_app(root: Path, direct: bool = False,
                threads: ThreadPoolExecutor | None = None,
                sendfile: bool = False) -> web.Application:
    """The `aiohttp` floor, keep-alive as the data port. `direct`: each chunk
    read past the page cache and hashed in one of `threads` (the
    `aiohttp-direct-verified` floor, the data port's way with a hit).
    `sendfile`: each chunk's slice handed to the kernel (`aiohttp-sendfile`)."""
    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            path, first, last, size = resolve(root, request.path_qs,
                                              request.headers.get("Range"))
        except BadRequest as exc:
            return web.Response(status=416, text=str(exc))
        response = web.StreamResponse(status=206, headers={
            "Content-Length": str(last - first + 1),
            "Content-Range": f"bytes {first}-{last}/{size}"})
        # As the data port: a small send buffer for an open-ended read only.
        lazy = request.headers.get("Range", "").endswith("-")
        if lazy and request.transport is not None:
            _prepare_socket(request.transport)
        await response.prepare(request)
        if sendfile:
            await _send_slices(request, path, first, last)
            return response
        loop = asyncio.get_running_loop()
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        buffer = _take_buffer(direct)
        try:
            position = first
            while position <= last:
                if direct:
                    data = await loop.run_in_executor(
                        threads, read_chunk, fd, position, last, buffer, True)
                else:
                    data = read_chunk(fd, position, last, buffer, verify=False)
                if lazy:
                    for at in range(0, len(data), SEND_PIECE):
                        await response.write(data[at:at + SEND_PIECE])
                else:
                    await response.write(data)
                position += len(data)
                data.release()
        except ConnectionError:
            if request.transport is not None:
                request.transport.abort()
        finally:
            os.close(fd)
            _give_back(buffer)
        return response

    app = web.Application()
    app.router.add_get("/{tail:.+}", answer)
    return app


async def _send_slices(request: web.Request, path: Path, first: int, last: int) -> None:
    """first..last one READ_CHUNK-aligned slice at a time, as the data port
    sends the memory tier's regions: what one sendfile(2) sends at once (when
    nothing is queued ahead), then `loop.sendfile` for the rest (each slice on
    its own: one call for the whole range would be a lower floor than the tier
    can reach)."""
    transport = request.transport
    try:
        if transport is None:
            raise ConnectionResetError()
        # Opened on the loop: the files are in the page cache, as for the bare
        # sendfile floor.
        with open(path, "rb") as file:  # noqa: ASYNC230
            position = first
            while position <= last:
                upto = min(last + 1, (position // READ_CHUNK + 1) * READ_CHUNK)
                if not transport.get_write_buffer_size():
                    try:
                        position += os.sendfile(transport.get_extra_info("socket").fileno(),
                                                file.fileno(), position, upto - position)
                    except BlockingIOError:
                        pass
                if position < upto:
                    await asyncio.get_running_loop().sendfile(
                        transport, file, position, upto - position, fallback=False)
                position = upto
    except (ConnectionError, RuntimeError):
        # RuntimeError: asyncio's "Transport is closing", a hang-up between slices.
        if transport is not None:
            transport.abort()


class BareAnswer(asyncio.Protocol):
    """One request per connection, answered by `sendfile` or by preads and writes."""

    def __init__(self, root: Path, mode: str, threads: ThreadPoolExecutor) -> None:
        self._root = root
        self._sendfile = mode.startswith("sendfile")
        self._verify = mode.endswith("-verified")
        self._direct = mode == "direct-verified"
        self._threads = threads
        self._head = bytearray()
        self._transport: asyncio.Transport | None = None
        self._writable: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        _prepare_socket(transport)

    def data_received(self, data: bytes) -> None:
        self._head += data
        if self._task is None and b"\r\n\r\n" in self._head:
            self._task = asyncio.get_running_loop().create_task(self._answer(bytes(self._head)))

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionResetError())

    async def _answer(self, head: bytes) -> None:
        transport = self._transport
        assert transport is not None
        lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        target = lines[0].split(" ")[1] if lines[0].count(" ") == 2 else ""
        fields = {name.strip().lower(): value.strip()
                  for name, _, value in (line.partition(":") for line in lines[1:])}
        try:
            path, first, last, size = resolve(self._root, target, fields.get("range"))
        except BadRequest as exc:
            text = str(exc).encode()
            transport.write(b"HTTP/1.1 416 Range Not Satisfiable\r\nConnection: close\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(text), text))
            transport.close()
            return
        transport.write(f"HTTP/1.1 206 Partial Content\r\nContent-Length: {last - first + 1}\r\n"
                        f"Content-Range: bytes {first}-{last}/{size}\r\n"
                        "Connection: close\r\n\r\n".encode("latin-1"))
        try:
            if self._sendfile and not self._verify:
                # Opened on the loop: the files are in the page cache, and the
                # floor is what serving costs with nothing in between.
                with open(path, "rb") as file:  # noqa: ASYNC230
                    await asyncio.get_running_loop().sendfile(transport, file, first,
                                                              last + 1 - first)
            else:
                await self._send_chunks(path, first, last)
        except (ConnectionError, OSError):
            transport.abort()
            return
        transport.close()

    async def _send_chunks(self, path: Path, first: int, last: int) -> None:
        """first..last a chunk at a time: read (on the loop, or with O_DIRECT in
        a worker thread), then written in SEND_PIECE pieces or sent with sendfile."""
        transport = self._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        buffer = _take_buffer(self._direct)
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if self._direct else 0))
        # What loop.sendfile takes: a file object (its descriptor is used).
        file = open(fd, "rb", buffering=0, closefd=False)  # noqa: ASYNC230, SIM115
        try:
            position = first
            while position <= last:
                if self._direct:
                    data = await loop.run_in_executor(
                        self._threads, read_chunk, fd, position, last, buffer, True)
                else:
                    data = read_chunk(fd, position, last, buffer, self._verify)
                if self._sendfile:
                    await loop.sendfile(transport, file, position, len(data))
                else:
                    for at in range(0, len(data), SEND_PIECE):
                        if transport.is_closing():
                            raise ConnectionResetError()
                        transport.write(data[at:at + SEND_PIECE])
                        if self._writable is not None:
                            await self._writable
                position += len(data)
                data.release()
        finally:
            file.close()
            os.close(fd)
            _give_back(buffer)


async def serve(root: Path, mode: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    threads = ThreadPoolExecutor(DIRECT_THREADS, thread_name_prefix="floor-io")
    if mode.startswith("aiohttp"):
        app = aiohttp_app(root, direct=mode == "aiohttp-direct-verified", threads=threads,
                          sendfile=mode == "aiohttp-sendfile")
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            print(json.dumps({"event": "ready", "port": port}), flush=True)
            await stop.wait()
        finally:
            await runner.cleanup()
            threads.shutdown()
        return
    server = await loop.create_server(lambda: BareAnswer(root, mode, threads), "127.0.0.1", 0)
    try:
        print(json.dumps({"event": "ready", "port": server.sockets[0].getsockname()[1]}),
              flush=True)
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()
        threads.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_server",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, required=True,
                        help="directory holding BUCKET/KEY files")
    parser.add_argument("--mode", choices=MODES, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.root.resolve(), args.mode))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
