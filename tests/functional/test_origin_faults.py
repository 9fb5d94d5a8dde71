"""Fault injection: the sidecar in front of a misbehaving origin (tests/support/fault_proxy).

For every fault the client gets the exact bytes or a correct S3 error, in
bounded time, and no wrong block is cached: once the origin is healed, every
byte read back (from the cache) is checked. The outcome of each fault is
written to test-artifacts/reliability/faults.json for RELIABILITY.md.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry

from sidecar.config import load_config
from sidecar.errors import ObjectNotFound, OriginUnavailable
from sidecar.origin.client import Origin
from sidecar.telemetry.metrics import Metrics
from tests.functional.test_passthrough import signed
from tests.support.clock import FakeClock
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.processes import SidecarProcess
from tests.support.s3_clients import s3_client
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = ROOT / "test-artifacts" / "reliability" / "faults.json"
BLOCK = 64 * 1024
SIZE = 5 * BLOCK + 1234  # six blocks, the last one short
RANGE = (1000, 4 * BLOCK - 100)  # inclusive; blocks 0-3, one coalesced origin GET
DEADLINE_S = 2.5
MARGIN_S = 5.0  # scheduling slack on a shared 2-core machine; the bound stays finite
FAULT_ENV = {
    "SIDECAR_PREFETCH": "false",
    "SIDECAR_ORIGIN_DEADLINE": f"{DEADLINE_S}s",
    "SIDECAR_ORIGIN_CONNECT_TIMEOUT": "1s",
    "SIDECAR_ORIGIN_RETRIES": "4",
}

RESULTS: dict[str, dict[str, Any]] = {}

pytestmark = pytest.mark.functional


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    aborted: bool  # the connection was cut before the promised body was complete
    seconds: float

    @property
    def code(self) -> str:
        text = self.body.decode(errors="replace")
        return text.partition("<Code>")[2].partition("</Code>")[0]


def fetch(base: str, bucket: str, key: str, byte_range: str | None = None,
          method: str = "GET") -> Answer:
    """One request on a fresh connection, with no retries: what the sidecar said."""
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    started = time.monotonic()
    try:
        connection.request(method, f"/{bucket}/{key}",
                           headers={"Range": byte_range} if byte_range else {})
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        try:
            body, aborted = response.read(), False
        except http.client.IncompleteRead as exc:
            body, aborted = exc.partial, True
        except (ConnectionResetError, http.client.HTTPException):
            body, aborted = b"", True
        return Answer(response.status, headers, body, aborted, time.monotonic() - started)
    finally:
        connection.close()


@pytest.fixture(scope="module")
def summary() -> Iterator[dict[str, dict[str, Any]]]:
    yield RESULTS
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(
        {"deadline_s": DEADLINE_S, "block_size": BLOCK, "faults_tried": len(RESULTS),
         "bytes_checked": sum(result["bytes_checked"] for result in RESULTS.values()),
         "faults": RESULTS}, indent=2, sort_keys=True,
    ) + "\n")


@pytest.fixture(scope="module")
def faulty(fault_proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[SidecarProcess]:
    """64 KiB blocks, a 2.5 s deadline, no breaker (each fault is met on its own)."""
    cache = tmp_path_factory.mktemp("fault-cache")
    with SidecarProcess(
        fault_proxy.endpoint, cache, "--block-size", "64KiB",
        "--cache-size", str(256 * (BLOCK + 4096)),
        env={**FAULT_ENV, "SIDECAR_ORIGIN_BREAKER_FAILURES": "0"},
    ) as process:
        yield process


def put(origin_s3: Any, bucket: str, key: str, seed: int) -> tuple[bytes, str]:
    data = random.Random(seed).randbytes(SIZE)
    etag = origin_s3.put_object(Bucket=bucket, Key=key, Body=data)["ETag"]
    return data, str(etag)


def check_healed(sidecar: SidecarProcess, bucket: str, key: str, data: bytes) -> int:
    """Read everything twice after the faults are gone: the second time all from
    the cache. Every byte is compared; returns how many were."""
    first, second = (fetch(sidecar.data_url, bucket, key) for _ in range(2))
    for answer in (first, second):
        assert (answer.status, answer.aborted) == (200, False)
        assert answer.body == data, "a wrong byte was served after the origin healed"
    assert second.headers["x-sidecar-cache"] == "hit"
    start, end = RANGE
    ranged = fetch(sidecar.data_url, bucket, key, f"bytes={start}-{end}")
    assert ranged.status == 206 and ranged.body == data[start:end + 1]
    assert ranged.headers["x-sidecar-cache"] == "hit"
    return 2 * len(data) + len(ranged.body)


@dataclass(frozen=True)
class Case:
    name: str
    faults: tuple[tuple[Fault, str, int | None], ...]  # (fault, method, times)
    expect: str  # "exact", or the S3 error code of a 503
    min_origin_gets: int = 1
    notes: str = ""
    range: tuple[int, int] = RANGE


def _once(fault: Fault, method: str = "GET") -> tuple[Fault, str, int | None]:
    return fault, method, 1


def _always(fault: Fault, method: str = "GET") -> tuple[Fault, str, int | None]:
    return fault, method, None


# Bytes into a GET of the coalesced fetch of blocks 0-3, which is read in up to
# four GETs of a block each (sidecar.engine.FOREGROUND_PARTS): inside the first.
MID = 40_000
CASES = (
    Case("status_500_once", (_once(Fault("status", 500, "InternalError")),), "exact", 2),
    Case("slowdown_twice", ((Fault("status", 503, "SlowDown"), "GET", 2),), "exact", 3),
    Case("head_503_once", (_once(Fault("status", 503, "ServiceUnavailable"), "HEAD"),),
         "exact"),
    Case("reset_before_body", (_once(Fault("reset_before_body")),), "exact", 2),
    Case("reset_mid_body", (_once(Fault("reset_mid_body", after_bytes=MID)),), "exact", 2),
    Case("stall_mid_body", (_once(Fault("stall_mid_body", after_bytes=MID, seconds=10)),),
         "exact", 2, "no byte for half the deadline: resumed"),
    Case("stall_every_body", (_always(Fault("stall_mid_body", after_bytes=MID, seconds=10)),),
         "exact", 3, "each attempt makes progress: resumed until complete"),
    Case("truncated_content_length", (_once(Fault("truncate", after_bytes=MID)),), "exact", 2,
         "Content-Length promises the range, the body ends early with a clean close"),
    Case("truncated_connection_close", (_once(Fault("truncate_close", after_bytes=MID)),),
         "exact", 2, "no Content-Length, Connection: close, fewer bytes"),
    Case("overlong_content_length", (_once(Fault("overlong", extra=1000)),), "exact", 2),
    Case("overlong_connection_close", (_once(Fault("overlong_close", extra=1000)),), "exact", 2,
         "no Content-Length: caught at the end of the body, before the last block is cached"),
    Case("whole_object_for_a_range", (_once(Fault("ignore_range")),), "exact", 2,
         "a 200 with the whole object: its bytes would land at the wrong offsets",
         range=(2 * BLOCK + 5, 4 * BLOCK - 1)),
    Case("latency_spike", (_once(Fault("latency", seconds=0.8)),), "exact"),
    Case("xml_error_with_200", (_once(Fault("status", 200, "InternalError")),), "exact", 2,
         "an error document with status 200: not the range asked, so retried"),
    Case("unasked_412", (_once(Fault("status", 412, "PreconditionFailed")),), "exact", 2,
         "read afresh from a new HEAD, never spliced"),
    Case("unasked_304", (_once(Fault("status", 304, "NotModified")),), "exact", 2),
    Case("status_500_always", (_always(Fault("status", 500, "InternalError")),),
         "ServiceUnavailable", 2),
    Case("slowdown_always", (_always(Fault("status", 503, "SlowDown")),), "SlowDown", 2),
    Case("reset_always", (_always(Fault("reset_before_body")),), "ServiceUnavailable", 2),
    Case("stall_before_body_always", (_always(Fault("stall_mid_body", seconds=10)),),
         "ServiceUnavailable", 2, "headers, then no byte: no progress until the deadline"),
    Case("latency_beyond_deadline", (_always(Fault("latency", seconds=10)),),
         "ServiceUnavailable", 1),
    Case("truncated_always", (_always(Fault("truncate", after_bytes=0)),),
         "ServiceUnavailable", 2),
    Case("overlong_always", (_always(Fault("overlong", extra=1)),), "ServiceUnavailable", 2),
)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fault(case: Case, faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any,
               bucket: str, summary: dict[str, dict[str, Any]]) -> None:
    key = f"seg/{case.name}.log"
    data, _ = put(origin_s3, bucket, key, seed=len(case.name))
    for fault, method, times in case.faults:
        fault_proxy.add(fault, method, key, times)
    start, end = case.range
    try:
        answer = fetch(faulty.data_url, bucket, key, f"bytes={start}-{end}")
    finally:
        fault_proxy.clear()
    gets = len(fault_proxy.requests("GET", key))
    assert answer.seconds < DEADLINE_S + MARGIN_S
    if case.expect == "exact":
        assert (answer.status, answer.aborted) == (206, False)
        assert answer.body == data[start:end + 1]
        outcome = "exact bytes"
    elif answer.status == 503:
        assert answer.code == case.expect and answer.headers.get("retry-after") == "1"
        outcome = f"503 {answer.code}"
    else:
        # The first bytes were already on their way: the sidecar had sent its
        # headers, so it must cut the connection, never end the body short.
        assert answer.status == 206 and answer.aborted, (answer.status, answer.body[:200])
        assert data[start:end + 1].startswith(answer.body)
        outcome = "connection aborted after a correct prefix"
    assert gets >= case.min_origin_gets
    checked = check_healed(faulty, bucket, key, data)
    summary[case.name] = {
        "outcome": outcome, "seconds": round(answer.seconds, 3), "origin_gets": gets,
        "bytes_checked": checked + len(answer.body) * (outcome == "exact bytes"),
        "notes": case.notes,
    }


def test_a_501_is_not_tried_again(
    faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
) -> None:
    # S3's 501 NotImplemented says the request uses something the origin does
    # not implement: every attempt is answered alike, so it is not retried (as
    # botocore retries only 500, 502, 503 and 504 of the 5xx).
    key = "seg/not-implemented.log"
    data, _ = put(origin_s3, bucket, key, seed=501)
    fault_proxy.add(Fault("status", 501, "NotImplemented"), "GET", key, times=None)
    start, end = RANGE
    try:
        answer = fetch(faulty.data_url, bucket, key, f"bytes={start}-{end}")
        gets = len(fault_proxy.requests("GET", key))
    finally:
        fault_proxy.clear()
    assert answer.status == 503 and answer.code == "ServiceUnavailable"
    # One GET per part of the coalesced fetch that was sent, none twice.
    ranges = [seen.range for seen in fault_proxy.requests("GET", key)]
    assert gets >= 1 and len(ranges) == len(set(ranges)), ranges
    check_healed(faulty, bucket, key, data)


def test_etag_flip_between_head_and_get(
    faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
    summary: dict[str, dict[str, Any]],
) -> None:
    """The object is rewritten after the sidecar's HEAD: its GET (If-Match) gets 412,
    and the request is answered afresh from the new version."""
    key = "seg/flip.log"
    old, old_etag = put(origin_s3, bucket, key, seed=1)
    assert fetch(faulty.data_url, bucket, key, method="HEAD").headers["etag"] == old_etag
    new: list[bytes] = []

    def rewrite() -> None:
        new.append(put(origin_s3, bucket, key, seed=2)[0])

    fault_proxy.add(Fault("pass"), "GET", key, 1, before=rewrite)
    answer = fetch(faulty.data_url, bucket, key, "bytes=0-")
    fault_proxy.clear()
    assert (answer.status, answer.aborted) == (206, False)
    assert answer.body == new[0] and answer.body != old
    assert answer.headers["etag"] != old_etag
    if_matches = [seen.if_match for seen in fault_proxy.requests("GET", key)]
    assert if_matches[0] == old_etag and answer.headers["etag"] in if_matches[1:]
    checked = check_healed(faulty, bucket, key, new[0])
    summary["etag_flip_between_head_and_get"] = {
        "outcome": "new version only (412, HEAD again, answered afresh)",
        "seconds": round(answer.seconds, 3), "bytes_checked": checked + len(answer.body),
    }


def test_etag_flip_at_an_origin_that_ignores_if_match(
    faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
    summary: dict[str, dict[str, Any]],
) -> None:
    """Some S3 clones ignore If-Match: the GET's own ETag gives the rewrite away."""
    key = "seg/flip-no-if-match.log"
    _, old_etag = put(origin_s3, bucket, key, seed=3)
    assert fetch(faulty.data_url, bucket, key, method="HEAD").status == 200
    new: list[bytes] = []
    fault_proxy.add(Fault("ignore_if_match"), "GET", key, 1,
                    before=lambda: new.append(put(origin_s3, bucket, key, seed=4)[0]))
    start, end = RANGE
    answer = fetch(faulty.data_url, bucket, key, f"bytes={start}-{end}")
    fault_proxy.clear()
    assert (answer.status, answer.aborted) == (206, False)
    assert answer.body == new[0][start:end + 1] and answer.headers["etag"] != old_etag
    checked = check_healed(faulty, bucket, key, new[0])
    summary["etag_flip_if_match_ignored"] = {
        "outcome": "new version only (GET's ETag checked)",
        "seconds": round(answer.seconds, 3), "bytes_checked": checked + len(answer.body),
    }


