"""S3 error answers: the codes, statuses and XML bodies S3 sends, so that SDKs
retry and report them as they would for S3 itself (S3 API Reference, "Error
responses"), and the translation of origin failures into them.
"""

from __future__ import annotations

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


def id_headers(request_id: str, host_id: str) -> dict[str, str]:
    """The two ids every S3 answer carries: x-amz-request-id and x-amz-id-2,
    the opaque "extended request id" S3 asks for next to it when a request is
    looked into (and that SDKs log and hand to the caller)."""
    return {"x-amz-request-id": request_id, "x-amz-id-2": host_id}


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
