"""What the origin's answers mean.

The headers of an object's HEAD that are kept and repeated to clients, those
of an error answer that the client's answer carries too, the origin's S3
error codes mapped to `sidecar.errors`, and the judge of one failed attempt:
every botocore, aiohttp and socket error is translated here, in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from sidecar.errors import (
    BucketNotFound,
    ObjectNotFound,
    OriginAccessDenied,
    OriginBadBody,
    OriginError,
    OriginMalformedAnswer,
    OriginObjectChanged,
    OriginRequestRefused,
    OriginThrottled,
    OriginUnavailable,
)
from sidecar.origin.operation import Verdict
from sidecar.origin.policy import is_retryable_answer, is_throttling
from sidecar.origin.range_reader import OriginAnswered

# Failures of the connection or the body, not answers: worth another attempt.
_TRANSIENT = (
    BotoConnectionError, HTTPClientError, ReadTimeoutError, ResponseStreamingError,
    aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OriginBadBody,
    OriginMalformedAnswer,
)


# Headers of an object's HEAD that describe the object itself and that S3
# repeats on every GET and HEAD of it (user metadata, encodings, encryption,
# version, storage class, lock and retention state), per the HeadObject and
# GetObject references. Checksums are kept apart (checksum_headers): they are
# of the whole object, and an SDK that checks them would fail every ranged answer.
_OBJECT_HEADERS = frozenset({
    "cache-control", "content-disposition", "content-encoding", "content-language",
    "expires", "x-amz-version-id", "x-amz-storage-class", "x-amz-website-redirect-location",
    "x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key-md5", "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date", "x-amz-object-lock-legal-hold",
    "x-amz-tagging-count", "x-amz-replication-status", "x-amz-restore", "x-amz-expiration",
    "x-amz-missing-meta",
})
_USER_METADATA_PREFIX = "x-amz-meta-"
# S3 caps user metadata at 2 KiB; an origin that allows more does not make an
# ObjectInfo (up to 8192 are remembered) grow without bound.
_MAX_OBJECT_HEADER_BYTES = 8 * 1024

# The object's checksums as a HEAD with `x-amz-checksum-mode: ENABLED` answers
# them (HeadObject reference, "Response Syntax"): one per algorithm S3 offers,
# and whether it is of the full object or composed of its parts' checksums.
_CHECKSUM_HEADERS = frozenset({
    "x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-crc64nvme",
    "x-amz-checksum-sha1", "x-amz-checksum-sha256", "x-amz-checksum-type",
})
# A base64 SHA-256 is 44 characters, a composite checksum adds "-<parts>":
# an origin that sends more is not remembered for it.
_MAX_CHECKSUM_HEADER_BYTES = 512

# Headers S3 defines on its error answers that say something the client needs:
# the region a bucket lives in (on a 301 PermanentRedirect or 400 answer to a
# request for the wrong region, S3 API Reference, HeadBucket and "Error
# responses"), and of a delete marker (GetObject and HeadObject references: a
# key whose current version is a delete marker is answered 404 with
# `x-amz-delete-marker: true`, a version that is one 405 with its
# `Last-Modified`; both with the marker's `x-amz-version-id`). Nothing else
# of an error answer is repeated: the request id is the sidecar's own, and a
# Retry-After is decided by the sidecar, which has already retried.
_ERROR_HEADERS = frozenset({"x-amz-bucket-region"})
_DELETE_MARKER = "x-amz-delete-marker"
_DELETE_MARKER_HEADERS = frozenset({_DELETE_MARKER, "x-amz-version-id", "last-modified"})
# Region names and version ids are short; an origin's odd answer stays bounded.
_MAX_ERROR_HEADER_BYTES = 2 * 1024


def _kept(http_headers: Mapping[str, str], wanted: Callable[[str], bool], limit: int
          ) -> tuple[tuple[str, str], ...]:
    """The headers whose lower-case name is `wanted`, in name order, while their
    names and values add up to at most `limit` bytes."""
    kept: list[tuple[str, str]] = []
    total = 0
    for name, value in sorted((name.lower(), value) for name, value in http_headers.items()):
        if not wanted(name):
            continue
        total += len(name) + len(value)
        if total > limit:
            break
        kept.append((name, value))
    return tuple(kept)


def object_headers(http_headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers of a HEAD answer (botocore's lower-cased HTTPHeaders) that
    describe the object, bounded in size."""
    return _kept(
        http_headers,
        lambda name: name in _OBJECT_HEADERS or name.startswith(_USER_METADATA_PREFIX),
        _MAX_OBJECT_HEADER_BYTES,
    )