def test_etag_flip_mid_stream_aborts_the_response(
    faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
    summary: dict[str, dict[str, Any]],
) -> None:
    """An open-ended read is fetched a block at a time as the client reads; the
    object is rewritten before its second block: the response already carries
    the old version's headers and first block, so the connection is cut."""
    key = "seg/flip-mid-stream.log"
    old, _ = put(origin_s3, bucket, key, seed=5)
    new: list[bytes] = []
    fault_proxy.add(Fault("pass"), "GET", key, 1)  # block 0 as it is
    fault_proxy.add(Fault("pass"), "GET", key, 1,
                    before=lambda: new.append(put(origin_s3, bucket, key, seed=6)[0]))
    answer = fetch(faulty.data_url, bucket, key, "bytes=0-")
    fault_proxy.clear()
    assert answer.status == 206 and answer.aborted
    assert len(answer.body) >= BLOCK and old.startswith(answer.body)
    # The 206 went out: the cut is counted as the origin's doing.
    assert faulty.metric("sidecar_client_cutoffs_total", reason="origin") >= 1
    checked = check_healed(faulty, bucket, key, new[0])
    summary["etag_flip_mid_stream"] = {
        "outcome": f"connection aborted after {len(answer.body)} bytes, all of the old version",
        "seconds": round(answer.seconds, 3), "bytes_checked": checked + len(answer.body),
    }


