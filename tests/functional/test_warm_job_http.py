"""The warm-up job's HTTP to a real sidecar: redirects are not followed (the admin
token never goes where the plan did not say), and an https:// sidecar (behind a
TLS proxy) is verified against the plan's CA file."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sidecar.tools.local_s3 import LocalS3, loopback_client
from spark_warmup.outcome import summarize
from spark_warmup.progress import WarmProgress, read_stats, stats_reader
from spark_warmup.sidecar_http import poster
from spark_warmup.warming import NodeBatch, PlannedSegment, unanswered, warm_node
from tests.support.certificates import self_signed
from tests.support.fault_proxy import FaultProxy
from tests.support.loopback_http import LoopbackServer, admin_call, relay
from tests.support.private_network import PrivateNetwork
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

TOKEN = "warm-http-token-5s9D"
SIZE = 300 * 1024
SIDECAR_FLAGS = ("--block-size", "256KiB")


@pytest.fixture()
def sidecar(local_s3: LocalS3, tmp_path: Path) -> Iterator[SidecarProcess]:
    with SidecarProcess(local_s3.endpoint, tmp_path, *SIDECAR_FLAGS,
                        env={"SIDECAR_ADMIN_TOKEN": TOKEN}) as process:
        yield process


@pytest.fixture()
def segment(origin_s3: Any, bucket: str) -> PlannedSegment:
    key = "orders-x/0/00000000000000000000-seg.log"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(SIZE))
    return PlannedSegment("orders", 0, key, SIZE, "a")


def batch(url: str, bucket: str, segment: PlannedSegment, ca_file: str | None = None
          ) -> NodeBatch:
    return NodeBatch(node="a", url=url, bucket=bucket, segments=(segment,), ttl_s=60,
                     token=TOKEN, concurrency=1, retries=0, block_size=256 * 1024,
                     ca_file=ca_file)


@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_is_not_followed_and_the_token_stays_home(
    sidecar: SidecarProcess, bucket: str, segment: PlannedSegment, status: int
) -> None:
    seen: list[str | None] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        do_GET = do_POST  # urllib's own handler turns a 302 of a POST into a GET

        def log_message(self, *args: object) -> None:
            pass

    elsewhere = LoopbackServer(Elsewhere)

    class Redirector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            # 307 keeps the method and the body, 302 need not (RFC 9110 section 15.4).
            self.send_response(status)
            self.send_header("Location", elsewhere.endpoint + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    redirector = LoopbackServer(Redirector)
    try:
        [row] = warm_node(batch(redirector.endpoint, bucket, segment))
    finally:
        redirector.stop()
        elsewhere.stop()
    assert seen == []
    assert row.error is not None and f"redirect ({status})" in row.error and row.fetched == 0
    assert sidecar.metric("sidecar_warm_blocks_total") == 0


class TlsProxy:
    """A TLS-terminating relay in front of the sidecar's admin port, on loopback."""

    def __init__(self, upstream: str, cert: Path, key: Path) -> None:
        address = urlsplit(upstream)
        target = (address.hostname or "127.0.0.1", address.port or 80)

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name: value for name, value in self.headers.items()
                           if name.lower() != "host"}
                relay(self, target, headers, body, timeout=60)

            def log_message(self, *args: object) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server = LoopbackServer(Relay, tls=context)
        self.endpoint = self._server.endpoint

    def stop(self) -> None:
        self._server.stop()


