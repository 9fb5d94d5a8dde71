"""Which S3 operation a request is, and how it is passed on. Pure: no I/O.

The data port serves plain object GET/HEAD from the cache; everything else is
passed through to the origin (sidecar.s3.passthrough). This module decides, from
method, path and query alone, which operation a request is (the `op` label of
sidecar_requests_total, a bounded set of names), whether the cache serves it,
and what it invalidates; and it prepares the headers, URL and payload hash of
the re-signed request. Operation names and their sub-resources follow the S3
API reference (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Operations_Amazon_Simple_Storage_Service.html).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote
from xml.etree import ElementTree

# Also pure: the framing's length is part of deciding how a body is forwarded.
from sidecar.s3.aws_chunked import AwsChunkedDecoder, ChunkedFormatError, unsigned_trailer_length

# The query half of a presigned URL: checked by the data port's authentication
# (which refuses Signature Version 2 when keys are configured), never forwarded:
# the sidecar signs anew, and S3 refuses a request authenticated twice.
PRESIGN_QUERY = frozenset({
    # SigV4 query authentication (sigv4-query-string-auth.html).
    "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
    "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token",
    # SigV2 query authentication (RESTAuthentication.html#RESTAuthenticationQueryStringAuth),
    # which botocore's generate_presigned_url makes with signature_version "s3".
    "AWSAccessKeyId", "Signature", "Expires", "x-amz-security-token",
})
# Query parameters that do not change what a GET/HEAD of an object returns.
HARMLESS_QUERY = frozenset({"x-id"}) | PRESIGN_QUERY

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
# Signed aws-chunked uploads: SigV4 and SigV4a, with or without trailers.
_SIGNED_STREAMING = re.compile(
    r"^STREAMING-AWS4-(HMAC-SHA256|ECDSA-P256-SHA256)-PAYLOAD(-TRAILER)?$")
_HEX_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")

# RFC 9110 section 7.6.1: connection-specific fields a proxy must not forward;
# `Proxy-Connection` is the pre-standard spelling some clients still send.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})
# The client's signature and what it covered are replaced by the sidecar's own;
# Host is the origin's; Expect is answered by the sidecar's own server (the
# client's 100-continue), not forwarded to a second hop.
_REPLACED_ON_RESIGN = frozenset({
    "authorization", "x-amz-date", "x-amz-security-token", "host", "expect", "date",
})
# Largest DeleteObjects body read into memory (S3 caps the request at 1000 keys
# of at most 1024 bytes each, so ~1.1 MiB of XML at most).
MAX_DELETE_BODY = 2 * 1024 * 1024


class Invalidates(enum.Enum):
    NOTHING = "nothing"
    KEY = "key"  # the request's own key: writes, copies, deletes
    DELETED_KEYS = "deleted_keys"  # the keys listed in a DeleteObjects body


# What a request that is no S3 operation is called (and refused as).
OTHER_OPERATION = "Other"


# What an anonymous request may do when access keys are configured
# (sidecar.s3.auth): read objects and list them, never write or delete with the
# sidecar's credentials. Bucket configuration (GetBucketConfig) stays private.
READ_OPERATIONS = frozenset({
    "GetObject", "HeadObject", "ListObjects", "ListObjectsV2", "ListObjectVersions",
    "ListMultipartUploads", "HeadBucket", "GetBucketLocation", "ListBuckets",
    "ListParts", "GetObjectTagging", "GetObjectAcl", "GetObjectAttributes",
    "GetObjectRetention", "GetObjectLegalHold", "GetObjectTorrent",
})


@dataclass(frozen=True)
class Operation:
    name: str
    cached: bool = False  # a plain object GET/HEAD, served through the cache
    invalidates: Invalidates = Invalidates.NOTHING


_OBJECT_GET_SUBRESOURCES = {
    "uploadId": "ListParts", "tagging": "GetObjectTagging", "acl": "GetObjectAcl",
    "attributes": "GetObjectAttributes", "retention": "GetObjectRetention",
    "legal-hold": "GetObjectLegalHold", "torrent": "GetObjectTorrent",
}
_OBJECT_PUT_SUBRESOURCES = {
    "tagging": "PutObjectTagging", "acl": "PutObjectAcl",
    "retention": "PutObjectRetention", "legal-hold": "PutObjectLegalHold",
}


def classify(
    method: str, bucket: str, key: str, query: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> Operation:
    """The S3 operation of a path-style request (method, decoded bucket and key, query)."""
    headers = headers or {}
    method = method.upper()
    if not bucket:
        return Operation("ListBuckets" if method == "GET" else OTHER_OPERATION)
    if not key:
        return _bucket_operation(method, query)
    if method in ("GET", "HEAD"):
        name = "GetObject" if method == "GET" else "HeadObject"
        if set(query) <= HARMLESS_QUERY:
            return Operation(name, cached=True)
        if method == "GET":
            for sub, sub_name in _OBJECT_GET_SUBRESOURCES.items():
                if sub in query:
                    return Operation(sub_name)
        # versionId, partNumber, response-* overrides: the origin answers.
        return Operation(name)
    copy = _has(headers, "x-amz-copy-source")
    if method == "PUT":
        if "partNumber" in query and "uploadId" in query:
            return Operation("UploadPartCopy" if copy else "UploadPart")
        for sub, sub_name in _OBJECT_PUT_SUBRESOURCES.items():
            if sub in query:
                return Operation(sub_name)
        return Operation("CopyObject" if copy else "PutObject", invalidates=Invalidates.KEY)
    if method == "POST":
        if "uploads" in query:
            return Operation("CreateMultipartUpload")
        if "uploadId" in query:
            return Operation("CompleteMultipartUpload", invalidates=Invalidates.KEY)
        if "restore" in query:
            return Operation("RestoreObject")
        if "select" in query:
            return Operation("SelectObjectContent")
        return Operation(OTHER_OPERATION)
    if method == "DELETE":
        if "uploadId" in query:
            return Operation("AbortMultipartUpload")
        if "tagging" in query:
            return Operation("DeleteObjectTagging")
        return Operation("DeleteObject", invalidates=Invalidates.KEY)
    return Operation(OTHER_OPERATION)


def _bucket_operation(method: str, query: Mapping[str, str]) -> Operation:
    if method == "GET":
        if "uploads" in query:
            return Operation("ListMultipartUploads")
        if "versions" in query:
            return Operation("ListObjectVersions")
        if "location" in query:
            return Operation("GetBucketLocation")
        if query.get("list-type") == "2":
            return Operation("ListObjectsV2")
        if set(query) - _LIST_PARAMETERS - HARMLESS_QUERY:
            return Operation("GetBucketConfig")
        return Operation("ListObjects")
    if method == "HEAD":
        return Operation("HeadBucket")
    if method == "POST" and "delete" in query:
        return Operation("DeleteObjects", invalidates=Invalidates.DELETED_KEYS)
    configures = bool(set(query) - HARMLESS_QUERY)
    if method == "PUT":
        return Operation("PutBucketConfig" if configures else "CreateBucket")
    if method == "DELETE":
        return Operation("DeleteBucketConfig" if configures else "DeleteBucket")
    return Operation(OTHER_OPERATION)


# Parameters of ListObjects(V2) (not sub-resources of the bucket).
_LIST_PARAMETERS = frozenset({
    "prefix", "delimiter", "marker", "max-keys", "encoding-type", "list-type",
    "continuation-token", "start-after", "fetch-owner", "x-id",
    "optional-object-attributes",
})


def _has(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name for k in headers)


def outbound_path(bucket: str, key: str) -> str:
    """The path of the re-signed request: each byte URI-encoded as SigV4 wants it
    for S3 (everything but unreserved characters and '/', never twice)."""
    if not bucket:
        return "/"
    if not key:
        return "/" + quote(bucket, safe="")
    return "/" + quote(bucket, safe="") + "/" + quote(key, safe="/~")


def outbound_query(pairs: Iterable[tuple[str, str]]) -> str:
    """The query string, canonically encoded (SigV4: names and values URI-encoded,
    sorted) so that the origin computes the same canonical request as the signer."""
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~"))
                     for k, v in pairs if k not in PRESIGN_QUERY)
    return "&".join(f"{k}={v}" for k, v in encoded)


class PayloadMode(enum.Enum):
    AS_IS = "as_is"  # forward the body bytes as received
    DECODE = "decode"  # signed aws-chunked: forward the decoded bytes
    REFRAME = "reframe"  # signed aws-chunked with a checksum trailer: unsigned framing


@dataclass(frozen=True)
class Payload:
    mode: PayloadMode
    sha256: str  # the payload hash the re-signed request carries
    content_length: int | None  # outbound Content-Length (None: as the client's)
    trailer: str | None = None  # REFRAME: the checksum trailer's name
    # DECODE and REFRAME: the client's STREAMING-AWS4-* payload hash; its chunk
    # signatures chain to the request's signature (sidecar.s3.aws_chunked).
    signed_streaming: str | None = None


class BadPayload(ValueError):
    """The client's body or payload headers are not what S3 would accept (a 400)."""

    def __init__(self, message: str, code: str = "InvalidArgument") -> None:
        super().__init__(message)
        self.code = code


