"""`sidecar replay` as a real process, against moto, the recording proxy and the sidecar."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from sidecar.tools.kafka_segments import (
    SegmentObject,
    generate_topic_segments,
    iter_segment_batches,
)
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy
from tests.support.replay_cli import replay_json, run_replay

TOPICS = ("orders", "clicks")
PARTITIONS = 2
SEGMENTS = 3
SEGMENT_BYTES = 1536 * 1024


@dataclass(frozen=True)
class Seeded:
    bucket: str
    segments: tuple[SegmentObject, ...]

    def records(self, topic: str | None = None, partition: int | None = None) -> int:
        return sum(h.record_count for s in self.chosen(topic, partition)
                   for h in iter_segment_batches(s.data))

    def bytes(self, topic: str | None = None, partition: int | None = None) -> int:
        return sum(len(s.data) for s in self.chosen(topic, partition))

    def chosen(self, topic: str | None, partition: int | None) -> list[SegmentObject]:
        return [s for s in self.segments if (topic is None or s.topic == topic)
                and (partition is None or s.partition == partition)]


@pytest.fixture(scope="module")
def generated() -> tuple[SegmentObject, ...]:
    return tuple(
        segment
        for seed, topic in enumerate(TOPICS)
        for segment in generate_topic_segments(
            topic=topic, partitions=PARTITIONS, segments_per_partition=SEGMENTS,
            segment_bytes=SEGMENT_BYTES, value_size=2048, seed=seed,
        )
    )


@pytest.fixture()
def seeded(origin_s3: Any, bucket: str, generated: tuple[SegmentObject, ...]) -> Seeded:
    for segment in generated:
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
        # The sibling files the plugin also writes, which replay must skip.
        origin_s3.put_object(Bucket=bucket, Key=segment.key[:-3] + "indexes", Body=b"idx")
    return Seeded(bucket, generated)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sidecar: error: ")
    return lines[0]


def test_replay_straight_from_s3(local_s3: LocalS3, seeded: Seeded) -> None:
    report = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket)
    assert report["crc_errors"] == 0
    assert report["records"] == seeded.records()
    assert report["bytes"] == seeded.bytes()
    assert report["partitions"] == len(TOPICS) * PARTITIONS
    assert report["segments"] == len(seeded.segments)
    # ~1.6 MB segments read 1 MiB at a time: two fetches each.
    assert report["fetches"] == 2 * len(seeded.segments)
    assert report["batches"] == sum(1 for s in seeded.segments
                                    for _ in iter_segment_batches(s.data))
    assert report["mb_per_s"] > 0 and report["records_per_s"] > 0
    latency = report["fetch_latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    for key in ("block_hit_ratio", "byte_hit_ratio", "origin_bytes", "fetch_hit_ratio"):
        assert report[key] is None


def test_replay_through_the_sidecar(
    local_s3: LocalS3, seeded: Seeded, sidecar: SidecarProcess
) -> None:
    # The listing goes to the object store itself: a broker never lists either
    # (its segment metadata comes from __remote_log_metadata).
    report = replay_json(
        "--endpoint", sidecar.data_url, "--list-endpoint", local_s3.endpoint,
        "--bucket", seeded.bucket, "--admin", sidecar.admin_url,
        "--topic", "orders", "--fetch-bytes", "256KiB",
    )
    assert report["crc_errors"] == 0
    assert report["records"] == seeded.records("orders")
    assert report["bytes"] == seeded.bytes("orders")
    assert 0.0 <= report["block_hit_ratio"] <= 1.0
    assert 0.0 <= report["byte_hit_ratio"] <= 1.0
    # The sidecar read at least what it served that did not come from its cache.
    assert report["origin_bytes"] > 0
    stats = sidecar.stats()
    assert stats["hits"] + stats["misses"] > 0  # type: ignore[operator]


def test_brokers_hanging_up_after_each_fetch_leave_the_log_quiet(
    local_s3: LocalS3, seeded: Seeded, sidecar: SidecarProcess
) -> None:
    """Kafka's remote reader closes the stream after each fetch: normal, so no
    WARNING or ERROR line (let alone a traceback), only a count. Four
    replays, two at a time, as brokers of a cluster read at once."""
    before = len(sidecar.stderr_lines)

    def replay(_: int) -> dict[str, Any]:
        return replay_json(
            "--endpoint", sidecar.data_url, "--list-endpoint", local_s3.endpoint,
            "--bucket", seeded.bucket, "--fetch-bytes", "256KiB",
        )

    with ThreadPoolExecutor(2) as replays:
        for report in replays.map(replay, range(4)):
            assert report["crc_errors"] == 0 and report["bytes"] == seeded.bytes()
    sidecar.wait_idle()
    assert sidecar.metric("sidecar_client_disconnects_total") > 0
    assert sidecar.stderr_lines[before:] == []


def test_an_offset_range_replays_the_segments_a_plan_would_warm(
    local_s3: LocalS3, seeded: Seeded
) -> None:
    """From an offset inside the first segment to one inside the second: those
    two segments of every orders partition, as a warm-up plan selects them."""
    orders = [s for s in seeded.segments if s.topic == "orders"]
    first = min(s.start_offset for s in orders if s.start_offset > 0)  # second segments
    chosen = [s for s in orders if s.start_offset < first]
    inside_second = first + 1
    wanted = [s for s in orders if s.start_offset <= inside_second]
    assert len(wanted) == 2 * PARTITIONS and len(chosen) == PARTITIONS
    report = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                         "--topic", "orders", "--from-offset", "1",
                         "--to-offset", str(inside_second))
    assert report["segments"] == len(wanted) and report["crc_errors"] == 0
    assert report["bytes"] == sum(len(s.data) for s in wanted)
    beyond = run_replay("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                        "--topic", "orders", "--from-time", "0", "--to-time", "1")
    assert "no segment holds any of the range" in one_error_line(beyond)


def test_a_time_range_selects_by_each_segments_first_batch(
    local_s3: LocalS3, seeded: Seeded
) -> None:
    # Record n of a partition was written at 1_790_000_000_000 + n ms (see
    # generate_topic_segments): from the last segments' first record on.
    clicks = [s for s in seeded.segments if s.topic == "clicks"]
    last_start = max(s.start_offset for s in clicks)
    wanted = [s for s in clicks if s.start_offset == last_start]
    report = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                         "--topic", "clicks", "--from-time", str(1_790_000_000_000 + last_start))
    assert report["segments"] == len(wanted) == PARTITIONS
    assert report["bytes"] == sum(len(s.data) for s in wanted)
    # The same moment in ISO 8601.
    iso = "2026-09-21T14:13:20+00:00"  # 1_790_000_000_000 ms
    every = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                        "--topic", "clicks", "--from-time", iso)
    assert every["segments"] == len(clicks)


def test_replay_summary_is_readable(local_s3: LocalS3, seeded: Seeded) -> None:
    result = run_replay("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                        "--topic", "clicks", "--partitions", "0")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"{seeded.records('clicks', 0):,} records" in text
    assert "1 partition, 3 segments" in text and "0 failed" in text and "MiB/s" in text


@pytest.mark.parametrize(
    ("topic", "partitions", "expected"),
    [("orders", "1", [("orders", 1)]), (None, "0", [("orders", 0), ("clicks", 0)]),
     ("clicks", "all", [("clicks", 0), ("clicks", 1)])],
)
def test_replay_filters(
    local_s3: LocalS3, seeded: Seeded, topic: str | None, partitions: str,
    expected: list[tuple[str, int]],
) -> None:
    args = ["--topic", topic] if topic else []
    report = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                         *args, "--partitions", partitions)
    assert report["partitions"] == len(expected)
    assert report["segments"] == SEGMENTS * len(expected)
    assert report["records"] == sum(seeded.records(t, p) for t, p in expected)
    assert report["bytes"] == sum(seeded.bytes(t, p) for t, p in expected)


def test_topic_filter_is_exact(local_s3: LocalS3, origin_s3: Any, seeded: Seeded) -> None:
    # "orders-eu" keys share the listing prefix "orders-" with "orders".
    [extra] = generate_topic_segments(topic="orders-eu", partitions=1, segments_per_partition=1,
                                      segment_bytes=64 * 1024, value_size=100, seed=9)
    origin_s3.put_object(Bucket=seeded.bucket, Key=extra.key, Body=extra.data)
    report = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                         "--topic", "orders")
    assert report["records"] == seeded.records("orders")


def test_corrupted_segment_fails_the_check(
    local_s3: LocalS3, origin_s3: Any, seeded: Seeded
) -> None:
    victim = seeded.chosen("clicks", 1)[1]
    damaged = bytearray(victim.data)
    damaged[200_000] ^= 0x40  # well inside some batch's records, under its CRC
    origin_s3.put_object(Bucket=seeded.bucket, Key=victim.key, Body=bytes(damaged))
    result = run_replay("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                        "--topic", "clicks", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["crc_errors"] >= 1
    assert report["bytes"] < seeded.bytes("clicks")
    assert victim.key in result.stderr and "CRC-32C mismatch" in result.stderr


def test_fetches_look_like_a_brokers(proxy: RecordingProxy, seeded: Seeded) -> None:
    proxy.clear()
    report = replay_json("--endpoint", proxy.endpoint, "--bucket", seeded.bucket,
                         "--topic", "orders", "--partitions", "0", "--fetch-bytes", "300KiB")
    assert report["crc_errors"] == 0
    lists = [r for r in proxy.requests if "list-type=2" in r.path]
    # Only the prefix (no delimiter, no encoding-type): benchmark origins serve
    # pre-generated listings keyed by it.
    assert lists and all(set(parse_qs(urlsplit(r.path).query)) == {"list-type", "prefix"}
                         for r in lists)
    gets = proxy.gets()
    assert len(gets) == report["fetches"]
    for segment in seeded.chosen("orders", 0):
        ranges = [r.range for r in gets if r.key == segment.key]
        assert ranges and all(r is not None and r.startswith("bytes=") and r.endswith("-")
                              for r in ranges)
        starts = [int(r[len("bytes="):-1]) for r in ranges if r is not None]
        boundaries, position = set(), 0
        for header in iter_segment_batches(segment.data):
            boundaries.add(position)
            position += header.total_size
        assert starts[0] == 0 and starts == sorted(starts) and set(starts) <= boundaries
        # Each fetch resumes after the last whole batch of ~300 KiB read before it.
        assert all(0 < b - a <= 300 * 1024 for a, b in itertools.pairwise(starts))


class ConnectionCounter:
    """A TCP relay that counts the connections made through it."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = 0

    def serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self._upstream) as upstream:
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join(timeout=30)

    def close(self) -> None:
        # Closing alone does not wake a thread blocked in accept() on Linux;
        # shutting the listener down does (accept fails with EINVAL).
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for sock in (source, sink):  # either side closing ends the whole connection
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@pytest.fixture()
def counter(proxy: RecordingProxy) -> Iterator[ConnectionCounter]:
    # In front of the recording proxy, which keeps connections alive (moto's
    # server closes each one after a response, which would hide any reuse).
    relay = ConnectionCounter(proxy.endpoint)
    thread = threading.Thread(target=relay.serve, daemon=True)
    thread.start()
    yield relay
    relay.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_each_fetch_drops_its_connection(counter: ConnectionCounter, seeded: Seeded) -> None:
    # Like the broker, a fetch drops its stream with the rest of the body unread
    # (rather than draining up to the rest of a large segment to keep the connection).
    report = replay_json("--endpoint", counter.endpoint, "--bucket", seeded.bucket,
                         "--topic", "clicks", "--concurrency", "1")
    assert report["crc_errors"] == 0 and report["bytes"] == seeded.bytes("clicks")
    # The last fetch of a segment reads its body to the end, so aiohttp may pool
    # that connection; every other fetch stops early and must close its own. The
    # listing opens the first connection. (A reader that drained its bodies
    # would get by with one connection.)
    stopped_early = report["fetches"] - report["segments"]
    assert stopped_early == report["segments"] > 0  # ~1.6 MB segments, 1 MiB fetches
    assert counter.accepted == 1 + stopped_early