def test_a_client_that_leaves_while_its_write_is_at_the_origin_is_no_origin_failure(
    faulty: SidecarProcess, fault_proxy: FaultProxy, bucket: str,
) -> None:
    """The origin answers a PUT after its client hung up: counted as a client
    that left (499), not as a 503 (which says max_requests, max_buffered or
    an origin that cannot be reached)."""
    key = "seg/left.bin"
    before = {code: faulty.metric("sidecar_requests_total", op="PutObject", code=code)
              for code in ("499", "503")}
    fault_proxy.add(Fault("latency", seconds=1.0), "PUT", key, 1)
    headers = signed(faulty.data_url, "PUT", f"/{bucket}/{key}", {"Content-Length": "5"})
    address = urlsplit(faulty.data_url)
    try:
        with socket.create_connection((address.hostname, address.port)) as connection:
            connection.sendall((f"PUT /{bucket}/{key} HTTP/1.1\r\nHost: {address.netloc}\r\n"
                                + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                                + "\r\nhello").encode())
            eventually(lambda: len(fault_proxy.requests("PUT", key)) == 1, "the PUT at the origin",
                       timeout=10, interval=0.02)
        eventually(lambda: faulty.metric("sidecar_requests_total", op="PutObject", code="499")
                   == before["499"] + 1, "the request counted as the client's", timeout=10)
    finally:
        fault_proxy.clear()
    assert faulty.metric("sidecar_requests_total", op="PutObject", code="503") == before["503"]