def test_an_https_sidecar_is_verified_against_the_plans_ca_file(
    sidecar: SidecarProcess, bucket: str, segment: PlannedSegment, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    proxy = TlsProxy(sidecar.admin_url, cert, key)
    try:
        # Not signed by a CA of the system: refused, nothing sent.
        [refused] = warm_node(batch(proxy.endpoint, bucket, segment))
        assert refused.error is not None and "CERTIFICATE_VERIFY_FAILED" in refused.error
        assert sidecar.metric("sidecar_warm_blocks_total") == 0
        [row] = warm_node(batch(proxy.endpoint, bucket, segment, ca_file=str(cert)))
    finally:
        proxy.stop()
    assert row.error is None, row.error
    assert row.fetched == 2 and row.bytes_fetched == SIZE
    assert sidecar.metric("sidecar_warm_blocks_total", outcome="fetched") == 2


def test_a_missing_ca_file_fails_the_rows_clearly(
    bucket: str, segment: PlannedSegment, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-ca.pem")
    [row] = warm_node(batch("https://127.0.0.1:1", bucket, segment, ca_file=missing))
    assert row.error is not None and row.error.startswith(f"cannot use ca_file {missing}")
    assert row.failed == row.blocks == 2


def test_an_endless_answer_is_cut_and_fails_its_row(segment: PlannedSegment,
                                                      bucket: str) -> None:
    sent: list[int] = []

    class Endless(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # a 200 whose body goes on (a misrouted URL)
            self.send_response(200)
            self.send_header("Content-Length", str(2 ** 40))
            self.end_headers()
            chunk, total = b" " * 65536, 0
            try:
                while total < 256 * 1024 * 1024:
                    self.wfile.write(chunk)
                    total += len(chunk)
            except OSError:
                pass  # the client stopped reading and closed
            sent.append(total)

        def log_message(self, *args: object) -> None:
            pass

    server = LoopbackServer(Endless)
    try:
        [row] = warm_node(batch(server.endpoint, bucket, segment))
        # The client closes after about a MiB: the server's writes fail long
        # before it has sent all it would.
        eventually(lambda: sent or None, "the server's answer ended")
    finally:
        server.stop()
    assert row.error is not None and "not the warm API's answer" in row.error
    assert sent[0] < 64 * 1024 * 1024


def put_segments(origin_s3: Any, bucket: str, count: int) -> tuple[PlannedSegment, ...]:
    planned = []
    for i in range(count):
        key = f"orders-x/0/{i * 1000:020d}-seg.log"
        origin_s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(SIZE))
        planned.append(PlannedSegment("orders", 0, key, SIZE, "a"))
    return tuple(planned)


def calls_seen(sidecar: SidecarProcess) -> int:
    """Warm calls the sidecar has answered (its stats keep the last 20)."""
    calls = sidecar.stats()["warm_calls"]
    assert isinstance(calls, list)
    return len(calls)


def test_a_sidecar_whose_mode_pauses_warm_up_fails_its_rows_naming_the_mode(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    planned = put_segments(origin_s3, bucket, 3)
    work = replace(batch(sidecar.admin_url, bucket, planned[0]), segments=planned, retries=3)
    for answered, mode in enumerate(("cache-only", "bypass"), start=1):
        status, _ = admin_call(sidecar.admin_url, "PUT", "/api/v1/mode", {"mode": mode}, TOKEN)
        assert status == 200
        sleeps: list[float] = []
        rows = warm_node(work, sleep=sleeps.append)
        # One call reached it: not retried, and none sent after its answer.
        assert calls_seen(sidecar) == answered and sleeps == []
        assert [row.error.split(" (", 1)[0] if row.error else None for row in rows] == \
            [f"sidecar a is in {mode} mode, which pauses warm-up"] * 3
        assert not any("unreachable" in (row.error or "") or "taken as down" in (row.error or "")
                       for row in rows)
        # The summary adds up: every planned byte failed, none warmed.
        summary = summarize(rows, 1.0)
        assert (summary.segments, summary.failed_segments) == (3, 3)
        assert summary.failed_bytes == summary.planned_bytes == 3 * SIZE
        assert summary.warmed_bytes == 0 and all(row.failed == row.blocks == 2 for row in rows)
    assert sidecar.metric("sidecar_origin_bytes_total", lane="warm") == 0
    # It was the mode: back to normal, the same calls warm.
    status, _ = admin_call(sidecar.admin_url, "PUT", "/api/v1/mode", {"mode": "normal"}, TOKEN)
    assert status == 200
    rows = warm_node(work)
    assert all(row.ok and row.fetched == 2 for row in rows), rows


def test_an_unavailable_origin_is_retried_and_reported_as_the_origins(
    fault_proxy: FaultProxy, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    planned = put_segments(origin_s3, bucket, 4)
    sleeps: list[float] = []
    with SidecarProcess(fault_proxy.endpoint, tmp_path, *SIDECAR_FLAGS,
                        env={"SIDECAR_ADMIN_TOKEN": TOKEN}) as process:
        fault_proxy.down = "503"
        try:
            work = replace(batch(process.admin_url, bucket, planned[0]), segments=planned,
                           retries=1)
            rows = warm_node(work, sleep=sleeps.append)
            # Two segments, each tried twice; then the node is given up.
            assert calls_seen(process) == 4
        finally:
            fault_proxy.clear()
    assert sleeps == [0.25, 0.25]
    assert all((row.error or "").startswith("sidecar a answered 503: origin unavailable")
               for row in rows), rows
    assert all("no more calls to it this run" in (row.error or "") for row in rows[2:])
    assert not any("unreachable" in (row.error or "") or "taken as down" in (row.error or "")
                   or "mode" in (row.error or "") for row in rows)


def test_a_key_the_sidecar_refuses_fails_its_row_with_the_sidecars_message(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    missing = PlannedSegment("orders", 0, "orders-x/0/00000000000000000000-gone.log", SIZE, "a")
    present = put_segments(origin_s3, bucket, 1)
    sleeps: list[float] = []
    work = replace(batch(sidecar.admin_url, bucket, missing), segments=(missing, *present),
                   retries=3)
    rows = warm_node(work, sleep=sleeps.append)
    assert rows[0].error == f"sidecar a answered 400: no such key: s3://{bucket}/{missing.key}"
    assert rows[1].ok and rows[1].fetched == 2
    assert sleeps == [] and calls_seen(sidecar) == 2


def test_progress_reads_an_off_loopback_sidecars_stats_with_the_token(tmp_path: Path) -> None:
    """Off loopback (0.0.0.0, as in a pod) the stats page needs the admin token:
    the progress line reads it as the warm calls go, with the plan's token."""
    cache = tmp_path / "cache"
    cache.mkdir()
    # A network namespace of its own, with its own S3 server: nothing outside
    # the test reaches the sidecar bound to 0.0.0.0.
    with PrivateNetwork() as network, LocalS3(network.prefix) as origin, SidecarProcess(
            origin.endpoint, cache, *SIDECAR_FLAGS, "--admin-listen", "0.0.0.0:0",
            env={"SIDECAR_ADMIN_TOKEN": TOKEN},
            program=(*network.prefix, sys.executable, "-m", "sidecar")) as sidecar:
        url = sidecar.admin_url.replace("0.0.0.0", "127.0.0.1")

        def warm_with_progress() -> tuple[str, str]:
            client = loopback_client(origin.endpoint)
            client.create_bucket(Bucket="tiered")
            [segment] = put_segments(client, "tiered", 1)
            progress = {
                name: WarmProgress({"a": url}, 2, 256 * 1024, io.StringIO(), 10, read=read)
                for name, read in (("token", stats_reader(TOKEN)), ("none", read_stats))}
            [row] = warm_node(batch(url, "tiered", segment))
            assert row.ok and row.fetched == 2, row
            return progress["token"].line(), progress["none"].line()

        with_token, without = network.run(warm_with_progress)
    assert with_token.startswith("warm-up: 512.0 KiB of 512.0 KiB (100%), ")
    assert "not answering" not in with_token
    # Without the token the page answers 401: the sidecar is left out of the line.
    assert without.startswith("warm-up: 0 B of 512.0 KiB (0%)")
    assert without.endswith("; 1 of 1 sidecars not answering")



class NotHttp:
    """A TCP server on loopback that answers every connection with `reply` and
    hangs up: a TLS port called with http:// (its alert record), another
    service (its banner)."""

    def __init__(self, reply: bytes) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._reply = reply
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # stopped
            with connection:
                connection.settimeout(10)
                try:
                    connection.recv(65536)
                    connection.sendall(self._reply)
                    # Read on until the client hangs up: closing with its body
                    # unread would reset the connection before it reads the reply.
                    connection.shutdown(socket.SHUT_WR)
                    while connection.recv(65536):
                        pass
                except OSError:
                    pass

    def stop(self) -> None:
        self._socket.close()
        self._thread.join(timeout=10)


@pytest.mark.parametrize("reply", [b"\x15\x03\x03\x00\x02\x02\x46", b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_a_sidecar_url_that_answers_no_http_fails_its_rows_not_the_job(
        reply: bytes, segment: PlannedSegment, bucket: str) -> None:
    server = NotHttp(reply)
    try:
        rows = warm_node(replace(batch(server.endpoint, bucket, segment),
                                 segments=(segment, segment, segment)))
        problem = unanswered("a", server.endpoint)
        progress = WarmProgress({"a": server.endpoint}, 2, 256 * 1024, io.StringIO(), 10,
                                read=stats_reader(TOKEN))
        line = progress.line()
    finally:
        server.stop()
    assert all(row.error is not None and "no HTTP answer" in row.error for row in rows)
    # Taken as down after two: the third row fails at once with the same reason.
    assert "node taken as down" in (rows[2].error or "")
    assert problem is not None and problem.startswith(
        f"sidecar a at {server.endpoint} unreachable: no HTTP answer")
    assert line.endswith("; 1 of 1 sidecars not answering")


class SilentSidecar:
    """A stand-in for a hung sidecar (the real one cannot be made to hang on
    cue): it accepts each connection on 127.0.0.1, reads the request's head,
    notes its first line, and answers nothing until it stops. `healthy`: it
    answers every GET (/healthz, /readyz) as a live sidecar in normal mode
    does, and only the warm POST gets nothing (a wedged warm-up)."""

    def __init__(self, healthy: bool = False) -> None:
        self._healthy = healthy
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests: list[str] = []
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> SilentSidecar:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for held in self._held:
            held.close()
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            connection.settimeout(5)
            head = b""
            try:
                while b"\r\n" not in head and len(head) < 65536:
                    data = connection.recv(4096)
                    if not data:
                        break
                    head += data
            except OSError:
                pass
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            self.requests.append(line)
            if self._healthy and line.startswith("GET "):
                answer = b'{"status": "ok", "mode": "normal"}'
                with contextlib.suppress(OSError), connection:
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                       % (len(answer), answer))
                continue
            self._held.append(connection)


def three_segments() -> tuple[PlannedSegment, ...]:
    return tuple(PlannedSegment("orders", 0, f"orders-x/0/{i * 1000:020d}-seg.log", SIZE, "a")
                 for i in range(3))


def half_second_calls() -> Callable[[str, bytes, Mapping[str, str], float],
                                    tuple[int, bytes]]:
    """The job's real poster, each call's timeout 0.5 s (the call's own: minutes
    for a segment)."""
    real_post = poster(None)

    def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float
             ) -> tuple[int, bytes]:
        return real_post(url, body, headers, 0.5)

    return post


def test_a_sidecar_that_answers_nothing_is_given_up_after_one_call(bucket: str) -> None:
    """A hung sidecar held the warm-up for every retry's whole call timeout, on
    two segments before the node was given up: its /healthz is asked after the
    first timeout, and a node that answers that nothing either gets no more calls."""
    planned = three_segments()
    post = half_second_calls()
    sleeps: list[float] = []
    with SilentSidecar() as silent:
        work = replace(batch(silent.url, bucket, planned[0]), segments=planned, retries=3)
        rows = warm_node(work, post=post, sleep=sleeps.append)
        seen = list(silent.requests)
    assert [line.split(" ")[:2] for line in seen] == [["POST", "/api/v1/warm"],
                                                      ["GET", "/healthz"]]
    assert sleeps == []
    assert all((row.error or "").startswith("sidecar a did not answer the warm call in ")
               and "s, nor then its health check (sidecar a at " in (row.error or "")
               for row in rows), rows
    assert all("no more calls to it this run" in (row.error or "") for row in rows[1:])
    assert all(row.failed == row.blocks == 2 for row in rows)


def test_a_sidecar_whose_warm_up_is_stuck_gets_one_more_try_then_no_more_calls(
        bucket: str) -> None:
    """A live sidecar (its /healthz answers) whose warm calls answer nothing held
    the warm-up for every retry's whole call timeout, on two segments before the
    node was given up: after one more try that times out too, its remaining
    segments are reported not warmed, saying why."""
    planned = three_segments()
    post = half_second_calls()
    sleeps: list[float] = []
    with SilentSidecar(healthy=True) as wedged:
        work = replace(batch(wedged.url, bucket, planned[0]), segments=planned, retries=3)
        rows = warm_node(work, post=post, sleep=sleeps.append)
        seen = list(wedged.requests)
    asked = [line.split(" ")[:2] for line in seen]
    assert asked == [["POST", "/api/v1/warm"], ["GET", "/healthz"], ["GET", "/readyz"]] * 2
    assert len(sleeps) == 1  # the backoff before the one more try
    stuck = "sidecar a answers its health check but did not answer the warm call in "
    assert all((row.error or "").startswith(stuck) and "2 times: its warm-up is stuck"
               in (row.error or "") for row in rows), rows
    assert all("no more calls to it this run" in (row.error or "") for row in rows[1:])
    assert all(row.failed == row.blocks == 2 for row in rows)


def test_a_warm_call_that_times_out_on_a_live_sidecar_without_retries_says_so(
        bucket: str) -> None:
    """With retries = 0, a warm call that timed out on a node that then answered
    its health check failed its row as "sidecar a unreachable: timed out",
    sending the operator after a network fault the node does not have."""
    planned = PlannedSegment("orders", 0, "orders-x/0/00000000000000000000-seg.log", SIZE, "a")
    post = half_second_calls()
    sleeps: list[float] = []
    with SilentSidecar(healthy=True) as wedged:
        rows = warm_node(batch(wedged.url, bucket, planned), post=post, sleep=sleeps.append)
        seen = list(wedged.requests)
    asked = [line.split(" ")[:2] for line in seen]
    assert asked == [["POST", "/api/v1/warm"], ["GET", "/healthz"], ["GET", "/readyz"]]
    assert sleeps == []
    [row] = rows
    assert (row.error or "").startswith(
        "sidecar a answers its health check but did not answer the warm call in "), row
    assert "unreachable" not in (row.error or "") and "taken as down" not in (row.error or "")
    assert row.failed == row.blocks == 2
