"""`python -m bench.light_client`: read partitions as Kafka's remote reader does,
with no CRC work, so the client is not the bound.

Per fetch a NEW connection: `GET /bucket/key` with `Range: bytes=POS-`, read
until `--fetch-bytes` of body arrived, then drop the connection mid-body (as
RemoteLogManager closes its stream); the next fetch starts at the first byte of
the first record batch not wholly received (Kafka record batch v2: baseOffset
i64 @0, batchLength i32 @8, a batch is 12 + batchLength bytes, magic @16 must
be 2), into the partition's next segment at its end. Partitions run at once,
one thread each, with blocking sockets reading into a buffer each thread
reuses: the GIL is free while they wait, and the client stays cheap. Every
thread signs its URLs first and then waits for the others, so that all
partitions send their first fetch at once: a thread started while the earlier
ones already read would wait for the GIL to start at all, and the last
partition would begin hundreds of milliseconds after the first.

Segments come as JSON on a file (`--segments`):
`{"partitions": {"0": [{"key": "...", "size": N}, ...], ...}}`.
Output: one JSON object (bytes, seconds, MB/s, fetch latency percentiles,
per-partition completion, errors, the client's own CPU).
"""

from __future__ import annotations

import argparse
import array
import fcntl
import json
import resource
import socket
import sys
import termios
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from bench.signing import presigned_path

_HEAD_LIMIT = 64 * 1024
_BATCH_OVERHEAD = 12  # baseOffset + batchLength
_MAGIC_AT = 16


class FetchFailed(Exception):
    pass


@dataclass
class PartitionResult:
    partition: str
    bytes: int = 0
    fetches: int = 0
    unread: int = 0  # body bytes the server had pushed past what the fetches used
    latencies_s: list[float] = field(default_factory=list)
    first_fetch_at: float | None = None  # perf_counter() when its first fetch went out
    done_at: float | None = None
    error: str | None = None


def whole_batches(buffer: memoryview, have: int) -> int:
    """Bytes of the complete record batches at the start of `buffer[:have]`."""
    offset = 0
    while offset + _MAGIC_AT + 1 <= have:
        length = int.from_bytes(buffer[offset + 8:offset + 12], "big", signed=True)
        magic = buffer[offset + _MAGIC_AT]
        if length <= 0 or magic != 2:
            raise FetchFailed(f"no record batch v2 at +{offset} (length {length}, magic {magic})")
        if offset + _BATCH_OVERHEAD + length > have:
            break
        offset += _BATCH_OVERHEAD + length
    return offset


def fetch(host: str, port: int, netloc: str, path: str, position: int, size: int,
          fetch_bytes: int, buffer: memoryview, timeout_s: float) -> tuple[int, int]:
    """One fetch from `position`: the bytes of whole batches it got, and the
    body bytes it received or found queued on its socket beyond those (what the
    server sent for nothing: a dropped connection discards them)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nRange: bytes={position}-\r\n"
                     f"User-Agent: bench-light-client\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(16384)
            if not data:
                raise FetchFailed(f"connection closed in the answer head at {position}")
            head += data
            if len(head) > _HEAD_LIMIT:
                raise FetchFailed("answer head too long")
        raw_head, _, body = head.partition(b"\r\n\r\n")
        status = raw_head.split(b" ", 2)[1]
        if status != b"206":
            raise FetchFailed(f"status {status.decode()} at {position}: "
                              f"{raw_head[:200].decode('latin-1')}")
        remaining = size - position
        have = min(len(body), remaining)
        buffer[:have] = body[:have]
        want = min(fetch_bytes, remaining)
        while True:
            while have < want:
                got = sock.recv_into(buffer[have:want])
                if got == 0:
                    raise FetchFailed(f"body ended at {position + have} of {size}")
                have += got
            whole = whole_batches(buffer, have)
            if whole or have >= remaining:
                if not whole:
                    raise FetchFailed(f"segment ends inside a batch at {position}")
                return whole, have - whole + _queued(sock)
            # Not even one batch whole: Kafka returns at least one, read on.
            want = min(remaining, have + fetch_bytes, len(buffer))
            if want == have:
                raise FetchFailed(f"a batch larger than {len(buffer)} bytes at {position}")


def _queued(sock: socket.socket) -> int:
    """Bytes waiting unread in the socket's receive queue (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    return count[0]