@pytest.mark.parametrize("kind", ["truncate", "reset_mid_body"])
def test_a_pass_through_answer_the_origin_cuts_is_cut_for_the_client_too(
    faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str, kind: str,
) -> None:
    """A GET with partNumber is passed through, its answer streamed as it comes:
    when the origin's body ends short of its Content-Length, the client's
    connection is cut too, never ended as if the body were whole."""
    key = f"seg/pass-{kind}.log"
    data, _ = put(origin_s3, bucket, key, seed=9)
    fault_proxy.add(Fault(kind, after_bytes=MID), "GET", key, 1)
    try:
        answer = fetch(faulty.data_url, bucket, f"{key}?partNumber=1")
    finally:
        fault_proxy.clear()
    assert answer.status == 206 and answer.headers["content-length"] == str(SIZE)
    assert answer.aborted and data.startswith(answer.body) and len(answer.body) < SIZE


@pytest.fixture(scope="module")
def relaying(fault_proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[SidecarProcess, Path]]:
    """A sidecar whose clients and origin are given up on soon (client_timeout
    1s, origin_read_timeout 2s), with an access log: (sidecar, log path)."""
    where = tmp_path_factory.mktemp("relaying")
    access_log = where / "access.jsonl"
    (where / "cache").mkdir()
    with SidecarProcess(
        fault_proxy.endpoint, where / "cache", "--block-size", "64KiB",
        "--cache-size", str(64 * (BLOCK + 4096)),
        env={**FAULT_ENV, "SIDECAR_CLIENT_TIMEOUT": "1s", "SIDECAR_ORIGIN_READ_TIMEOUT": "2s",
             "SIDECAR_ACCESS_LOG": str(access_log)},
    ) as process:
        yield process, access_log


