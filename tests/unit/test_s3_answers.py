"""What of the origin's answers reaches the client: the headers S3 defines on
an error answer (a delete marker's, a bucket's region), and the whole object's
checksums, only on a whole-object answer that asked for them.

The translation is pure (sidecar.origin.client, sidecar.s3.errors); the data
port is aiohttp's own test server in front of a scripted origin and engine.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import cast

import pytest
from aiohttp.test_utils import TestClient, TestServer
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry

from sidecar.engine import Engine, Piece, Source
from sidecar.errors import (
    ObjectNotFound,
    OriginAccessDenied,
    OriginError,
    OriginMalformedAnswer,
    OriginUnavailable,
)
from sidecar.model import ObjectInfo
from sidecar.origin.answers import object_size
from sidecar.origin.client import (
    Origin,
    checksum_headers,
    error_headers,
    judge,
    object_headers,
    translate_answer,
    translate_client_error,
)
from sidecar.origin.http1 import ResponseHead
from sidecar.origin.range_reader import OriginAnswered
from sidecar.s3.dataport import DataPort
from sidecar.s3.errors import S3Error, error_code_of, error_for, origin_ids, with_ids
from sidecar.telemetry.metrics import Metrics

MARKER_404 = {
    "x-amz-delete-marker": "true",
    "x-amz-version-id": "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY",
    "x-amz-request-id": "4442587FB7D0A2F9",
    "x-amz-id-2": "host-id",
    "content-type": "application/xml",
    "server": "AmazonS3",
    "date": "Tue, 24 Nov 2026 21:30:21 GMT",
}
MARKER_HEADERS = (("x-amz-delete-marker", "true"),
                  ("x-amz-version-id", "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"))


def test_a_delete_markers_404_keeps_the_markers_headers_and_nothing_else() -> None:
    error = translate_answer(404, "404", "bkt", "seg.log", MARKER_404)
    assert isinstance(error, ObjectNotFound)
    assert error.headers == MARKER_HEADERS
    assert error_for(error) == S3Error(404, "NoSuchKey", "The specified key does not exist.",
                                       MARKER_HEADERS)


def test_a_delete_marker_version_keeps_its_last_modified() -> None:
    # GetObject reference: a version that is a delete marker is answered 405
    # with the marker's Last-Modified.
    answer = {**MARKER_404, "Last-Modified": "Tue, 24 Nov 2026 21:30:00 GMT",
              "X-Amz-Delete-Marker": "true"}
    del answer["x-amz-delete-marker"]
    assert error_headers(answer) == (
        ("last-modified", "Tue, 24 Nov 2026 21:30:00 GMT"), *MARKER_HEADERS)


@pytest.mark.parametrize("answer", [
    {"x-amz-version-id": "v1"},
    {"x-amz-delete-marker": "false", "x-amz-version-id": "v1"},
    {"last-modified": "Tue, 24 Nov 2026 21:30:00 GMT", "retry-after": "5",
     "x-amz-request-id": "R"},
])
def test_headers_of_no_delete_marker_are_not_kept(answer: dict[str, str]) -> None:
    assert error_headers(answer) == ()
    assert translate_answer(404, "NoSuchKey", "bkt", "k", answer).headers == ()


def test_a_wrong_regions_answer_keeps_the_buckets_region() -> None:
    error = translate_answer(301, "PermanentRedirect", "bkt", "k",
                             {"x-amz-bucket-region": "eu-west-1", "location": "elsewhere"})
    assert isinstance(error, OriginUnavailable)
    assert error.headers == (("x-amz-bucket-region", "eu-west-1"),)
    answered = error_for(error)
    assert answered.status == 503
    assert answered.headers == (("Retry-After", "1"), ("x-amz-bucket-region", "eu-west-1"))


def test_an_odd_origins_long_headers_are_not_kept() -> None:
    kept = error_headers({"x-amz-delete-marker": "true", "x-amz-version-id": "v" * 4096})
    assert kept == (("x-amz-delete-marker", "true"),)


def test_both_ways_the_origin_answers_carry_the_headers() -> None:
    client_error = ClientError(
        {"Error": {"Code": "404", "Message": "Not Found"},
         "ResponseMetadata": {"HTTPStatusCode": 404, "HTTPHeaders": MARKER_404}},
        "HeadObject",
    )
    assert translate_client_error(client_error, "bkt", "k").headers == MARKER_HEADERS
    verdict = judge(client_error, "bkt", "k")
    assert verdict.error is not None and verdict.error.headers == MARKER_HEADERS
    # A block GET read by a worker thread (sidecar.origin.range_reader).
    answered = OriginAnswered(404, "NoSuchKey", ResponseHead(404, "Not Found", MARKER_404))
    verdict = judge(answered, "bkt", "k")
    assert isinstance(verdict.error, ObjectNotFound)
    assert verdict.error.headers == MARKER_HEADERS
    denied = judge(OriginAnswered(403, "AccessDenied", ResponseHead(403, "Forbidden", {
        "x-amz-bucket-region": "us-west-2"})), "bkt", "k")
    assert isinstance(denied.error, OriginAccessDenied)
    assert error_for(denied.error).headers == (("x-amz-bucket-region", "us-west-2"),)


CHECKSUMMED_HEAD = {
    "content-length": "4096",
    "etag": '"e1"',
    "x-amz-meta-owner": "broker-1",
    "x-amz-checksum-crc32": "/gcRcQ==",
    "x-amz-checksum-type": "FULL_OBJECT",
    # moto's own: not an S3 response header.
    "x-amz-sdk-checksum-algorithm": "CRC32",
}


def test_checksums_are_kept_apart_from_the_object_headers() -> None:
    assert checksum_headers(CHECKSUMMED_HEAD) == (
        ("x-amz-checksum-crc32", "/gcRcQ=="), ("x-amz-checksum-type", "FULL_OBJECT"))
    assert object_headers(CHECKSUMMED_HEAD) == (("x-amz-meta-owner", "broker-1"),)


def test_an_odd_origins_long_checksums_are_not_kept() -> None:
    assert checksum_headers({"x-amz-checksum-sha256": "x" * 1024}) == ()


# --- the data port ------------------------------------------------------------------

SIZE = 4096
INFO = ObjectInfo(
    bucket="bkt", key="seg.log", size=SIZE, etag='"e1"',
    last_modified=datetime(2026, 11, 1, tzinfo=UTC),
    headers=(("x-amz-meta-owner", "broker-1"),),
    checksums=(("x-amz-checksum-crc32", "/gcRcQ=="), ("x-amz-checksum-type", "FULL_OBJECT")),
)


class _Origin:
    def __init__(self, failure: OriginError | None = None) -> None:
        self.failure = failure

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        if self.failure is not None:
            raise self.failure
        return INFO


class _Engine:
    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        return True

    async def stream(self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
                     tally: object = None
                     ) -> AsyncGenerator[tuple[Piece, Source], None]:
        yield b"a" * (end - start + 1), Source.CACHE


def _port(origin: _Origin) -> DataPort:
    return DataPort(cast(Engine, _Engine()), cast(Origin, origin),
                    Metrics(CollectorRegistry()))


@pytest.mark.parametrize("method", ["HEAD", "GET"])
async def test_a_delete_markers_404_is_sent_with_its_headers(method: str) -> None:
    port = _port(_Origin(ObjectNotFound("s3://bkt/seg.log: no such key",
                                        headers=MARKER_HEADERS)))
    async with TestClient(TestServer(port.app())) as client:
        response = await client.request(method, "/bkt/seg.log")
        body = await response.read()
    assert response.status == 404
    assert {name: response.headers.get(name) for name, _ in MARKER_HEADERS} == \
        dict(MARKER_HEADERS)
    if method == "HEAD":
        assert body == b""
    else:
        assert b"<Code>NoSuchKey</Code>" in body


CHECKSUM_NAMES = ("x-amz-checksum-crc32", "x-amz-checksum-type")


@pytest.mark.parametrize(("method", "headers", "status", "with_checksums"), [
    ("GET", {"x-amz-checksum-mode": "ENABLED"}, 200, True),
    ("HEAD", {"x-amz-checksum-mode": "ENABLED"}, 200, True),
    # A Range S3 ignores (several ranges) is answered with the whole object.
    ("GET", {"x-amz-checksum-mode": "ENABLED", "Range": "bytes=0-1,5-9"}, 200, True),
    ("GET", {}, 200, False),
    ("HEAD", {}, 200, False),
    ("GET", {"x-amz-checksum-mode": "ENABLED", "Range": "bytes=0-99"}, 206, False),
    ("GET", {"x-amz-checksum-mode": "ENABLED", "Range": "bytes=0-"}, 206, False),
    ("HEAD", {"x-amz-checksum-mode": "ENABLED", "Range": "bytes=-100"}, 206, False),
    ("GET", {"x-amz-checksum-mode": "ENABLED", "If-None-Match": '"e1"'}, 304, False),
])
async def test_checksums_only_on_a_whole_object_answer_that_asked(
    method: str, headers: dict[str, str], status: int, with_checksums: bool
) -> None:
    async with TestClient(TestServer(_port(_Origin()).app())) as client:
        response = await client.request(method, "/bkt/seg.log", headers=headers)
        await response.read()
    assert response.status == status
    sent = {name: response.headers.get(name) for name in CHECKSUM_NAMES}
    assert sent == (dict(INFO.checksums) if with_checksums else dict.fromkeys(CHECKSUM_NAMES))


@pytest.mark.parametrize("answer", [{}, {"ContentLength": None}, {"ContentLength": -1},
                                    {"ContentLength": "12"}, {"ContentLength": True}])
def test_a_head_answer_without_a_usable_size_is_malformed(answer: dict[str, object]) -> None:
    with pytest.raises(OriginMalformedAnswer, match="no usable Content-Length"):
        object_size(answer, "b", "k")
    # Judged as a malformed answer: tried again, counted against the origin.
    try:
        object_size(answer, "b", "k")
    except OriginMalformedAnswer as exc:
        verdict = judge(exc, "b", "k")
    assert (verdict.error, verdict.retryable) == (None, True)


def test_a_head_answers_size_is_its_content_length() -> None:
    assert object_size({"ContentLength": 0}, "b", "k") == 0
    assert object_size({"ContentLength": 8 << 20}, "b", "k") == 8 << 20


S3_ERROR = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchUpload</Code>'
            b"<Message>The specified upload does not exist.</Message><UploadId>u</UploadId>"
            b"<RequestId>4442587FB7D0A2F9</RequestId><HostId>origin+host/id=</HostId></Error>")


def test_an_origins_error_document_takes_the_sidecars_ids() -> None:
    """A passed-through error names the ids its headers carry (the sidecar's),
    as the sidecar's own errors do; nothing else of it changes."""
    ours = with_ids(S3_ERROR, "ABCDEF0123456789", "a+b/c=")
    assert ours == S3_ERROR.replace(b"4442587FB7D0A2F9", b"ABCDEF0123456789") \
        .replace(b"origin+host/id=", b"a+b/c=")
    assert error_code_of(ours) == "NoSuchUpload"
    # Without an XML declaration, as some S3 clones send it; an empty id too.
    bare = b"<Error><Code>SlowDown</Code><RequestId></RequestId></Error>"
    assert with_ids(bare, "R", "H") == \
        b"<Error><Code>SlowDown</Code><RequestId>R</RequestId></Error>"
    assert error_code_of(bare) == "SlowDown"


@pytest.mark.parametrize("body", [
    # A 200 whose entries are errors: not an error document, left alone.
    b"<DeleteResult><Error><Key>k</Key><Code>AccessDenied</Code>"
    b"<RequestId>X</RequestId></Error></DeleteResult>",
    b"not xml <RequestId>X</RequestId>",
    b"",
])
def test_a_body_that_is_no_error_document_is_left_as_it_came(body: bytes) -> None:
    assert with_ids(body, "R", "H") == body
    assert error_code_of(body) == ""


def test_the_origins_ids_are_read_from_either_spelling() -> None:
    assert origin_ids([("X-Amz-Request-Id", "R"), ("x-amz-id-2", "H")]) == ("R", "H")
    # moto and other AWS services: x-amzn-requestid, no x-amz-id-2.
    assert origin_ids([("x-amzn-RequestId", "M")]) == ("M", "")
    assert origin_ids([("ETag", '"e"')]) == ("", "")