def test_max_bytes_stops_early(local_s3: LocalS3, seeded: Seeded) -> None:
    report = replay_json("--endpoint", local_s3.endpoint, "--bucket", seeded.bucket,
                         "--concurrency", "1", "--fetch-bytes", "256KiB", "--max-bytes", "1MiB")
    assert 1024 * 1024 <= report["bytes"] < 1024 * 1024 + 256 * 1024 + 70_000
    assert report["partitions"] == 1 and report["crc_errors"] == 0


def test_no_segments_is_a_usage_error(local_s3: LocalS3, bucket: str) -> None:
    result = run_replay("--endpoint", local_s3.endpoint, "--bucket", bucket)
    assert result.returncode == 2
    assert "no Kafka segments" in one_error_line(result) and result.stdout == ""


def test_missing_bucket_is_a_usage_error(local_s3: LocalS3) -> None:
    result = run_replay("--endpoint", local_s3.endpoint, "--bucket", "no-such-bucket-here")
    assert result.returncode == 2
    assert "no such bucket" in one_error_line(result)


def test_unreachable_endpoint(bucket: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_replay("--endpoint", f"http://127.0.0.1:{port}", "--bucket", bucket)
    assert result.returncode == 75  # EX_TEMPFAIL: try again later
    assert "unreachable" in one_error_line(result)


def test_an_endpoint_that_accepts_and_never_answers_ends_after_the_timeout(bucket: str) -> None:
    """The kernel completes the handshake for a listening socket nobody reads:
    replay must give up after --timeout (4 tries), not botocore's 60 s x 4."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        started = time.monotonic()
        result = run_replay("--endpoint", f"http://127.0.0.1:{silent.getsockname()[1]}",
                            "--bucket", bucket, "--timeout", "0.5", timeout=60)
        took = time.monotonic() - started
    assert result.returncode == 75, result.stderr  # EX_TEMPFAIL: try again later
    line = one_error_line(result)
    assert "no answer from the endpoint within 0.5 s (--timeout)" in line, line
    # 4 tries of 0.5 s, botocore's backoff between them (at most 1, 2 and 4 s)
    # and the interpreter's start: far below one default read timeout.
    assert took < 20, f"the replay took {took:.1f} s to give up"


@pytest.mark.parametrize("kind", ["reset_mid_body", "truncate", "truncate_close"])
def test_a_body_cut_short_is_one_line_and_a_retry_later(
        fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
        generated: tuple[SegmentObject, ...], kind: str,
) -> None:
    """An endpoint that drops the connection in the middle of a segment's body, or
    closes it early (a sidecar whose origin failed mid-read does either), is the
    endpoint failing: exit 75 with one line, not a traceback."""
    segment = generated[0]
    origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
    fault_proxy.clear()
    fault_proxy.add(Fault(kind, after_bytes=len(segment.data) // 3), "GET", key=segment.key,
                    times=None)
    try:
        result = run_replay("--endpoint", fault_proxy.endpoint, "--bucket", bucket)
    finally:
        fault_proxy.clear()
    assert result.returncode == 75, result.stderr
    line = one_error_line(result)
    assert segment.key in line and len(line) < 400, line


def _sigint_as_at_a_terminal() -> None:
    """In the replay's process before it runs: SIGINT as a terminal delivers it.
    A suite started in the background of a script inherits SIGINT ignored (POSIX
    shells do that to background jobs), and Python keeps ignoring what it
    started ignoring, as a command-line tool should."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_the_admin_port_holds_the_stats_ends_at_once(
        local_s3: LocalS3, origin_s3: Any, bucket: str, generated: tuple[SegmentObject, ...]
) -> None:
    """An admin port that accepts and never answers (a sidecar stuck, or another
    service on that port): Ctrl-C must not wait for the stats read to time out."""
    origin_s3.put_object(Bucket=bucket, Key=generated[0].key, Body=generated[0].data)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(60)
        replay = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "replay", "--endpoint", local_s3.endpoint,
             "--bucket", bucket, "--admin", f"http://127.0.0.1:{silent.getsockname()[1]}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **CREDENTIALS, "SIDECAR_LOG_LEVEL": "WARNING"},
            preexec_fn=_sigint_as_at_a_terminal)
        try:
            held, _ = silent.accept()  # the replay asks for the stats before it reads
            with held:
                # Its request read whole: the replay is waiting on the answer
                # (a connection alone may not be its own, and is made before
                # the request is sent).
                held.settimeout(30)
                asked = b""
                while b"\r\n\r\n" not in asked:
                    data = held.recv(4096)
                    assert data, f"the replay closed before asking: {asked!r}"
                    asked += data
                assert asked.startswith(b"GET /api/v1/stats "), asked[:200]
                interrupted = time.monotonic()
                replay.send_signal(signal.SIGINT)
                out, err = replay.communicate(timeout=60)
                took = time.monotonic() - interrupted
        finally:
            replay.kill()
            replay.wait()
    assert replay.returncode == 130, err
    assert took < 5, f"the replay took {took:.1f} s to stop after Ctrl-C"
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("name", ["", "tiered/storage", "a" * 256])
def test_a_name_no_bucket_can_have_is_a_usage_error(local_s3: LocalS3, name: str) -> None:
    """Not "endpoint unreachable" with exit 75, which a service manager retries."""
    result = run_replay("--endpoint", local_s3.endpoint, "--bucket", name)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "--bucket" in line and len(line) < 200


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--partitions", "x"], "--partitions"), (["--fetch-bytes", "lots"], "not a size"),
     (["--concurrency", "0"], "--concurrency"),
     (["--from-offset", "9", "--to-offset", "3"], "--to-offset is before --from-offset"),
     (["--from-offset", "1", "--from-time", "0"], "an offset range or a time range"),
     (["--from-time", "yesterday"], "ISO 8601 time with a zone"),
     (["--from-time", "2026-11-01T00:00:00"], "ISO 8601 time with a zone"),
     (["--from-offset", "-1"], "--from-offset must be 0 or more"),
     (["--timeout", "0"], "--timeout must be a positive number of seconds"),
     (["--timeout", "nan"], "--timeout must be a positive number of seconds"),
     (["--progress", "-1"], "--progress must be 0 or more seconds"),
     (["--progress", "nan"], "--progress must be 0 or more seconds"),
     (["--progress", "inf"], "--progress must be 0 or more seconds")],
)
def test_bad_flags(local_s3: LocalS3, bucket: str, flags: list[str], message: str) -> None:
    result = run_replay("--endpoint", local_s3.endpoint, "--bucket", bucket, *flags)
    assert result.returncode == 2
    assert message in one_error_line(result)