def plan_payload(headers: Mapping[str, str], reframe_chunk: int) -> Payload:
    """How the body is forwarded, from the client's x-amz-content-sha256.

    A hex hash or UNSIGNED-PAYLOAD is kept, so the origin verifies the body
    against what the client computed; STREAMING-UNSIGNED-PAYLOAD-TRAILER is
    kept with its framing (the origin checks the trailing checksum). Signed
    aws-chunked cannot be re-signed (its chunk signatures chain to the client's
    signature): the payload is decoded, and re-framed unsigned when it has a
    checksum trailer whose length is known.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    declared = lower.get("x-amz-content-sha256", "").strip()
    if not declared:
        return Payload(PayloadMode.AS_IS, UNSIGNED_PAYLOAD, None)
    if declared in (UNSIGNED_PAYLOAD, STREAMING_UNSIGNED_TRAILER):
        return Payload(PayloadMode.AS_IS, declared, None)
    if _HEX_SHA256.match(declared):
        return Payload(PayloadMode.AS_IS, declared.lower(), None)
    match = _SIGNED_STREAMING.match(declared)
    if match is None:
        raise BadPayload(f"x-amz-content-sha256 {declared[:80]!r} is not a payload hash S3 accepts")
    decoded = lower.get("x-amz-decoded-content-length", "").strip()
    if not decoded.isdigit():
        raise BadPayload("a streaming upload needs x-amz-decoded-content-length")
    length = int(decoded)
    trailer = lower.get("x-amz-trailer", "").strip().lower()
    if match.group(2) and trailer:
        framed = unsigned_trailer_length(length, reframe_chunk, trailer)
        if framed is not None:
            return Payload(PayloadMode.REFRAME, STREAMING_UNSIGNED_TRAILER, framed, trailer,
                           declared)
    return Payload(PayloadMode.DECODE, UNSIGNED_PAYLOAD, length, None, declared)


def outbound_headers(headers: Iterable[tuple[str, str]], payload: Payload) -> list[tuple[str, str]]:
    """The client's headers as forwarded: hop-by-hop fields (and those the
    Connection header names), the client's signature and Host dropped; the
    payload headers rewritten for a decoded body."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs if name.lower() == "connection"
        for token in value.split(",")
    }
    out: list[tuple[str, str]] = []
    for name, value in pairs:
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in named or lname in _REPLACED_ON_RESIGN:
            continue
        if lname in ("x-amz-content-sha256", "content-length"):
            continue  # set below
        if payload.mode is PayloadMode.DECODE:
            if lname in ("x-amz-decoded-content-length", "x-amz-trailer"):
                continue
            if lname == "content-encoding":
                value = _without_aws_chunked(value)
                if not value:
                    continue
        out.append((name, value))
    out.append(("x-amz-content-sha256", payload.sha256))
    if payload.content_length is not None:
        out.append(("Content-Length", str(payload.content_length)))
    else:
        out.extend((n, v) for n, v in pairs if n.lower() == "content-length")
    return out


