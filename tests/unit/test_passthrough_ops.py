"""Pure pass-through logic: operation classification, payload plans, headers,
the aws-chunked decoder and the unsigned-trailer framing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.aws_chunked import (
    AwsChunkedDecoder,
    ChunkedFormatError,
    Rechunker,
    unsigned_trailer_length,
)
from sidecar.s3ops import (
    BadPayload,
    Invalidates,
    PayloadMode,
    classify,
    deleted_keys,
    outbound_headers,
    outbound_path,
    outbound_query,
    plan_payload,
    response_headers,
)


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "name", "cached", "invalidates"),
    [
        ("GET", "b/k", {}, {}, "GetObject", True, Invalidates.NOTHING),
        ("HEAD", "b/k", {"x-id": "HeadObject"}, {}, "HeadObject", True, Invalidates.NOTHING),
        ("GET", "b/k", {"X-Amz-Signature": "s", "X-Amz-Date": "d"}, {}, "GetObject", True,
         Invalidates.NOTHING),
        ("GET", "b/k", {"versionId": "1"}, {}, "GetObject", False, Invalidates.NOTHING),
        ("GET", "b/k", {"partNumber": "1"}, {}, "GetObject", False, Invalidates.NOTHING),
        ("HEAD", "b/k", {"partNumber": "1"}, {}, "HeadObject", False, Invalidates.NOTHING),
        ("GET", "b/k", {"tagging": ""}, {}, "GetObjectTagging", False, Invalidates.NOTHING),
        ("GET", "b/k", {"acl": ""}, {}, "GetObjectAcl", False, Invalidates.NOTHING),
        ("GET", "b/k", {"uploadId": "u"}, {}, "ListParts", False, Invalidates.NOTHING),
        ("PUT", "b/k", {}, {}, "PutObject", False, Invalidates.KEY),
        ("PUT", "b/k", {}, {"X-Amz-Copy-Source": "b/o"}, "CopyObject", False, Invalidates.KEY),
        ("PUT", "b/k", {"partNumber": "2", "uploadId": "u"}, {}, "UploadPart", False,
         Invalidates.NOTHING),
        ("PUT", "b/k", {"partNumber": "2", "uploadId": "u"}, {"x-amz-copy-source": "b/o"},
         "UploadPartCopy", False, Invalidates.NOTHING),
        ("PUT", "b/k", {"tagging": ""}, {}, "PutObjectTagging", False, Invalidates.NOTHING),
        ("POST", "b/k", {"uploads": ""}, {}, "CreateMultipartUpload", False, Invalidates.NOTHING),
        ("POST", "b/k", {"uploadId": "u"}, {}, "CompleteMultipartUpload", False, Invalidates.KEY),
        ("DELETE", "b/k", {"uploadId": "u"}, {}, "AbortMultipartUpload", False,
         Invalidates.NOTHING),
        ("DELETE", "b/k", {}, {}, "DeleteObject", False, Invalidates.KEY),
        ("DELETE", "b/k", {"tagging": ""}, {}, "DeleteObjectTagging", False, Invalidates.NOTHING),
        ("POST", "b", {"delete": ""}, {}, "DeleteObjects", False, Invalidates.DELETED_KEYS),
        ("GET", "b", {"list-type": "2", "prefix": "p"}, {}, "ListObjectsV2", False,
         Invalidates.NOTHING),
        ("GET", "b", {"prefix": "p", "marker": "m"}, {}, "ListObjects", False,
         Invalidates.NOTHING),
        ("GET", "b", {"uploads": ""}, {}, "ListMultipartUploads", False, Invalidates.NOTHING),
        ("GET", "b", {"location": ""}, {}, "GetBucketLocation", False, Invalidates.NOTHING),
        ("GET", "b", {"policy": ""}, {}, "GetBucketConfig", False, Invalidates.NOTHING),
        ("HEAD", "b", {}, {}, "HeadBucket", False, Invalidates.NOTHING),
        ("PUT", "b", {}, {}, "CreateBucket", False, Invalidates.NOTHING),
        ("DELETE", "b", {}, {}, "DeleteBucket", False, Invalidates.NOTHING),
        ("GET", "", {}, {}, "ListBuckets", False, Invalidates.NOTHING),
        ("PATCH", "b/k", {}, {}, "Other", False, Invalidates.NOTHING),
    ],
)
def test_classify(method: str, path: str, query: dict[str, str], headers: dict[str, str],
                  name: str, cached: bool, invalidates: Invalidates) -> None:
    bucket, _, key = path.partition("/")
    operation = classify(method, bucket, key, query, headers)
    assert (operation.name, operation.cached, operation.invalidates) == (name, cached, invalidates)


def test_outbound_path_and_query_are_canonically_encoded() -> None:
    assert outbound_path("b", "a b/c+d~e=f") == "/b/a%20b/c%2Bd~e%3Df"
    assert outbound_path("b", "") == "/b"
    assert outbound_path("", "") == "/"
    query = [("prefix", "a/b c"), ("list-type", "2"), ("uploads", ""),
             ("X-Amz-Signature", "dropped")]
    assert outbound_query(query) == "list-type=2&prefix=a%2Fb%20c&uploads="


def test_payload_plans() -> None:
    digest = "ab" * 32
    assert plan_payload({}, 65536).sha256 == "UNSIGNED-PAYLOAD"
    assert plan_payload({"X-Amz-Content-SHA256": digest.upper()}, 65536).sha256 == digest
    trailer = plan_payload({"x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}, 65536)
    assert (trailer.mode, trailer.sha256) == (PayloadMode.AS_IS,
                                              "STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    signed = {"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
              "x-amz-decoded-content-length": "1000"}
    plan = plan_payload(signed, 65536)
    assert (plan.mode, plan.sha256, plan.content_length) == \
        (PayloadMode.DECODE, "UNSIGNED-PAYLOAD", 1000)
    with_trailer = {**signed, "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                    "x-amz-trailer": "x-amz-checksum-crc32"}
    plan = plan_payload(with_trailer, 65536)
    assert (plan.mode, plan.trailer) == (PayloadMode.REFRAME, "x-amz-checksum-crc32")
    # A checksum whose length is unknown cannot be sized: decoded, trailer dropped.
    plan = plan_payload({**with_trailer, "x-amz-trailer": "x-amz-checksum-new"}, 65536)
    assert plan.mode is PayloadMode.DECODE
    with pytest.raises(BadPayload):
        plan_payload({"x-amz-content-sha256": "nonsense"}, 65536)
    with pytest.raises(BadPayload):
        plan_payload({"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"}, 65536)


def test_outbound_headers_drop_hop_by_hop_and_the_clients_signature() -> None:
    plan = plan_payload({"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                         "x-amz-decoded-content-length": "10"}, 65536)
    headers = [
        ("Host", "127.0.0.1:9330"), ("Authorization", "AWS4-HMAC-SHA256 ..."),
        ("X-Amz-Date", "20260101T000000Z"), ("X-Amz-Security-Token", "t"),
        ("Connection", "keep-alive, X-Private"), ("X-Private", "1"), ("Keep-Alive", "5"),
        ("Transfer-Encoding", "chunked"), ("Content-Encoding", "aws-chunked,gzip"),
        ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
        ("x-amz-decoded-content-length", "10"), ("Content-Length", "200"),
        ("x-amz-meta-a", "1"), ("x-amz-meta-a", "2"), ("Content-Type", "text/plain"),
    ]
    assert outbound_headers(headers, plan) == [
        ("Content-Encoding", "gzip"), ("x-amz-meta-a", "1"), ("x-amz-meta-a", "2"),
        ("Content-Type", "text/plain"), ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ("Content-Length", "10"),
    ]
    assert response_headers([("Connection", "close"), ("ETag", '"e"'),
                             ("Transfer-Encoding", "chunked")]) == [("ETag", '"e"')]


def test_deleted_keys_with_and_without_namespace() -> None:
    body = (b'<?xml version="1.0"?><Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            b"<Object><Key>a/1</Key></Object><Object><Key>b &amp; c</Key>"
            b"<VersionId>v</VersionId></Object><Quiet>true</Quiet></Delete>")
    assert deleted_keys(body) == ["a/1", "b & c"]
    assert deleted_keys(b"<Delete><Object><Key>x</Key></Object></Delete>") == ["x"]
    assert deleted_keys(b"not xml") == []


def encode_signed(data: bytes, sizes: list[int], trailers: bytes = b"") -> bytes:
    out, position = bytearray(), 0
    for size in sizes + [0]:
        piece = data[position:position + size]
        position += size
        out += b"%x;chunk-signature=%s\r\n" % (len(piece), b"f" * 64)
        if piece:
            out += piece + b"\r\n"
    return bytes(out + trailers + b"\r\n")


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 5000), seed=st.integers(0, 2**16), feed=st.integers(1, 700))
def test_decoder_returns_the_payload_however_it_is_fed(size: int, seed: int, feed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(size)
    sizes: list[int] = []
    while sum(sizes) < size:
        sizes.append(min(rng.randint(1, 1500), size - sum(sizes)))
    encoded = encode_signed(data, sizes, b"x-amz-checksum-crc32:AAAAAA==\r\n")
    decoder = AwsChunkedDecoder()
    out = bytearray()
    for start in range(0, len(encoded), feed):
        for piece in decoder.feed(encoded[start:start + feed]):
            out += piece
    assert bytes(out) == data and decoder.done and decoder.decoded_bytes == size
    assert decoder.trailers == [("x-amz-checksum-crc32", "AAAAAA==")]


@pytest.mark.parametrize("broken", [
    b"zz;chunk-signature=00\r\n",  # not hex
    b"5;chunk-signature=00\r\nabcdefgh\r\n",  # longer than declared
    b"5;chunk-signature=00\n",  # not CRLF
    b"1" * 5000,  # a header line without end
    b"0;chunk-signature=00\r\n\r\nmore",  # bytes after the end
])
def test_decoder_refuses_broken_framing(broken: bytes) -> None:
    with pytest.raises(ChunkedFormatError):
        AwsChunkedDecoder().feed(broken)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 300_000), chunk=st.sampled_from([8192, 65536, 100_000]),
       name=st.sampled_from(["x-amz-checksum-crc32", "x-amz-checksum-sha256",
                             "x-amz-checksum-crc64nvme"]))
def test_reframed_length_is_known_in_advance(size: int, chunk: int, name: str) -> None:
    value = {"x-amz-checksum-crc32": "A" * 8, "x-amz-checksum-sha256": "B" * 44,
             "x-amz-checksum-crc64nvme": "C" * 12}[name]
    rechunker = Rechunker(chunk)
    data = bytes(size)
    framed = b"".join(rechunker.feed(data[:size // 3]) + rechunker.feed(data[size // 3:]))
    framed += rechunker.finish([(name, value)])
    assert len(framed) == unsigned_trailer_length(size, chunk, name)
    decoder = AwsChunkedDecoder()
    assert b"".join(decoder.feed(framed)) == data and decoder.trailers == [(name, value)]
