"""What the sidecar's metrics label and count, whatever a client does: a live
sidecar behind the recording proxy, requests over raw sockets, /metrics
scraped. The label values stay a bounded set (each one a client could choose
would be a series that lives as long as the process, in its memory and in
Prometheus's), and every request the origin saw is counted, whoever left."""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy

MiB = 1024 * 1024

# Methods no S3 client sends: ones llhttp (aiohttp's C parser) knows, and
# made-up tokens, which its pure-Python parser (AIOHTTP_NO_EXTENSIONS, or a
# platform without the extension) passes to the handler as they come.
KNOWN_METHODS = ("PROPFIND", "MKCOL", "LOCK", "SEARCH", "PURGE", "REPORT", "OPTIONS")
MADE_UP = tuple(f"X{number:04d}" for number in range(150))


@pytest.fixture(scope="module")
def sidecar(proxy: RecordingProxy, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[SidecarProcess]:
    """Behind the recording proxy (what reached the origin is known), on
    aiohttp's pure-Python HTTP parser, which passes any method token on."""
    cache = tmp_path_factory.mktemp("labels-cache")
    with SidecarProcess(proxy.endpoint, cache, "--block-size", "1MiB",
                        "--cache-size", "16MiB",
                        env={"AIOHTTP_NO_EXTENSIONS": "1"}) as process:
        yield process


def _status(url: str, request: bytes) -> int:
    """Send one raw request on a fresh connection; the answer's status, read
    to its end (the sidecar counts a request before it answers it)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _label_values(sidecar: SidecarProcess, name: str, label: str) -> dict[str, float]:
    """The samples of `name` summed by the value of `label`."""
    with urllib.request.urlopen(sidecar.admin_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels[label]
                values[key] = values.get(key, 0.0) + sample.value
    return values


def test_methods_a_client_chooses_add_no_op_series(sidecar: SidecarProcess) -> None:
    """A request answered before it is classified (here: a header that is not
    UTF-8, refused 400 at once) is counted under one of a fixed few `op`
    values, never under the method it was sent with."""
    before = _label_values(sidecar, "sidecar_requests_total", "op")
    for method in (*KNOWN_METHODS, *MADE_UP):
        request = (f"{method} /bucket/key HTTP/1.1\r\nHost: s\r\nConnection: close\r\n"
                   ).encode() + b"X-Odd: \xff\xfe\r\n\r\n"
        assert _status(sidecar.data_url, request) == 400, method
    after = _label_values(sidecar, "sidecar_requests_total", "op")
    sent = set(KNOWN_METHODS) | set(MADE_UP)
    assert not sent & set(after), sorted(sent & set(after))[:10]
    # Nothing lost: every one of them counted, as Other.
    assert after["Other"] - before.get("Other", 0.0) == len(sent)


def _set_mode(sidecar: SidecarProcess, mode: str) -> None:
    request = urllib.request.Request(
        sidecar.admin_url + "/api/v1/mode", method="PUT",
        data=json.dumps({"mode": mode}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {sidecar.admin_token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_a_bypass_read_the_reader_left_is_an_origin_request(
        sidecar: SidecarProcess, proxy: RecordingProxy, origin_s3: Any) -> None:
    """In bypass mode each reader's bytes come from origin GETs of its own,
    which a Kafka reader leaves after about one fetch (it closes its
    `bytes=pos-` read). Those GETs were sent and answered: every request the
    origin saw is counted, and its duration observed."""
    bucket = "labels-" + secrets.token_hex(4)
    origin_s3.create_bucket(Bucket=bucket)
    origin_s3.put_object(Bucket=bucket, Key="segment.log", Body=os.urandom(8 * MiB))
    _set_mode(sidecar, "bypass")
    try:
        requests = sidecar.metric("sidecar_origin_requests_total", lane="foreground")
        timed = sidecar.metric("sidecar_origin_request_duration_seconds_count",
                               lane="foreground")
        parts = urlsplit(sidecar.data_url)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(f"GET /{bucket}/segment.log HTTP/1.1\r\nHost: s\r\n"
                         "Range: bytes=0-\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            assert head.split(b" ", 2)[1] == b"206"
            # Gone after the first bytes, as RemoteLogManager closes its stream.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sidecar.wait_idle()
        seen = [r for r in proxy.requests if r.path.startswith(f"/{bucket}/")]
        assert any(r.method == "GET" for r in seen)
        assert sidecar.metric("sidecar_origin_requests_total", lane="foreground") \
            == requests + len(seen), seen
        assert sidecar.metric("sidecar_origin_request_duration_seconds_count",
                              lane="foreground") == timed + len(seen)
    finally:
        _set_mode(sidecar, "normal")
