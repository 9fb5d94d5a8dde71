"""Which S3 operation a request is, and how it is passed on. Pure: no I/O.

The data port serves plain object GET/HEAD from the cache; everything else is
passed through to the origin (sidecar.s3.passthrough). This module decides, from
method, path and query alone, which operation a request is (the `op` label of
sidecar_requests_total, a bounded set of names), whether the cache serves it,
and what it invalidates; and it prepares the URL of the re-signed request (its
headers and payload: sidecar.s3.payload). Operation names and their sub-resources follow the S3
API reference (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Operations_Amazon_Simple_Storage_Service.html).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote
from xml.etree import ElementTree

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

# Largest DeleteObjects body read into memory (S3 caps the request at 1000 keys
# of at most 1024 bytes each, so ~1.1 MiB of XML at most).
MAX_DELETE_BODY = 2 * 1024 * 1024


class Invalidates(enum.Enum):
    NOTHING = "nothing"
    KEY = "key"  # the request's own key: writes, copies, deletes
    DELETED_KEYS = "deleted_keys"  # the keys listed in a DeleteObjects body
    # The request's own key's remembered HEAD, not its blocks: a write of what
    # every GET and HEAD of the object repeats as headers, its bytes and ETag
    # unchanged (x-amz-tagging-count, the retention and legal hold headers,
    # x-amz-restore; GetObject API reference, "Response Syntax").
    HEAD = "head"


# What a request that is no S3 operation is called (and refused as).
OTHER_OPERATION = "Other"
# The `op` of a request answered before it is classified (a signature refused,
# a header that is not text, admission full): GET and HEAD as the object reads
# they mostly are, the other methods S3 has as they are sent, and every other
# method Other, as `classify` would call it. Never the method itself: the
# client chooses it, and each new one would be a new series of
# sidecar_requests_total that lives as long as the process (llhttp passes some
# 35 methods, aiohttp's pure-Python parser any token).
_UNCLASSIFIED_NAMES = {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PUT", "POST": "POST",
                       "DELETE": "DELETE"}


# What an anonymous request may do when access keys are configured
# (sidecar.s3.auth), and a key scoped to `read` (sidecar.s3.access): read
# objects and list them, never write or delete with the sidecar's credentials.
# Bucket configuration (GetBucketConfig) stays private, and so does the list of
# the buckets the sidecar's identity has (ListBuckets: sidecar.s3.access).
READ_OPERATIONS = frozenset({
    "GetObject", "HeadObject", "ListObjects", "ListObjectsV2", "ListObjectVersions",
    "ListMultipartUploads", "HeadBucket", "GetBucketLocation",
    "ListParts", "GetObjectTagging", "GetObjectAcl", "GetObjectAttributes",
    "GetObjectRetention", "GetObjectLegalHold", "GetObjectTorrent",
})


@dataclass(frozen=True)
class Operation:
    name: str
    cached: bool = False  # a plain object GET/HEAD, served through the cache
    invalidates: Invalidates = Invalidates.NOTHING


# GET sub-resources of an object: the operation, and every query parameter it
# takes (S3 API Reference of each operation).
_OBJECT_GET_SUBRESOURCES: dict[str, tuple[str, frozenset[str]]] = {
    "uploadId": ("ListParts", frozenset({"uploadId", "max-parts", "part-number-marker",
                                         "encoding-type"})),
    "tagging": ("GetObjectTagging", frozenset({"tagging", "versionId"})),
    "acl": ("GetObjectAcl", frozenset({"acl", "versionId"})),
    "attributes": ("GetObjectAttributes", frozenset({"attributes", "versionId"})),
    "retention": ("GetObjectRetention", frozenset({"retention", "versionId"})),
    "legal-hold": ("GetObjectLegalHold", frozenset({"legal-hold", "versionId"})),
    "torrent": ("GetObjectTorrent", frozenset({"torrent"})),
}
# GetObject/HeadObject parameters besides the response-* overrides.
_GET_OBJECT_PARAMETERS = frozenset({"versionId", "partNumber"})
# A GET or HEAD of an object with a query no read takes: passed through for a
# signed caller, never an anonymous read.
UNKNOWN_OBJECT_READ = "GetObjectConfig"
# GET sub-resources of a bucket that are reads, with the parameters they take.
_BUCKET_GET_SUBRESOURCES: dict[str, tuple[str, frozenset[str]]] = {
    "uploads": ("ListMultipartUploads", frozenset({
        "uploads", "delimiter", "encoding-type", "key-marker", "max-uploads", "prefix",
        "upload-id-marker"})),
    "versions": ("ListObjectVersions", frozenset({
        "versions", "delimiter", "encoding-type", "key-marker", "max-keys", "prefix",
        "version-id-marker", "optional-object-attributes"})),
    "location": ("GetBucketLocation", frozenset({"location"})),
}
# PUT sub-resources of an object: the operation, and what it makes stale here.
_OBJECT_PUT_SUBRESOURCES = {
    "tagging": ("PutObjectTagging", Invalidates.HEAD),
    "acl": ("PutObjectAcl", Invalidates.NOTHING),  # no header of a GET says it
    "retention": ("PutObjectRetention", Invalidates.HEAD),
    "legal-hold": ("PutObjectLegalHold", Invalidates.HEAD),
}


def unclassified_name(method: str) -> str:
    """The `op` label of a request with `method` that was answered before
    `classify` saw it: one of a fixed few, whatever the method sent."""
    return _UNCLASSIFIED_NAMES.get(method, OTHER_OPERATION)


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
        return _object_read(method, query)
    copy = _has(headers, "x-amz-copy-source")
    if method == "PUT":
        if "partNumber" in query and "uploadId" in query:
            return Operation("UploadPartCopy" if copy else "UploadPart")
        for sub, (sub_name, invalidates) in _OBJECT_PUT_SUBRESOURCES.items():
            if sub in query:
                return Operation(sub_name, invalidates=invalidates)
        return Operation("CopyObject" if copy else "PutObject", invalidates=Invalidates.KEY)
    if method == "POST":
        if "uploads" in query:
            return Operation("CreateMultipartUpload")
        if "uploadId" in query:
            return Operation("CompleteMultipartUpload", invalidates=Invalidates.KEY)
        if "restore" in query:
            return Operation("RestoreObject", invalidates=Invalidates.HEAD)
        if "select" in query:
            return Operation("SelectObjectContent")
        return Operation(OTHER_OPERATION)
    if method == "DELETE":
        if "uploadId" in query:
            return Operation("AbortMultipartUpload")
        if "tagging" in query:
            return Operation("DeleteObjectTagging", invalidates=Invalidates.HEAD)
        return Operation("DeleteObject", invalidates=Invalidates.KEY)
    return Operation(OTHER_OPERATION)


def _object_read(method: str, query: Mapping[str, str]) -> Operation:
    """GET or HEAD of an object: cached when plain; a sub-resource only with the
    parameters it takes. Anything else is no read (UNKNOWN_OBJECT_READ)."""
    name = "GetObject" if method == "GET" else "HeadObject"
    params = set(query) - HARMLESS_QUERY
    if not params:
        return Operation(name, cached=True)
    if method == "GET":
        for sub, (sub_name, takes) in _OBJECT_GET_SUBRESOURCES.items():
            if sub in params:
                return Operation(sub_name if params <= takes else UNKNOWN_OBJECT_READ)
    if all(p in _GET_OBJECT_PARAMETERS or p.startswith("response-") for p in params):
        # versionId, partNumber, response-* overrides: the origin answers.
        return Operation(name)
    return Operation(UNKNOWN_OBJECT_READ)


def _bucket_operation(method: str, query: Mapping[str, str]) -> Operation:
    if method == "GET":
        # A listing (or the location) only with the parameters it takes: a
        # sub-resource beside them (`?list-type=2&policy`, `?uploads&acl`) makes
        # another request of it, which is no read (GetBucketConfig).
        params = set(query) - HARMLESS_QUERY
        for sub, (sub_name, takes) in _BUCKET_GET_SUBRESOURCES.items():
            if sub in params:
                return Operation(sub_name if params <= takes else "GetBucketConfig")
        if not params <= _LIST_PARAMETERS:
            return Operation("GetBucketConfig")
        return Operation("ListObjectsV2" if query.get("list-type") == "2" else "ListObjects")
    if method == "HEAD":
        # A sub-resource makes it the HEAD of that configuration's GET, as
        # for objects: no read.
        return Operation("GetBucketConfig" if set(query) - HARMLESS_QUERY else "HeadBucket")
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
    encoded = sorted((quote(k, safe="-_.~", errors="surrogateescape"),
                      quote(v, safe="-_.~", errors="surrogateescape"))
                     for k, v in pairs if k not in PRESIGN_QUERY)
    return "&".join(f"{k}={v}" for k, v in encoded)


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