def _access_line(access_log: Path, request_id: str) -> dict[str, Any]:
    """The access log line of `request_id`, once the writer thread wrote it."""
    def line() -> dict[str, Any] | None:
        if not access_log.exists():
            return None
        for text in access_log.read_text().splitlines():
            item: dict[str, Any] = json.loads(text)
            if item["request_id"] == request_id:
                return item
        return None
    return eventually(line, f"the access log line of {request_id}", timeout=10)


@pytest.mark.parametrize("fault", [Fault("reset_mid_body", after_bytes=MID),
                                   Fault("stall_mid_body", after_bytes=MID, seconds=20)],
                         ids=lambda f: f.kind)
def test_a_pass_through_answer_the_origin_cuts_is_counted_and_logged_as_cut_off(
    relaying: tuple[SidecarProcess, Path], fault_proxy: FaultProxy, origin_s3: Any,
    bucket: str, fault: Fault,
) -> None:
    """The origin fails or stalls mid-body: the client's 206 is cut short, and
    that is counted and named in its access log line as a cached read's is
    (it went out with a warning alone, a 206 with cut_off null)."""
    sidecar, access_log = relaying
    key = f"seg/relay-{fault.kind}.log"
    data, _ = put(origin_s3, bucket, key, seed=10)
    before = sidecar.metric("sidecar_client_cutoffs_total", reason="origin")
    fault_proxy.add(fault, "GET", key, 1)
    try:
        answer = fetch(sidecar.data_url, bucket, f"{key}?partNumber=1")
    finally:
        fault_proxy.clear()
    assert answer.status == 206 and answer.aborted and len(answer.body) < SIZE
    assert data.startswith(answer.body)
    line = _access_line(access_log, answer.headers["x-amz-request-id"])
    assert (line["status"], line["cut_off"], line["bytes"]) == (206, "origin", len(answer.body))
    assert sidecar.metric("sidecar_client_cutoffs_total", reason="origin") == before + 1