def read_partition(endpoint: str, bucket: str, segments: list[dict[str, object]],
                   fetch_bytes: int, result: PartitionResult, start: threading.Barrier,
                   timeout_s: float, sign: bool) -> None:
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    buffer = memoryview(bytearray(max(4 * fetch_bytes, 16 * 1024 * 1024)))
    # Signed (for the sidecar) as the plugin's requests are; nginx's slice
    # cache keys on the query, so its requests stay unsigned.
    try:
        paths = [presigned_path(endpoint, bucket, str(segment["key"])) if sign
                 else f"/{bucket}/{quote(str(segment['key']), safe='/~')}"
                 for segment in segments]
    finally:
        start.wait()
    try:
        for segment, path in zip(segments, paths, strict=True):
            size = int(segment["size"])  # type: ignore[call-overload]
            position = 0
            while position < size:
                fetch_started = time.perf_counter()
                if result.first_fetch_at is None:
                    result.first_fetch_at = fetch_started
                got, unread = fetch(host, port, parts.netloc, path, position, size,
                                    fetch_bytes, buffer, timeout_s)
                result.unread += unread
                result.latencies_s.append(time.perf_counter() - fetch_started)
                result.fetches += 1
                result.bytes += got
                position += got
    except Exception as exc:
        # Any: else the thread would end with the bytes it had and no error,
        # and the report would give a rate over a partial replay as a whole one.
        result.error = f"{type(exc).__name__}: {exc}"
    result.done_at = time.perf_counter()


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(endpoint: str, bucket: str, partitions: dict[str, list[dict[str, object]]],
        fetch_bytes: int, timeout_s: float, sign: bool = False) -> dict[str, object]:
    results = [PartitionResult(name) for name in partitions]
    start = threading.Barrier(len(results) + 1)
    threads = [
        threading.Thread(target=read_partition, args=(
            endpoint, bucket, partitions[result.partition], fetch_bytes, result, start,
            timeout_s, sign), daemon=True)
        for result in results
    ]
    for thread in threads:
        thread.start()
    start.wait(timeout_s)  # every thread has signed its URLs: all go at once
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout_s * 100)
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = sum(result.bytes for result in results)
    latencies = [latency for result in results for latency in result.latencies_s]
    # A partition's first fetch waits for its first block from the origin (a
    # foreground miss); the later ones find read-ahead landed or on its way.
    firsts = [result.latencies_s[0] for result in results if result.latencies_s]
    laters = [latency for result in results for latency in result.latencies_s[1:]]
    done = [result.done_at - started for result in results if result.done_at is not None]
    # How far apart the partitions' first fetches went out (all at once, ideally).
    firsts_at = [result.first_fetch_at for result in results if result.first_fetch_at]
    errors = [f"partition {r.partition}: {r.error}" for r in results if r.error]

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 3)

    return {
        "client": "light",
        "bytes": total,
        "seconds": round(seconds, 3),
        "mb_per_s": round(total / 1e6 / seconds, 2) if seconds else None,
        "fetches": sum(result.fetches for result in results),
        # Body bytes that reached the client for nothing: past the last whole
        # batch of a fetch, or still queued when it hung up (FIONREAD).
        "overshoot_bytes": sum(result.unread for result in results),
        "fetch_latency_ms": {
            "p50": ms(percentile(latencies, 0.5)), "p90": ms(percentile(latencies, 0.9)),
            "p99": ms(percentile(latencies, 0.99)), "max": ms(max(latencies, default=None)),
        },
        "first_fetch_latency_ms": {
            "p50": ms(percentile(firsts, 0.5)), "max": ms(max(firsts, default=None)),
        },
        "later_fetch_latency_ms": {
            "p50": ms(percentile(laters, 0.5)), "p99": ms(percentile(laters, 0.99)),
        },
        "partitions": len(results),
        "start_spread_ms": ms(max(firsts_at) - min(firsts_at)) if firsts_at else None,
        "first_done_s": round(min(done), 3) if done else None,
        "last_done_s": round(max(done), 3) if done else None,
        "last_over_first": round(max(done) / min(done), 3) if done and min(done) else None,
        "errors": len(errors),
        "error_messages": errors[:5],
        "client_cpu_seconds": round(usage.ru_utime + usage.ru_stime
                                    - usage_before.ru_utime - usage_before.ru_stime, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.light_client",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--segments", required=True, type=Path,
                        help='JSON: {"partitions": {"0": [{"key": K, "size": N}, ...]}}')
    parser.add_argument("--fetch-bytes", type=int, default=1024 * 1024)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds one fetch may take (connect, answer, body)")
    parser.add_argument("--sign", action="store_true",
                        help="presign each object's URL (SigV4 query) with the benchmark's "
                        "credentials, as a broker's plugin signs its requests to a sidecar")
    args = parser.parse_args(argv)
    partitions = json.loads(args.segments.read_text())["partitions"]
    report = run(args.endpoint, args.bucket, partitions, args.fetch_bytes, args.timeout,
                 args.sign)
    print(json.dumps(report))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
