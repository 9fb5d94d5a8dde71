"""Pure pass-through logic: operation classification, payload plans, headers,
the aws-chunked decoder and the unsigned-trailer framing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.s3.addressing import query_pairs
from sidecar.s3.aws_chunked import (
    AwsChunkedDecoder,
    ChunkedFormatError,
    Rechunker,
    SignatureChain,
    unsigned_trailer_length,
)
from sidecar.s3.operations import (
    OTHER_OPERATION,
    Invalidates,
    classify,
    deleted_keys,
    outbound_path,
    outbound_query,
    unclassified_name,
)
from sidecar.s3.payload import (
    BadPayload,
    DeclaredLength,
    PayloadMode,
    outbound_headers,
    outbound_payload,
    plan_payload,
    response_headers,
)
from sidecar.s3.sigv4 import ChunkSigner, Reason, SignatureRejected
from tests.support.signed_chunks import chunked_body, crc32_trailer, key_of


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "name", "cached", "invalidates"),
    [
        ("GET", "b/k", {}, {}, "GetObject", True, Invalidates.NOTHING),
        ("HEAD", "b/k", {"x-id": "HeadObject"}, {}, "HeadObject", True, Invalidates.NOTHING),
        ("GET", "b/k", {"X-Amz-Signature": "s", "X-Amz-Date": "d"}, {}, "GetObject", True,
         Invalidates.NOTHING),
        # A SigV2 presigned URL (boto3 with signature_version "s3").
        ("GET", "b/k", {"AWSAccessKeyId": "a", "Signature": "s", "Expires": "1"}, {}, "GetObject",
         True, Invalidates.NOTHING),
        ("HEAD", "b/k", {"AWSAccessKeyId": "a", "Signature": "s", "Expires": "1",
                         "x-amz-security-token": "t"}, {}, "HeadObject", True, Invalidates.NOTHING),
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
        # What GET and HEAD repeat as headers: the remembered HEAD, not the blocks.
        ("PUT", "b/k", {"tagging": ""}, {}, "PutObjectTagging", False, Invalidates.HEAD),
        ("PUT", "b/k", {"retention": ""}, {}, "PutObjectRetention", False, Invalidates.HEAD),
        ("PUT", "b/k", {"legal-hold": ""}, {}, "PutObjectLegalHold", False, Invalidates.HEAD),
        ("POST", "b/k", {"restore": ""}, {}, "RestoreObject", False, Invalidates.HEAD),
        ("PUT", "b/k", {"acl": ""}, {}, "PutObjectAcl", False, Invalidates.NOTHING),
        ("POST", "b/k", {"uploads": ""}, {}, "CreateMultipartUpload", False, Invalidates.NOTHING),
        ("POST", "b/k", {"uploadId": "u"}, {}, "CompleteMultipartUpload", False, Invalidates.KEY),
        ("DELETE", "b/k", {"uploadId": "u"}, {}, "AbortMultipartUpload", False,
         Invalidates.NOTHING),
        ("DELETE", "b/k", {}, {}, "DeleteObject", False, Invalidates.KEY),
        ("DELETE", "b/k", {"tagging": ""}, {}, "DeleteObjectTagging", False, Invalidates.HEAD),
        ("POST", "b", {"delete": ""}, {}, "DeleteObjects", False, Invalidates.DELETED_KEYS),
        ("GET", "b", {"list-type": "2", "prefix": "p"}, {}, "ListObjectsV2", False,
         Invalidates.NOTHING),
        ("GET", "b", {"prefix": "p", "marker": "m"}, {}, "ListObjects", False,
         Invalidates.NOTHING),
        ("GET", "b", {"uploads": ""}, {}, "ListMultipartUploads", False, Invalidates.NOTHING),
        ("GET", "b", {"location": ""}, {}, "GetBucketLocation", False, Invalidates.NOTHING),
        ("GET", "b", {"policy": ""}, {}, "GetBucketConfig", False, Invalidates.NOTHING),
        ("HEAD", "b", {}, {}, "HeadBucket", False, Invalidates.NOTHING),
        ("HEAD", "b", {"policy": ""}, {}, "GetBucketConfig", False, Invalidates.NOTHING),
        ("HEAD", "b", {"x-id": "HeadBucket"}, {}, "HeadBucket", False, Invalidates.NOTHING),
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
    # Neither form of query authentication reaches the origin, which would see
    # the request authenticated twice.
    sigv2 = [("uploadId", "u"), ("AWSAccessKeyId", "a"), ("Signature", "s"), ("Expires", "1"),
             ("x-amz-security-token", "t")]
    assert outbound_query(sigv2) == "uploadId=u"


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
    assert plan.signed_streaming == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    assert plan_payload({"x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"},
                        65536).signed_streaming is None
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


def test_delete_objects_keys_come_from_the_xml_whatever_the_framing() -> None:
    xml = b"<Delete><Object><Key>a/1</Key></Object><Object><Key>b/2</Key></Object></Delete>"
    plain = plan_payload({"x-amz-content-sha256": "ab" * 32}, 65536)
    assert deleted_keys(outbound_payload(xml, plain)) == ["a/1", "b/2"]
    # Unsigned-trailer framing goes to the origin as the client sent it.
    unsigned = plan_payload({"x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}, 65536)
    framed = b"10\r\n" + xml[:16] + b"\r\n%x\r\n" % (len(xml) - 16) + xml[16:] + \
        b"\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    assert deleted_keys(framed) == []
    assert deleted_keys(outbound_payload(framed, unsigned)) == ["a/1", "b/2"]
    # A signed body with a checksum trailer is re-framed unsigned.
    reframed_plan = plan_payload({
        "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "x-amz-decoded-content-length": str(len(xml)), "x-amz-trailer": "x-amz-checksum-crc32",
    }, 65536)
    assert reframed_plan.mode is PayloadMode.REFRAME
    rechunker = Rechunker(65536)
    reframed = b"".join(rechunker.feed(xml)) + rechunker.finish([crc32_trailer(xml)])
    assert deleted_keys(outbound_payload(reframed, reframed_plan)) == ["a/1", "b/2"]
    assert outbound_payload(framed[:-5], unsigned) == b""  # cut short: no keys


# --- chunk signatures (sigv4-streaming.html)

TIMESTAMP, SCOPE = "20130524T000000Z", "20130524/us-east-1/s3/aws4_request"
SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
KEY = key_of("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1")
SIGNER = ChunkSigner(KEY, TIMESTAMP, SCOPE, SEED)
# The AWS example's body, byte for byte.
AWS_EXAMPLE = (
    b"10000;chunk-signature=ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n"
    + b"a" * 65536 + b"\r\n"
    + b"400;chunk-signature=0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n"
    + b"a" * 1024 + b"\r\n"
    + b"0;chunk-signature=b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n"
)


def decode(body: bytes, chain: SignatureChain, feed: int = 1000) -> bytes:
    decoder = AwsChunkedDecoder(chain)
    out = bytearray()
    for start in range(0, len(body), feed):
        for piece in decoder.feed(body[start:start + feed]):
            out += piece
    assert decoder.done
    return bytes(out)


@pytest.mark.parametrize("feed", [1, 7, 1000, 100_000])
def test_the_aws_example_body_chains(feed: int) -> None:
    chain = SignatureChain.of(SIGNER, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    assert decode(AWS_EXAMPLE, chain, feed) == b"a" * 66560
    assert chain.chunks == 3


def _flip(body: bytes, at: int) -> bytes:
    return body[:at] + bytes([body[at] ^ 1]) + body[at + 1:]


def forgeries() -> list[tuple[str, bytes]]:
    first_data = AWS_EXAMPLE.index(b"\r\n") + 2
    second_header = AWS_EXAMPLE.index(b"400;")
    final_header = AWS_EXAMPLE.index(b"\r\n0;chunk") + 2
    other_seed = chunked_body(b"a" * 66560, 65536, KEY, TIMESTAMP, SCOPE, "1" * 64)
    return [
        ("first chunk's data", _flip(AWS_EXAMPLE, first_data + 100)),
        ("last data byte", _flip(AWS_EXAMPLE, final_header - 3)),
        ("a signature", AWS_EXAMPLE.replace(b"=ad80c7", b"=ad80c8")),
        ("final chunk's signature", AWS_EXAMPLE.replace(b"=b6c6ea", b"=b6c6eb")),
        ("chunks reordered", AWS_EXAMPLE[second_header:final_header]
         + AWS_EXAMPLE[:second_header] + AWS_EXAMPLE[final_header:]),
        ("cut after a chunk, a final chunk added",
         AWS_EXAMPLE[:second_header] + AWS_EXAMPLE[final_header:]),
        ("no signature", AWS_EXAMPLE.replace(
            b";chunk-signature=0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
            b"")),
        ("signed for another request", other_seed),
        ("an unsigned trailer", AWS_EXAMPLE[:-2] + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n"),
    ]


@pytest.mark.parametrize("name,body", forgeries(), ids=[n for n, _ in forgeries()])
def test_a_body_that_does_not_chain_is_refused_before_it_is_done(name: str, body: bytes) -> None:
    decoder = AwsChunkedDecoder(SignatureChain.of(SIGNER, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"))
    with pytest.raises(SignatureRejected) as caught:
        for start in range(0, len(body), 4096):
            decoder.feed(body[start:start + 4096])
    assert caught.value.reason is Reason.BAD_SIGNATURE
    assert not decoder.done
    # Without a chain (no keys configured) the same framing decodes.
    if name not in ("an unsigned trailer",):
        plain = AwsChunkedDecoder()
        plain.feed(body)
        assert plain.done


def test_signed_trailer_chains_and_refuses_changes() -> None:
    data = random.Random(3).randbytes(70_000)
    trailer = crc32_trailer(data)
    body = chunked_body(data, 8192, KEY, TIMESTAMP, SCOPE, SEED, trailer)
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
    decoder = AwsChunkedDecoder(SignatureChain.of(SIGNER, mode))
    assert b"".join(decoder.feed(body)) == data and decoder.done
    assert trailer in decoder.trailers
    other = crc32_trailer(b"other")
    line = f"{trailer[0]}:{trailer[1]}".encode()
    signature_line = body[body.index(b"x-amz-trailer-signature"):]
    for forged in (
        body.replace(line, f"{other[0]}:{other[1]}".encode()),  # another checksum
        body.replace(signature_line, b"\r\n"),  # the trailer signature left out
        body[:-2] + b"x-amz-meta-late:1\r\n\r\n",  # a line after the signature
        body.replace(line + b"\r\n", line + b"\r\nx-amz-meta-extra:1\r\n"),  # a line added
    ):
        with pytest.raises(SignatureRejected):
            AwsChunkedDecoder(SignatureChain.of(SIGNER, mode)).feed(forged)
    # The same trailer in a body declared without a signed trailer is refused.
    untrailed = SignatureChain.of(SIGNER, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    with pytest.raises(SignatureRejected):
        AwsChunkedDecoder(untrailed).feed(body)


def test_sigv4a_chunks_cannot_chain_to_a_sigv4_signature() -> None:
    with pytest.raises(SignatureRejected):
        SignatureChain.of(SIGNER, "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD")


def test_the_declared_length_holds_its_last_byte_and_refuses_more() -> None:
    gate = DeclaredLength(10)
    assert bytes(gate.admit(b"abcd")) == b"abcd"
    # The piece that reaches the declared length goes out without its last byte.
    assert bytes(gate.admit(memoryview(b"efghij"))) == b"efghi"
    assert gate.release() == b"j"
    over = DeclaredLength(10)
    over.admit(b"x" * 9)
    with pytest.raises(BadPayload, match="more bytes than"):
        over.admit(b"yz")
    short = DeclaredLength(10)
    short.admit(b"x" * 9)
    with pytest.raises(BadPayload, match="does not match"):
        short.release()
    assert DeclaredLength(0).release() == b""


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ({"list-type": "2", "policy": ""}, "GetBucketConfig"),
        ({"uploads": "", "policy": ""}, "GetBucketConfig"),
        ({"versions": "", "acl": ""}, "GetBucketConfig"),
        ({"location": "", "policy": ""}, "GetBucketConfig"),
        ({"list-type": "2", "uploads": ""}, "GetBucketConfig"),
        ({"uploads": "", "prefix": "p", "max-uploads": "5"}, "ListMultipartUploads"),
        ({"versions": "", "prefix": "p", "version-id-marker": "v"}, "ListObjectVersions"),
        ({"list-type": "2", "start-after": "a", "x-id": "ListObjects"}, "ListObjectsV2"),
    ],
)
def test_a_sub_resource_beside_a_listing_is_no_listing(query: dict[str, str], name: str) -> None:
    assert classify("GET", "b", "", query).name == name


@pytest.mark.parametrize(
    ("method", "query", "name"),
    [
        ("GET", {"tagging": "", "policy": ""}, "GetObjectConfig"),
        ("GET", {"uploadId": "u", "acl": ""}, "GetObjectConfig"),
        ("GET", {"website": ""}, "GetObjectConfig"),
        ("HEAD", {"policy": ""}, "GetObjectConfig"),
        ("GET", {"tagging": "", "versionId": "v"}, "GetObjectTagging"),
        ("GET", {"versionId": "v", "response-content-type": "a/b"}, "GetObject"),
    ],
)
def test_an_object_read_takes_only_its_own_parameters(
    method: str, query: dict[str, str], name: str
) -> None:
    operation = classify(method, "b", "k", query)
    assert (operation.name, operation.cached) == (name, False)


def test_query_pairs_decode_as_the_signature_does() -> None:
    # '+' is a plus (SigV4), not a space (form decoding); bytes that are not
    # UTF-8 go back out as they came.
    pairs = query_pairs("prefix=a+b%20c&uploads&&x=%FF")
    assert pairs[:2] == [("prefix", "a+b c"), ("uploads", "")]
    assert outbound_query(pairs) == "prefix=a%2Bb%20c&uploads=&x=%FF"


# RFC 9110 section 5.6.2: a method is a token of these.
TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@given(st.text(alphabet=TOKEN_CHARS, min_size=1, max_size=12))
def test_a_request_not_yet_classified_is_named_from_a_fixed_few(method: str) -> None:
    """The `op` label of a request answered before `classify` (a refused
    signature, a header that is not text): whatever token the method is."""
    assert unclassified_name(method) in {"GetObject", "HeadObject", "PUT", "POST", "DELETE",
                                         OTHER_OPERATION}


def test_a_request_not_yet_classified_keeps_the_names_s3_methods_had() -> None:
    assert [unclassified_name(m) for m in ("GET", "HEAD", "PUT", "POST", "DELETE")] == \
        ["GetObject", "HeadObject", "PUT", "POST", "DELETE"]
    assert unclassified_name("PROPFIND") == unclassified_name("get") == OTHER_OPERATION
