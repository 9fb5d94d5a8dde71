"""Ranged GETs read by worker threads straight into a sink (sidecar.origin.range_reader).

Against scripted origins on loopback (raw TCP: each answer byte by byte as a
test wants it, good or bad) and against moto's S3 server with a URL presigned
by botocore, as the sidecar makes them.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sidecar.errors import OriginBadBody, OriginObjectChanged
from sidecar.origin.range_reader import OriginAnswered, Progress, RangeReader, SinkFailed

pytestmark = pytest.mark.functional

DATA = random.Random(5).randbytes(300_000)
ETAG = '"v1"'
CHUNK = 64 * 1024


@dataclass
class Request:
    head: str
    fields: dict[str, str]

    @property
    def range(self) -> tuple[int, int]:
        first, _, last = self.fields["range"].removeprefix("bytes=").partition("-")
        return int(first), int(last)


Answer = Callable[[Request, socket.socket], bool]
"""Writes one answer to the socket; returns whether the connection stays open."""


@dataclass
class ScriptedOrigin:
    """Answers each request with the next scripted answer (the last one repeats)."""

    answers: list[Answer]
    requests: list[Request] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/bkt/key?X-Amz-Signature=s"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn:
            buffer = b""
            for _ in range(100):  # bounded: no test sends more requests on one connection
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = {k.strip().lower(): v.strip()
                          for k, _, v in (line.partition(":") for line in lines[1:])}
                request = Request(lines[0], fields)
                self.requests.append(request)
                answer = self.answers[min(len(self.requests) - 1, len(self.answers) - 1)]
                try:
                    if not answer(request, conn):
                        return
                except OSError:
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()


def partial(body_end: int | None = None, etag: str = ETAG, length_delta: int = 0,
            content_range: str | None = None, keep: bool = True,
            pause_after: int | None = None, pause_s: float = 0.0) -> Answer:
    """A 206 for the range asked, optionally wrong in one way."""
    def answer(request: Request, conn: socket.socket) -> bool:
        first, last = request.range
        body = DATA[first:last + 1]
        cut = body if body_end is None else body[:body_end]
        fields = [f"Content-Length: {len(body) + length_delta}",
                  f"Content-Range: {content_range or f'bytes {first}-{last}/{len(DATA)}'}",
                  f"ETag: {etag}"]
        if not keep:
            fields.append("Connection: close")
        conn.sendall(("HTTP/1.1 206 Partial Content\r\n" + "\r\n".join(fields)
                      + "\r\n\r\n").encode())
        if pause_after is not None:
            conn.sendall(cut[:pause_after])
            time.sleep(pause_s)
            conn.sendall(cut[pause_after:])
        else:
            conn.sendall(cut)
        return keep and body_end is None
    return answer


def error(status: int, code: str) -> Answer:
    def answer(request: Request, conn: socket.socket) -> bool:
        body = f"<Error><Code>{code}</Code></Error>".encode()
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body)
        return True
    return answer


def hang_up(request: Request, conn: socket.socket) -> bool:
    return False


@pytest.fixture
def reader() -> Iterator[RangeReader]:
    reading = RangeReader(connect_timeout_s=2, stall_timeout_s=0.5, max_chunk_size=CHUNK)
    yield reading
    reading.close()


@pytest.fixture
def origins() -> Iterator[Callable[[list[Answer]], ScriptedOrigin]]:
    made: list[ScriptedOrigin] = []

    def make(answers: list[Answer]) -> ScriptedOrigin:
        made.append(ScriptedOrigin(answers))
        return made[-1]

    yield make
    for origin in made:
        origin.stop()


class Collected:
    """A sink that keeps what it is given, and checks chunk alignment."""

    def __init__(self) -> None:
        self.chunks: dict[int, bytes] = {}

    def __call__(self, offset: int, data: memoryview) -> None:
        assert offset % CHUNK == 0 or offset == min(self.chunks, default=offset), offset
        self.chunks[offset] = bytes(data)

    def bytes_from(self, start: int) -> bytes:
        out = b""
        for offset in sorted(self.chunks):
            assert offset == start + len(out)
            out += self.chunks[offset]
        return out


def read(reader: RangeReader, origin: ScriptedOrigin, start: int, end: int,
         sink: Collected | None = None, **kwargs: Any) -> tuple[Collected, Progress]:
    sink = sink or Collected()
    progress = Progress(start)
    reader.read(origin.url, end, ETAG, len(DATA), sink, progress, CHUNK, **kwargs)
    return sink, progress


def test_chunks_arrive_aligned_and_connections_are_kept(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial()])
    sink, progress = read(reader, origin, 2 * CHUNK, 4 * CHUNK + 100)
    assert sink.bytes_from(2 * CHUNK) == DATA[2 * CHUNK:4 * CHUNK + 100]
    assert sorted(sink.chunks) == [2 * CHUNK, 3 * CHUNK, 4 * CHUNK]
    assert progress.position == 4 * CHUNK + 100
    read(reader, origin, 0, CHUNK)
    assert origin.connections == 1  # the second GET reused the first connection
    request = origin.requests[0]
    assert request.head.startswith("GET /bkt/key?X-Amz-Signature=s HTTP/1.1")
    assert request.fields["range"] == f"bytes={2 * CHUNK}-{4 * CHUNK + 99}"
    assert request.fields["if-match"] == ETAG


def test_pace_is_asked_before_each_chunk(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial()])
    paced: list[int] = []
    read(reader, origin, 0, 2 * CHUNK + 5, pace=paced.append)
    assert paced == [CHUNK, CHUNK, 5]


def test_a_body_cut_short_keeps_the_whole_chunks_and_says_where_to_resume(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial(body_end=CHUNK + 1000, keep=False)])
    sink = Collected()
    with pytest.raises(OriginBadBody, match="short"):
        read(reader, origin, 0, 3 * CHUNK, sink)
    # The partial second chunk never reached the sink: the next attempt resumes at it.
    assert sorted(sink.chunks) == [0]
    progress = Progress(CHUNK)
    origin.answers[:] = [partial()]
    reader.read(origin.url, 3 * CHUNK, ETAG, len(DATA), sink, progress, CHUNK)
    assert sink.bytes_from(0) == DATA[:3 * CHUNK]


@pytest.mark.parametrize("wrong, raised", [
    (partial(etag='"v2"'), OriginObjectChanged),
    (partial(length_delta=1), OriginBadBody),
    (partial(content_range="bytes 0-9/300000"), OriginBadBody),
    (partial(content_range=f"bytes 0-{CHUNK - 1}/299999"), OriginBadBody),
])
def test_a_wrong_answer_delivers_nothing(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin],
    wrong: Answer, raised: type[Exception],
) -> None:
    origin = origins([wrong])
    sink = Collected()
    with pytest.raises(raised):
        read(reader, origin, 0, CHUNK, sink)
    assert sink.chunks == {}


def test_an_error_answer_carries_its_status_and_s3_code(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([error(503, "SlowDown")])
    with pytest.raises(OriginAnswered) as caught:
        read(reader, origin, 0, CHUNK)
    assert (caught.value.status, caught.value.code) == (503, "SlowDown")


def test_a_kept_connection_the_origin_closed_is_replaced_once_silently(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial(), hang_up, partial()])
    read(reader, origin, 0, CHUNK)  # leaves its connection in the pool
    sink, _ = read(reader, origin, CHUNK, 2 * CHUNK)  # that one is dead: a new one
    assert sink.bytes_from(CHUNK) == DATA[CHUNK:2 * CHUNK]
    assert origin.connections == 2


def test_a_stalled_body_fails_within_the_stall_limit(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial(pause_after=100, pause_s=3.0)])
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        read(reader, origin, 0, CHUNK)
    assert time.monotonic() - started < 2.5  # 0.5 s stall limit, not the 3 s pause


def test_a_sink_that_fails_is_not_the_origins_fault(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial()])

    def full_disk(offset: int, data: memoryview) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(SinkFailed) as caught:
        reader.read(origin.url, CHUNK, ETAG, len(DATA), full_disk, Progress(0), CHUNK)
    assert isinstance(caught.value.__cause__, OSError)


def test_close_ends_a_read_blocked_on_the_origin(
    reader: RangeReader, origins: Callable[[list[Answer]], ScriptedOrigin]
) -> None:
    origin = origins([partial(pause_after=10, pause_s=5.0)])
    slow = RangeReader(connect_timeout_s=2, stall_timeout_s=30, max_chunk_size=CHUNK)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            slow.read(origin.url, CHUNK, ETAG, len(DATA), Collected(), Progress(0), CHUNK)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    while not origin.requests:
        time.sleep(0.01)
    started = time.monotonic()
    slow.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - started < 2
    assert outcome and isinstance(outcome[0], OSError | OriginBadBody)


def test_a_presigned_get_of_moto(origin_s3: Any, bucket: str, reader: RangeReader) -> None:
    data = random.Random(8).randbytes(5 * CHUNK + 17)
    origin_s3.put_object(Bucket=bucket, Key="seg.log", Body=data)
    etag = origin_s3.head_object(Bucket=bucket, Key="seg.log")["ETag"]
    url = origin_s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "seg.log"}, ExpiresIn=60)
    sink = Collected()
    reader.read(url, len(data), etag, len(data), sink, Progress(CHUNK), CHUNK)
    assert sink.bytes_from(CHUNK) == data[CHUNK:]
    with pytest.raises(OriginAnswered) as caught:  # If-Match of another version
        reader.read(url, len(data), '"0000"', len(data), Collected(), Progress(0), CHUNK)
    assert caught.value.status == 412