def checksum_headers(http_headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The whole object's checksums of a HEAD answer asked with checksum mode
    on, bounded in size (none if the origin keeps none, or did not say)."""
    return _kept(http_headers, _CHECKSUM_HEADERS.__contains__, _MAX_CHECKSUM_HEADER_BYTES)


def object_size(response: Mapping[str, Any], bucket: str, key: str) -> int:
    """The object's size of a HEAD answer (botocore's parsed ContentLength).

    S3 always sends Content-Length on a HEAD (HeadObject reference); an
    S3-compatible store may leave it out, and without it no range can be
    planned. Such an answer is malformed, tried again like a broken body (a
    store with a proxy in front may drop it once), and never remembered: a
    size guessed from it would be served as the object's.
    """
    size = response.get("ContentLength")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise OriginMalformedAnswer(
            f"s3://{bucket}/{key}: the origin's HEAD answer has no usable Content-Length "
            f"({size!r})")
    return size


def error_headers(http_headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers of an origin's error answer that S3 defines for it and that
    the client's answer must carry too (see _ERROR_HEADERS), bounded in size."""
    lowered = {name.lower(): value for name, value in http_headers.items()}
    delete_marker = lowered.get(_DELETE_MARKER, "").strip().lower() == "true"
    return _kept(
        lowered,
        lambda name: name in _ERROR_HEADERS or (delete_marker and name in _DELETE_MARKER_HEADERS),
        _MAX_ERROR_HEADER_BYTES,
    )


def translate_client_error(exc: ClientError, bucket: str, key: str) -> OriginError:
    """botocore's error answers, as `translate_answer` says."""
    code, status = _answer_of(exc)
    return translate_answer(status, code, bucket, key, _headers_of(exc))


def translate_answer(
    status: int, code: str, bucket: str, key: str, headers: Mapping[str, str] | None = None,
) -> OriginError:
    """One place maps the origin's S3 error codes to the sidecar's error types;
    the error keeps what of the answer's `headers` S3 defines for it (error_headers)."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    kept = error_headers(headers or {})
    if code == "NoSuchBucket":
        return BucketNotFound(f"{where}: no such bucket", headers=kept)
    if code in ("NoSuchKey", "404", "NotFound") or status == 404:
        return ObjectNotFound(f"{where}: no such key", headers=kept)
    if code in ("AccessDenied", "403", "Forbidden") or status == 403:
        return OriginAccessDenied(f"{where}: access denied by the origin", headers=kept)
    if code in ("PreconditionFailed", "InvalidRange", "412", "416") or status in (412, 416):
        return OriginObjectChanged(f"{where}: the object changed at the origin")
    if is_throttling(status, code):
        return OriginThrottled(f"{where}: origin answered {status} {code}")
    return OriginUnavailable(f"{where}: origin answered {status or code}", headers=kept)


def _answer_of(exc: ClientError) -> tuple[str, int]:
    error: dict[str, Any] = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _headers_of(exc: ClientError) -> Mapping[str, str]:
    headers: Mapping[str, str] = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return headers


def judge(exc: Exception, bucket: str, key: str) -> Verdict:
    """What one failed attempt means, the library's exception translated."""
    if isinstance(exc, ClientError):
        code, status = _answer_of(exc)
        return _answered(status, code, bucket, key, _headers_of(exc))
    if isinstance(exc, OriginAnswered):
        return _answered(exc.status, exc.code, bucket, key, exc.head.fields)
    described = repr(exc) if not str(exc) else f"{type(exc).__name__}: {exc}"
    where = f"s3://{bucket}/{key}"
    if isinstance(exc, OriginObjectChanged):
        return Verdict(OriginObjectChanged(f"{where}: {exc}"), False, None, described)
    if isinstance(exc, ParamValidationError):
        # botocore checked the parameters before sending anything (a bucket
        # name outside its pattern): another attempt would be refused alike.
        # Its report names the parameter, then quotes its regexes at length.
        report = str(exc.kwargs.get("report") or exc).strip().splitlines() or [""]
        return Verdict(OriginRequestRefused(f"{where}: {report[0].split(': ', 1)[0]}"),
                       False, None, described)
    if isinstance(exc, NoCredentialsError):
        return Verdict(OriginUnavailable(f"{where}: origin call failed: {exc!r}"), False, None,
                       described)
    if isinstance(exc, (*_TRANSIENT, BotoCoreError, OSError)):
        return Verdict(None, True, None, described)
    if isinstance(exc, OriginError):
        return Verdict(exc, False, None, described)
    return Verdict(OriginUnavailable(f"{where}: origin call failed: {exc!r}"), False, None,
                   described)


def _answered(
    status: int, code: str, bucket: str, key: str, headers: Mapping[str, str]
) -> Verdict:
    if status == 304:
        # The sidecar's origin requests carry no If-None-Match nor
        # If-Modified-Since, the only conditions a 304 answers (RFC 9110
        # section 15.4.5): a wrong answer, as of a cache in between, tried
        # again like any other malformed one.
        return Verdict(None, True, None, "304 to a request with no such condition")
    retryable = is_retryable_answer(status, code)
    return Verdict(None if retryable else translate_answer(status, code, bucket, key, headers),
                   retryable, is_throttling(status, code), f"{status} {code}")