def test_a_pass_through_answer_past_passthrough_timeout_is_cut_off_for_that_reason(
    fault_proxy: FaultProxy, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    """The request's own bound ends the answer, not the origin's read timeout:
    the cut-off names passthrough_timeout (a slow client holds it up as much
    as a slow origin), not `origin`."""
    key = "seg/relay-past-bound.log"
    data, _ = put(origin_s3, bucket, key, seed=13)
    access_log = tmp_path / "access.jsonl"
    (tmp_path / "cache").mkdir()
    with SidecarProcess(
        fault_proxy.endpoint, tmp_path / "cache", "--block-size", "64KiB",
        "--cache-size", str(64 * (BLOCK + 4096)),
        env={**FAULT_ENV, "SIDECAR_PASSTHROUGH_TIMEOUT": "1s",
             "SIDECAR_ORIGIN_READ_TIMEOUT": "30s", "SIDECAR_ACCESS_LOG": str(access_log)},
    ) as sidecar:
        fault_proxy.add(Fault("stall_mid_body", after_bytes=MID, seconds=20), "GET", key, 1)
        try:
            answer = fetch(sidecar.data_url, bucket, f"{key}?partNumber=1")
        finally:
            fault_proxy.clear()
        assert answer.status == 206 and answer.aborted and data.startswith(answer.body)
        line = _access_line(access_log, answer.headers["x-amz-request-id"])
        assert (line["cut_off"], line["bytes"]) == ("passthrough_timeout", len(answer.body))
        assert sidecar.metric("sidecar_client_cutoffs_total", reason="passthrough_timeout") == 1
        assert sidecar.metric("sidecar_client_cutoffs_total", reason="origin") == 0


BIG = 16 * 1024 * 1024  # far more than the socket buffers of both ends hold


def _unread_answer(url: str, path: str) -> socket.socket:
    """A GET whose client reads (almost) nothing: a tiny receive buffer, set
    before connecting so the window stays small."""
    address = urlsplit(url)
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((address.hostname or "", address.port or 80))
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: {address.netloc}\r\n\r\n".encode())
    return client


def _head_of(client: socket.socket) -> dict[str, str]:
    """The answer's status line and headers, read off the socket (no more)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = client.recv(1)
        assert chunk, "the connection closed before the headers"
        received += chunk
    status, *fields = received.decode("latin-1").split("\r\n")[:-2]
    headers = {":status": status.split()[1]}
    headers.update((name.lower(), value.strip())
                   for name, _, value in (field.partition(":") for field in fields))
    return headers


def test_a_pass_through_client_that_reads_nothing_is_cut_off_for_client_timeout(
    relaying: tuple[SidecarProcess, Path], origin_s3: Any, bucket: str,
) -> None:
    sidecar, access_log = relaying
    key = "seg/relay-unread.log"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=random.Random(11).randbytes(BIG))
    before = sidecar.metric("sidecar_client_cutoffs_total", reason="client_timeout")
    with _unread_answer(sidecar.data_url, f"/{bucket}/{key}?partNumber=1") as client:
        head = _head_of(client)
        assert head[":status"] == "206"
        line = _access_line(access_log, head["x-amz-request-id"])
    assert (line["status"], line["cut_off"]) == (206, "client_timeout")
    assert line["bytes"] < BIG
    assert sidecar.metric("sidecar_client_cutoffs_total", reason="client_timeout") == before + 1


def test_a_pass_through_client_that_hangs_up_is_a_disconnect_not_a_cut_off(
    relaying: tuple[SidecarProcess, Path], origin_s3: Any, bucket: str,
) -> None:
    sidecar, access_log = relaying
    key = "seg/relay-hang-up.log"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=random.Random(12).randbytes(BIG))
    cutoffs = sidecar.metric("sidecar_client_cutoffs_total")
    disconnects = sidecar.metric("sidecar_client_disconnects_total")
    with _unread_answer(sidecar.data_url, f"/{bucket}/{key}?partNumber=1") as client:
        head = _head_of(client)
        # A reset, unread bytes and all: the sidecar's next write fails.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    line = _access_line(access_log, head["x-amz-request-id"])
    assert (line["status"], line["cut_off"]) == (206, None) and line["bytes"] < BIG
    assert sidecar.metric("sidecar_client_disconnects_total") == disconnects + 1
    assert sidecar.metric("sidecar_client_cutoffs_total") == cutoffs


@pytest.mark.parametrize("fault", [Fault("status", 500, "InternalError"),
                                   Fault("reset_before_body")], ids=lambda f: f.kind)
def test_a_write_the_origin_may_have_stored_leaves_nothing_stale(
    faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
    fault: Fault,
) -> None:
    """The origin stores a PUT and then fails to say so (a 500, a connection
    cut before its answer): the client cannot know whether the write happened,
    and the sidecar must not go on serving the old version from its cache."""
    key = f"seg/written-{fault.kind}.log"
    old, _ = put(origin_s3, bucket, key, seed=7)
    assert fetch(faulty.data_url, bucket, key).body == old
    assert fetch(faulty.data_url, bucket, key).headers["x-sidecar-cache"] == "hit"
    new = random.Random(8).randbytes(SIZE)
    # Every attempt (the client's own retry too) stores, then fails.
    fault_proxy.add(fault, "PUT", key, None,
                    before=lambda: origin_s3.put_object(Bucket=bucket, Key=key, Body=new))
    try:
        with pytest.raises(ClientError):
            s3_client(faulty.data_url).put_object(Bucket=bucket, Key=key, Body=new)
    finally:
        fault_proxy.clear()
    assert fault_proxy.requests("PUT", key)
    answer = fetch(faulty.data_url, bucket, key)
    assert (answer.status, answer.aborted) == (200, False)
    assert answer.body == new, "the old version was served after a write that went through"


@pytest.mark.parametrize("down", ["503", "reset"])
def test_origin_outage(
    down: str, fault_proxy: FaultProxy, origin_s3: Any, bucket: str, tmp_path: Path,
    summary: dict[str, dict[str, Any]],
) -> None:
    """The whole origin fails (every request answered 503, or every connection
    reset): cached ranges are still served (stale HEAD), misses fail fast with
    503, the breaker opens and, once the origin is back, closes."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**FAULT_ENV, "SIDECAR_HEAD_TTL": "1s", "SIDECAR_HEAD_STALE_IF_ERROR": "5m",
           "SIDECAR_ORIGIN_BREAKER_FAILURES": "3", "SIDECAR_ORIGIN_BREAKER_COOLDOWN": "6s"}
    with SidecarProcess(fault_proxy.endpoint, cache, "--block-size", "64KiB",
                        "--cache-size", str(64 * (BLOCK + 4096)), env=env) as sidecar:
        cached, _ = put(origin_s3, bucket, "seg/cached.log", seed=7)
        uncached, _ = put(origin_s3, bucket, "seg/uncached.log", seed=8)
        put(origin_s3, bucket, "seg/deleted.log", seed=9)
        half = 3 * BLOCK - 1
        for key in ("seg/cached.log", "seg/deleted.log"):
            assert fetch(sidecar.data_url, bucket, key, f"bytes=0-{half}").status == 206
        origin_s3.delete_object(Bucket=bucket, Key="seg/deleted.log")
        time.sleep(1.2)  # past head_ttl: every read needs the origin's HEAD again
        # A deleted object is not papered over: the origin's 404 is an answer.
        assert fetch(sidecar.data_url, bucket, "seg/deleted.log", "bytes=0-99").code == \
            "NoSuchKey"

        fault_proxy.down = down
        served = fetch(sidecar.data_url, bucket, "seg/cached.log", f"bytes=10-{half}")
        assert (served.status, served.aborted) == (206, False)
        assert served.body == cached[10:half + 1]
        assert served.seconds < DEADLINE_S + MARGIN_S
        assert fetch(sidecar.data_url, bucket, "seg/cached.log", method="HEAD").status == 200
        miss = fetch(sidecar.data_url, bucket, "seg/uncached.log", "bytes=0-99")
        assert (miss.status, miss.code) == (503, "ServiceUnavailable")
        assert miss.seconds < DEADLINE_S + MARGIN_S
        assert sidecar.metric("sidecar_origin_breaker_state", state="open") == 1
        assert sidecar.stats()["origin"]["breaker"]["state"] == "open"  # type: ignore[index]

        # Open: misses fail without a request to the origin (inside the cool-down).
        before = len(fault_proxy.requests())
        uncached_tail = fetch(sidecar.data_url, bucket, "seg/cached.log", f"bytes={half + 1}-")
        fast = fetch(sidecar.data_url, bucket, "seg/uncached.log", "bytes=0-99")
        assert (uncached_tail.status, uncached_tail.code) == (503, "ServiceUnavailable")
        assert (fast.status, fast.code) == (503, "ServiceUnavailable")
        assert len(fault_proxy.requests()) == before
        assert sidecar.metric("sidecar_origin_breaker_rejected_total") >= 2

        fault_proxy.clear()
        healed_at = time.monotonic()
        answer = eventually(lambda: _ok(fetch(sidecar.data_url, bucket, "seg/uncached.log")),
                            "the breaker to let reads through again", timeout=30.0, interval=0.25)
        recovery = time.monotonic() - healed_at
        assert answer.body == uncached
        assert sidecar.metric("sidecar_origin_breaker_state", state="closed") == 1
        assert sidecar.stats()["origin"]["breaker"]["state"] == "closed"  # type: ignore[index]
        whole = fetch(sidecar.data_url, bucket, "seg/cached.log")
        assert whole.body == cached
        log = "".join(sidecar.stderr_lines)
        assert "circuit breaker closed -> open" in log
    summary[f"origin_down_{down}"] = {
        "outcome": "cached range 206 exact from a stale HEAD; misses 503 ServiceUnavailable; "
                   "breaker opened, refused misses without origin requests, closed on recovery",
        "seconds": round(max(served.seconds, miss.seconds, fast.seconds), 3),
        "recovery_seconds": round(recovery, 3),
        "bytes_checked": len(served.body) + len(answer.body) + len(whole.body),
    }