def _without_aws_chunked(value: str) -> str:
    return ",".join(t.strip() for t in value.split(",") if t.strip().lower() != "aws-chunked")


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The origin's response headers as sent to the client (hop-by-hop dropped)."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs if name.lower() == "connection"
        for token in value.split(",")
    }
    return [(n, v) for n, v in pairs if n.lower() not in HOP_BY_HOP and n.lower() not in named]


def outbound_payload(body: bytes, payload: Payload) -> bytes:
    """The payload bytes of a whole body as it goes to the origin: without the
    aws-chunked framing when it goes framed (STREAMING-UNSIGNED-PAYLOAD-TRAILER,
    as the client sent it or re-framed). Malformed framing holds no payload; the
    origin refuses it anyway."""
    if payload.sha256 != STREAMING_UNSIGNED_TRAILER:
        return body
    decoder = AwsChunkedDecoder()
    try:
        pieces = decoder.feed(body)
    except ChunkedFormatError:
        return b""
    return b"".join(pieces) if decoder.done else b""


def deleted_keys(body: bytes) -> list[str]:
    """The keys of a DeleteObjects request body (`<Delete><Object><Key>...`).

    The body is at most MAX_DELETE_BODY bytes, and the expat behind ElementTree
    refuses entity-expansion bombs (expat >= 2.4.1), so parsing is bounded.

    Namespaces vary between clients (some send S3's, some none), so elements are
    matched by local name. A body that is not XML lists no keys; the origin
    rejects it anyway.
    """
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return []
    keys: list[str] = []
    for element in root.iter():
        if _local(element.tag) != "Object":
            continue
        for child in element:
            if _local(child.tag) == "Key" and child.text is not None:
                keys.append(child.text)
    return keys


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]
