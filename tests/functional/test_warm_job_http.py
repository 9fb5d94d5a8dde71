"""The warm-up job's HTTP to a real sidecar: redirects are not followed (the admin
token never goes where the plan did not say), and an https:// sidecar (behind a
TLS proxy) is verified against the plan's CA file."""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sidecar.tools.local_s3 import LocalS3
from spark_warmup.warming import NodeBatch, PlannedSegment, warm_node
from tests.support.certificates import self_signed
from tests.support.loopback_http import LoopbackServer, relay
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

TOKEN = "warm-http-token-5s9D"
SIZE = 300 * 1024


@pytest.fixture()
def sidecar(local_s3: LocalS3, tmp_path: Path) -> Iterator[SidecarProcess]:
    with SidecarProcess(local_s3.endpoint, tmp_path, "--block-size", "256KiB",
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
