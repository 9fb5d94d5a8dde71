"""Pass-through limits on a running sidecar: a client that trickles uploads holds
no more than its share of the origin connections, waits for one no longer than
passthrough_acquire_timeout, and holds one no longer than passthrough_timeout."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

AKID, SECRET = CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
BODY = b"0123456789" * 10


def signed_put(data_url: str, path: str) -> bytes:
    """The head of a signed PUT of BODY (UNSIGNED-PAYLOAD, as the SDKs send over
    TLS), ready to be written to a socket before the body."""
    request = AWSRequest(method="PUT", url=data_url + path, data=b"",
                         headers={"Content-Length": str(len(BODY))})
    signer = S3SigV4Auth(Credentials(AKID, SECRET), "s3", "us-east-1")
    signer.payload = lambda request: "UNSIGNED-PAYLOAD"  # type: ignore[method-assign]
    signer.add_auth(request)
    host = urllib.parse.urlsplit(data_url).netloc
    lines = [f"PUT {path} HTTP/1.1", f"Host: {host}",
             *(f"{name}: {value}" for name, value in request.headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@contextmanager
def trickling_upload(data_url: str, path: str) -> Iterator[socket.socket]:
    """A signed PUT whose body has begun but does not end: it holds a pass-through
    (and an origin connection) until the socket closes."""
    address = urllib.parse.urlsplit(data_url)
    connection = socket.create_connection((address.hostname, address.port), timeout=30)
    try:
        connection.sendall(signed_put(data_url, path) + BODY[:1])
        yield connection
    finally:
        connection.close()


def put(data_url: str, path: str) -> tuple[int, bytes]:
    address = urllib.parse.urlsplit(data_url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(signed_put(data_url, path) + BODY)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def test_a_client_holds_no_more_than_its_share_and_waits_no_longer(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    env = {"SIDECAR_PASSTHROUGH_PER_CLIENT": "2", "SIDECAR_PASSTHROUGH_ACQUIRE_TIMEOUT": "1s",
           "SIDECAR_ORIGIN_MAX_CONNECTIONS": "6", "SIDECAR_PREFETCH_MAX_IN_FLIGHT": "1",
           "SIDECAR_WARM_CONCURRENCY": "1"}
    with SidecarProcess(local_s3.endpoint, tmp_path, env=env) as sidecar, ExitStack() as held:
        for n in range(2):
            held.enter_context(trickling_upload(sidecar.data_url, f"/{bucket}/held-{n}"))
        # The third from the same address: SlowDown at once, the origin never asked.
        eventually(lambda: put(sidecar.data_url, f"/{bucket}/third")[0] == 503 or None,
                   "the third upload to be refused")
        status, answer = put(sidecar.data_url, f"/{bucket}/third")
        assert status == 503 and b"<Code>SlowDown</Code>" in answer
        assert "third" not in {o["Key"] for o in
                               origin_s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
        held.close()
        # Once they are gone, the client's share is back.
        eventually(lambda: put(sidecar.data_url, f"/{bucket}/fourth")[0] == 200 or None,
                   "an upload to go through again")
        assert origin_s3.get_object(Bucket=bucket, Key="fourth")["Body"].read() == BODY


def test_no_free_origin_connection_is_slow_down_after_the_acquire_timeout(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    env = {"SIDECAR_PASSTHROUGH_PER_CLIENT": "100", "SIDECAR_PASSTHROUGH_ACQUIRE_TIMEOUT": "1s",
           "SIDECAR_ORIGIN_MAX_CONNECTIONS": "6", "SIDECAR_PREFETCH_MAX_IN_FLIGHT": "1",
           "SIDECAR_WARM_CONCURRENCY": "1"}
    with SidecarProcess(local_s3.endpoint, tmp_path, env=env) as sidecar, ExitStack() as held:
        for n in range(6):
            held.enter_context(trickling_upload(sidecar.data_url, f"/{bucket}/held-{n}"))

        def refused_after_waiting() -> float | None:
            started = time.monotonic()
            status, answer = put(sidecar.data_url, f"/{bucket}/seventh")
            waited = time.monotonic() - started
            return waited if status == 503 and b"SlowDown" in answer else None

        waited = eventually(refused_after_waiting, "the seventh upload to wait and be refused")
        assert 1.0 <= waited < 10, waited


def test_a_trickling_upload_is_cut_off_after_the_passthrough_timeout(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    env = {"SIDECAR_PASSTHROUGH_TIMEOUT": "2s", "SIDECAR_CLIENT_TIMEOUT": "30s"}
    with SidecarProcess(local_s3.endpoint, tmp_path, env=env) as sidecar, \
            trickling_upload(sidecar.data_url, f"/{bucket}/trickle") as upload:
        started = time.monotonic()
        # A byte a quarter second: well within client_timeout each time.
        answer = b""
        upload.settimeout(0.25)
        for byte in BODY[1:]:
            try:
                upload.sendall(bytes([byte]))
            except OSError:  # the sidecar answered and closed: read what it said
                upload.settimeout(5)
            try:
                answer += upload.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 400") and b"RequestTimeout" in answer, answer[:300]
        assert 2 <= took < 15, took
    assert "trickle" not in {o["Key"] for o in
                             origin_s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