async def test_a_stale_head_is_used_only_within_its_bound_and_never_after_a_404(
    fault_proxy: FaultProxy, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    """The origin client itself, in this process, on a clock the test moves."""
    clock = FakeClock(1000.0)
    config = load_config(
        {"origin_endpoint": fault_proxy.endpoint, "cache_dir": str(tmp_path)},
        {"SIDECAR_HEAD_TTL": "30s", "SIDECAR_HEAD_STALE_IF_ERROR": "60s",
         "SIDECAR_ORIGIN_DEADLINE": "2s", "SIDECAR_ORIGIN_BREAKER_FAILURES": "0"}, {},
    )
    origin = Origin(config.origin, Metrics(CollectorRegistry()), clock=clock)
    await origin.start()
    key = "seg/stale.log"
    put(origin_s3, bucket, key, seed=10)
    try:
        info = await origin.head(bucket, key)
        fault_proxy.down = "503"
        clock.advance(31)  # past head_ttl
        assert await origin.head(bucket, key) == info
        clock.advance(30)  # 61 s after the origin's last answer: too old to stand in
        with pytest.raises(OriginUnavailable):
            await origin.head(bucket, key)
        fault_proxy.clear()
        assert await origin.head(bucket, key) == info
        origin_s3.delete_object(Bucket=bucket, Key=key)
        clock.advance(31)
        with pytest.raises(ObjectNotFound):
            await origin.head(bucket, key)
        fault_proxy.down = "503"
        clock.advance(31)
        with pytest.raises(OriginUnavailable):  # the 404 was an answer: nothing stale
            await origin.head(bucket, key)
    finally:
        fault_proxy.clear()
        await origin.close()


def _ok(answer: Answer) -> Answer | None:
    return answer if answer.status == 200 and not answer.aborted else None


@pytest.mark.parametrize("kind", ["no_length", "bad_length"])
def test_a_head_answer_without_a_usable_length(
    kind: str, faulty: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str,
    summary: dict[str, dict[str, Any]],
) -> None:
    """An S3-compatible origin that answers a HEAD without Content-Length (or
    with one that is no number): the object's size is unknown, so the read gets
    an S3 error in bounded time, never a wrong size, and no traceback is logged;
    once the origin answers properly, the object is read exactly (the broken
    answer was not remembered)."""
    key = f"seg/head-{kind}.log"
    data, _ = put(origin_s3, bucket, key, seed=11)
    logged = len(faulty.stderr_lines)
    fault_proxy.add(Fault(kind), "HEAD", key, times=None)
    start, end = RANGE
    try:
        head = fetch(faulty.data_url, bucket, key, method="HEAD")
        ranged = fetch(faulty.data_url, bucket, key, f"bytes={start}-{end}")
        heads = len(fault_proxy.requests("HEAD", key))
    finally:
        fault_proxy.clear()
    assert (head.status, head.headers.get("retry-after")) == (503, "1")
    assert (ranged.status, ranged.code) == (503, "ServiceUnavailable")
    assert ranged.seconds < DEADLINE_S + MARGIN_S
    assert heads >= 2, "a malformed answer is tried again, like any other"
    assert fetch(faulty.data_url, bucket, key, method="HEAD").headers["content-length"] == \
        str(SIZE)
    checked = check_healed(faulty, bucket, key, data)
    assert not [line for line in faulty.stderr_lines[logged:] if "Traceback" in line], \
        "".join(faulty.stderr_lines[logged:])

    # Once only (a key the sidecar has not asked about yet): tried again, answered.
    fresh = f"{key}.once"
    put(origin_s3, bucket, fresh, seed=12)
    fault_proxy.add(Fault(kind), "HEAD", fresh, times=1)
    try:
        once = fetch(faulty.data_url, bucket, fresh, method="HEAD")
    finally:
        fault_proxy.clear()
    assert (once.status, once.headers["content-length"]) == (200, str(SIZE))
    assert [seen.fault for seen in fault_proxy.requests("HEAD", fresh)] == [kind, None]
    summary[f"head_{kind}"] = {
        "outcome": f"503 {ranged.code} while always; exact size when once",
        "seconds": round(max(head.seconds, ranged.seconds), 3), "origin_heads": heads,
        "once_seconds": round(once.seconds, 3), "bytes_checked": checked,
    }
