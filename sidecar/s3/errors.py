"""S3 error answers: the codes, statuses and XML bodies S3 sends, so that SDKs
retry and report them as they would for S3 itself (S3 API Reference, "Error
responses"), and the translation of origin failures into them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from xml.sax.saxutils import escape

from sidecar.errors import (
    BucketNotFound,
    ObjectNotFound,
    OriginAccessDenied,
    OriginError,
    OriginThrottled,
)
from sidecar.s3.ranges import unsatisfied_content_range


@dataclass(frozen=True)
class S3Error(Exception):
    status: int
    code: str
    message: str
    headers: tuple[tuple[str, str], ...] = ()
    # Elements S3 adds to some codes' XML after the Message, in its order
    # (InvalidRange: RangeRequested, ActualObjectSize); SDKs surface them.
    details: tuple[tuple[str, str], ...] = ()


def _slow_down_headers() -> tuple[tuple[str, str], ...]:
    return (("Retry-After", "1"),)


def error_for(exc: OriginError, *, bucket: str = "", key: str = "") -> S3Error:
    """Translate an origin failure into what the client is told, with the
    headers S3 defines for the origin's answer (a delete marker's, a bucket's
    region) that the origin sent (OriginError.headers), and the bucket or key
    S3 names in a NoSuchBucket's <BucketName> or a NoSuchKey's <Key>."""
    if isinstance(exc, BucketNotFound):
        return S3Error(404, "NoSuchBucket", "The specified bucket does not exist.", exc.headers,
                       (("BucketName", bucket),) if bucket else ())
    if isinstance(exc, ObjectNotFound):
        return S3Error(404, "NoSuchKey", "The specified key does not exist.", exc.headers,
                       (("Key", key),) if key else ())
    if isinstance(exc, OriginAccessDenied):
        return S3Error(403, "AccessDenied", "Access Denied", exc.headers)
    if isinstance(exc, OriginThrottled):
        return slow_down()
    return S3Error(
        503, "ServiceUnavailable", "The origin is unavailable; please retry.",
        _slow_down_headers() + exc.headers,
    )


def slow_down() -> S3Error:
    return S3Error(503, "SlowDown", "Please reduce your request rate.", _slow_down_headers())


def paused() -> S3Error:
    return S3Error(503, "ServiceUnavailable",
                   "Downloads are paused (cache-only mode) and the range is not cached.",
                   _slow_down_headers())


def stopping() -> S3Error:
    """The fetch a read waited for was stopped (the sidecar is stopping)
    before any byte of the answer: to be tried again, here or elsewhere."""
    return S3Error(503, "ServiceUnavailable",
                   "The sidecar is stopping and gave up the read; please retry.",
                   _slow_down_headers())


def id_headers(request_id: str, host_id: str) -> dict[str, str]:
    """The two ids every S3 answer carries: x-amz-request-id and x-amz-id-2,
    the opaque "extended request id" S3 asks for next to it when a request is
    looked into (and that SDKs log and hand to the caller)."""
    return {"x-amz-request-id": request_id, "x-amz-id-2": host_id}


# The headers an origin names its own answer with: S3's pair, and the
# x-amzn-requestid of other AWS services and of S3 clones (moto), which botocore
# reads before x-amz-request-id. A passed-through answer carries the sidecar's
# ids instead (id_headers), those its access log line has.
ORIGIN_ID_HEADERS = frozenset({"x-amz-request-id", "x-amz-id-2", "x-amzn-requestid"})
# An error document (S3 API Reference, "Error responses"): the root element is
# Error, after an XML declaration if any; its ids are plain text.
_ERROR_DOCUMENT = re.compile(rb"\A\s*(?:<\?xml[^>]*\?>\s*)?<Error>")
_ID_ELEMENT = re.compile(rb"<(RequestId|HostId)>[^<]*</\1>")
_CODE_ELEMENT = re.compile(rb"<Code>([^<]{1,128})</Code>")


def origin_ids(headers: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """The request id and x-amz-id-2 an origin's answer came with ("" for
    one it did not send)."""
    named = {name.lower(): value for name, value in headers}
    request_id = named.get("x-amz-request-id") or named.get("x-amzn-requestid", "")
    return request_id, named.get("x-amz-id-2", "")


def with_ids(body: bytes, request_id: str, host_id: str) -> bytes:
    """An origin's error document with the RequestId and HostId it names made
    these (the sidecar's, as its x-amz-request-id and x-amz-id-2 are); any
    other body as it is."""
    if not _ERROR_DOCUMENT.match(body):
        return body
    ours = {b"RequestId": request_id.encode(), b"HostId": escape(host_id).encode()}

    def replaced(found: re.Match[bytes]) -> bytes:
        name = found.group(1)
        return b"<%s>%s</%s>" % (name, ours[name], name)

    return _ID_ELEMENT.sub(replaced, body)


def error_code_of(body: bytes) -> str:
    """The Code of an error document ("" if the body is none, or names none)."""
    if not _ERROR_DOCUMENT.match(body):
        return ""
    found = _CODE_ELEMENT.search(body)
    return found.group(1).decode("utf-8", "replace") if found else ""


def error_body(error: S3Error, resource: str, request_id: str, host_id: str) -> bytes:
    """The XML document of an error answer (a HEAD answer carries none); its
    RequestId and HostId repeat x-amz-request-id and x-amz-id-2."""
    details = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in error.details)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{error.code}</Code><Message>{escape(error.message)}</Message>{details}"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId>"
        f"<HostId>{escape(host_id)}</HostId></Error>"
    ).encode()


def invalid_range(range_header: str, size: int) -> S3Error:
    """416 as S3 sends it: the range asked for and the object's size, in the
    body (which a client reads to retry with a range that fits) and in
    Content-Range (RFC 9110 §14.4)."""
    return S3Error(416, "InvalidRange", "The requested range is not satisfiable",
                   (("Content-Range", unsatisfied_content_range(size)),),
                   (("RangeRequested", range_header), ("ActualObjectSize", str(size))))
