"""Many concurrent clients replaying ranges against one sidecar, for a bounded time.

    .venv/bin/python -m bench.load --seconds 60 --connections 500

starts a local S3 (moto) with a few objects, the sidecar in front of it, warms
the cache, then opens `--connections` keep-alive connections that each send
ranged GETs back to back until the time is up (or `--max-requests` per
connection). Every body is compared with the object's bytes. A request counts
as ok (200/206 with the right bytes), slow_down (the documented 503 SlowDown of
admission control, after which the client backs off briefly) or a failure
(anything else: another status, wrong bytes, a reset, a timeout). Prints one
JSON object: requests, ok, slow_down, failures by kind, latency p50/p99 of ok
requests, the sidecar's peak RSS, its open fds before the clients came and
after they left.

The functional test tests/functional/test_load.py runs the same driver for a
shorter time against its own moto server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.probe import percentiles
from bench.sidecar_server import SidecarServer
from bench.signing import presigned_path
from bench.stopping import unwind_on_signals

OBJECT_COUNT = 8
OBJECT_BYTES = 4 * 1024 * 1024
BLOCK = "1MiB"
READ_TIMEOUT_S = 30.0
# The sidecar's keep-alive and slow-client bound is 30 s; a connection that
# answers nothing for this long is a failure, never a hang of the run.
HEADER_LIMIT = 64 * 1024


@dataclass
class Tally:
    ok: int = 0
    slow_down: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return self.ok + self.slow_down + sum(self.failures.values())


def objects(seed: int = 7) -> dict[str, bytes]:
    """Deterministic object bodies, Aiven-like keys."""
    rng = random.Random(seed)
    return {
        f"load-{seed}/{n}/{n * 1000:020d}-seg.log": rng.randbytes(OBJECT_BYTES)
        for n in range(OBJECT_COUNT)
    }


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > HEADER_LIMIT:
        raise ValueError("response header too large")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return status, headers, body


async def _client(
    host: str, port: int, bucket: str, bodies: dict[str, bytes], range_bytes: int,
    deadline: float, max_requests: int, tally: Tally, rng: random.Random,
) -> None:
    keys = list(bodies)
    # Signed once per object, as the plugin's requests are; the Range is not signed.
    paths = {key: presigned_path(f"http://{host}:{port}", bucket, key) for key in keys}
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    try:
        for _ in range(max_requests):
            if time.monotonic() >= deadline:
                break
            key = rng.choice(keys)
            size = len(bodies[key])
            start = rng.randrange(0, size - range_bytes)
            end = start + range_bytes - 1
            request = (
                f"GET {paths[key]} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Range: bytes={start}-{end}\r\n\r\n"
            ).encode()
            began = time.monotonic()
            try:
                if writer is None or reader is None:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(host, port), READ_TIMEOUT_S)
                writer.write(request)
                status, headers, body = await asyncio.wait_for(
                    _read_response(reader), READ_TIMEOUT_S)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ValueError, IndexError, TimeoutError) as exc:
                kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
                tally.failures[kind] += 1
                if writer is not None:
                    writer.close()
                writer = reader = None
                continue
            if status == 206 and body == bodies[key][start:end + 1]:
                tally.ok += 1
                tally.latencies_ms.append((time.monotonic() - began) * 1000)
            elif status == 503 and b"<Code>SlowDown</Code>" in body:
                tally.slow_down += 1
                # What an SDK does with SlowDown: back off, with jitter.
                await asyncio.sleep(rng.uniform(0.05, 0.25))
            elif status == 206:
                tally.failures["wrong_bytes"] += 1
            else:
                tally.failures[f"status_{status}"] += 1
            if headers.get("connection", "").lower() == "close" and writer is not None:
                writer.close()
                writer = reader = None
    finally:
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _sample_rss(process: psutil.Process, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], process.memory_info().rss)
        except psutil.Error:
            return
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass


async def drive(
    data_url: str, pid: int, bucket: str, bodies: dict[str, bytes], *, connections: int,
    seconds: float, range_bytes: int = 64 * 1024, max_requests: int = 100_000, seed: int = 1,
) -> dict[str, Any]:
    """Run the clients against a warmed sidecar; the summary as a JSON-able dict."""
    host, _, port_text = data_url.removeprefix("http://").rpartition(":")
    port = int(port_text)
    process = psutil.Process(pid)
    rss_before = process.memory_info().rss
    fds_before = open_fds(pid)
    peak = [rss_before]
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(process, peak, stop))
    tally = Tally()
    started = time.monotonic()
    deadline = started + seconds
    await asyncio.gather(*(
        _client(host, port, bucket, bodies, range_bytes, deadline, max_requests, tally,
                random.Random(seed * 100_003 + n))
        for n in range(connections)
    ))
    elapsed = time.monotonic() - started
    stop.set()
    await sampler
    # The sidecar closes its side once it sees the clients go; give it a moment.
    fds_after = open_fds(pid)
    settle = time.monotonic() + 15
    while fds_after > fds_before and time.monotonic() < settle:
        await asyncio.sleep(0.2)
        fds_after = open_fds(pid)
    latency = percentiles(tally.latencies_ms)
    return {
        "connections": connections,
        "seconds": round(elapsed, 1),
        "range_bytes": range_bytes,
        "requests": tally.requests,
        "ok": tally.ok,
        "slow_down": tally.slow_down,
        "other_failures": sum(tally.failures.values()),
        "failures": dict(tally.failures),
        "requests_per_s": round(tally.requests / elapsed, 1) if elapsed else None,
        "latency_ms": {"p50": latency["p50"], "p99": latency["p99"], "max": latency["max"]},
        "sidecar_rss_mib": {"before": round(rss_before / 2**20, 1),
                            "peak": round(peak[0] / 2**20, 1)},
        "sidecar_fds": {"before": fds_before, "after": fds_after},
        "sidecar_alive": process.is_running() and process.status() != psutil.STATUS_ZOMBIE,
    }


def upload(endpoint: str, bucket: str, bodies: dict[str, bytes]) -> None:
    from sidecar.tools.local_s3 import loopback_client

    s3 = loopback_client(endpoint, key="bench", secret="bench-secret")
    try:
        s3.create_bucket(Bucket=bucket)
        for key, body in bodies.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
    finally:
        s3.close()


def warm(data_url: str, bucket: str, bodies: dict[str, bytes]) -> None:
    """Read every object once through the sidecar so the run measures serving, not moto."""
    import urllib.request

    for key, body in bodies.items():
        path = presigned_path(data_url, bucket, key)
        with urllib.request.urlopen(f"{data_url}{path}", timeout=60) as response:
            if response.read() != body:
                raise RuntimeError(f"warm-up read of {key} returned wrong bytes")


def run_load(
    origin_endpoint: str, work_dir: Path, *, connections: int, seconds: float,
    range_bytes: int = 64 * 1024, max_requests: int = 100_000,
    sidecar_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Upload, start a sidecar in front of `origin_endpoint`, warm it, drive it."""
    bucket = f"load-{os.getpid()}-{int(time.time())}"
    bodies = objects()
    upload(origin_endpoint, bucket, bodies)
    with SidecarServer(
        origin_endpoint, work_dir / "cache", work_dir / "logs", cache_size="256MiB",
        extra=("--block-size", BLOCK, *sidecar_args),
    ) as sidecar:
        warm(sidecar.data_url, bucket, bodies)
        assert sidecar.pid is not None
        summary = asyncio.run(drive(
            sidecar.data_url, sidecar.pid, bucket, bodies, connections=connections,
            seconds=seconds, range_bytes=range_bytes, max_requests=max_requests,
        ))
        stats = sidecar.stats()
        summary["sidecar_byte_hit_ratio"] = stats.get("byte_hit_ratio")
        summary["sidecar_alive"] = summary["sidecar_alive"] and sidecar.stop() == 0
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--range-bytes", type=int, default=64 * 1024)
    parser.add_argument("--max-requests", type=int, default=100_000,
                        help="bound of requests per connection")
    parser.add_argument("--output", type=Path,
                        default=Path("test-artifacts/reliability/load.json"))
    args = parser.parse_args(argv)
    unwind_on_signals()
    import tempfile

    from sidecar.tools.local_s3 import LocalS3

    with tempfile.TemporaryDirectory(prefix="sidecar-load-") as tmp, LocalS3() as origin:
        summary = run_load(origin.endpoint, Path(tmp), connections=args.connections,
                           seconds=args.seconds, range_bytes=args.range_bytes,
                           max_requests=args.max_requests)
    summary["command"] = "python -m bench.load " + " ".join(sys.argv[1:] if argv is None else argv)
    text = json.dumps(summary, indent=2)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + "\n")
    print(text)
    return 0 if summary["other_failures"] == 0 and summary["sidecar_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
