"""AWS Signature Version 4 verification of S3 requests (pure: no I/O, no clock).

Both forms S3 accepts are verified:
- the `Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`
  header (https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html);
- a presigned URL, `X-Amz-Algorithm`, `X-Amz-Credential`, `X-Amz-Date`,
  `X-Amz-Expires`, `X-Amz-SignedHeaders` and `X-Amz-Signature` in the query
  (https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html).

The signature covers a canonical request:

    METHOD \n CanonicalURI \n CanonicalQuery \n CanonicalHeaders \n \n SignedHeaders \n PayloadHash

S3 differs from other services in that the URI path is *not* normalised (no
dot-segment removal, no slash collapsing) and is URI-encoded once. The payload
hash is the `x-amz-content-sha256` header as given (a hex SHA-256,
`UNSIGNED-PAYLOAD` or one of the `STREAMING-*` values): the body is never
buffered here, and a forwarded body is checked against that hash by the origin
once the request is re-signed. A presigned URL signs `UNSIGNED-PAYLOAD` unless
the request carries the header.

Every `x-amz-*` header of the request must be among the signed ones, as S3
requires (403 AccessDenied, "There were headers present in the request which
were not signed"): the pass-through forwards such headers to the origin under
the sidecar's own signature, so an unsigned `x-amz-copy-source` added to a
presigned PUT would otherwise copy any object the sidecar may read. The one
exception is `x-amz-content-sha256` on a presigned URL: its value is the payload
hash of the canonical request, so the signature covers it all the same.

Signing keys are derived from the secret per (date, region, service); the caller
hands in a function from a credential to its signing key (None: unknown access
key), so it can cache them and so this module never holds the secrets.
Signatures are compared in constant time (hmac.compare_digest).

A verified request yields a ChunkSigner: what the chunk signatures of a signed
`aws-chunked` body chain to (its signing key, timestamp, scope and the
request's own signature as the seed), with the string-to-sign of a chunk and of
the trailer (https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html,
sigv4-streaming-trailers.html). sidecar.s3.aws_chunked checks the chain.
"""

from __future__ import annotations

import calendar
import enum
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import NamedTuple
from urllib.parse import quote, unquote_to_bytes

from sidecar.numerals import is_decimal

ALGORITHM = "AWS4-HMAC-SHA256"
# S3 refuses a request whose time is more than 15 minutes from its own
# ("RequestTimeTooSkewed").
MAX_SKEW_S = 15 * 60
# S3's bound on X-Amz-Expires: seven days.
MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# \Z, not $: `$` also matches before a final newline. [0-9], not \d: \d takes
# every script's digits in a str pattern.
_TIMESTAMP_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z\Z")
_DATE_RE = re.compile(r"^[0-9]{8}\Z")
_SIGNATURE_RE = re.compile(r"^[0-9a-f]{64}$")
_PAYLOAD_HASH_RE = re.compile(r"^([0-9a-f]{64}|UNSIGNED-PAYLOAD|STREAMING-[A-Z0-9-]{1,64})$")
# RFC 3986 §2.3 unreserved characters stay as they are; quote() always keeps
# ASCII letters, digits and "_.-~".
_QUERY_SAFE = ""
_PATH_SAFE = "/"
# Text already encoded once as SigV4 wants it: unreserved characters (and '/'
# in a path), and upper-case escapes of every other byte. Decoding and encoding
# it again gives it back unchanged, so a request's usual path and query are not
# worked out again. The look-ahead refuses escapes of what quote() keeps as it
# is: digits (%30-39), letters (%41-5A, %61-7A), '-' '.' '_' '~' (%2D %2E %5F
# %7E), and '/' (%2F) in a path.
_KEPT_ESCAPES = r"3[0-9]|4[1-9A-F]|5[0-9A]|6[1-9A-F]|7[0-9A]|2[DE]|5F|7E"
_CANONICAL_QUERY_RE = re.compile(rf"(?:[A-Za-z0-9_.~-]|%(?!{_KEPT_ESCAPES})[0-9A-F]{{2}})*\Z")
_CANONICAL_PATH_RE = re.compile(rf"(?:[A-Za-z0-9_.~/-]|%(?!{_KEPT_ESCAPES}|2F)[0-9A-F]{{2}})*\Z")
_QUERY_AUTH_PARAMS = frozenset({
    "x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires",
    "x-amz-signedheaders", "x-amz-signature",
})
# x-amz-* headers a presigned request may carry unsigned (see the module docstring).
_UNSIGNED_OK_PRESIGNED = frozenset({"x-amz-content-sha256"})
# Query parameters that make a request a presigned one; AWSAccessKeyId is
# Signature Version 2's, refused as such rather than taken for anonymous.
_PRESIGN_MARKERS = (b"x-amz-algorithm", b"x-amz-signature", b"x-amz-credential",
                    b"awsaccesskeyid")


class Reason(enum.Enum):
    """Why a request was refused (the label of sidecar_auth_failures_total)."""

    UNSIGNED = "unsigned"
    MALFORMED = "malformed"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    SKEWED = "skewed"


class SignatureRejected(Exception):
    """The request's signature does not prove it; `message` never holds a secret."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Credential:
    """`AKID/20260101/us-east-1/s3/aws4_request`: who signed, and the key's scope."""

    access_key: str
    date: str
    region: str
    service: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


@dataclass(frozen=True)
class _Signed:
    """What a request claims: parsed from its Authorization header or its query."""

    presigned: bool
    credential: Credential
    signed_headers: tuple[str, ...]
    signature: str
    timestamp: str
    expires_s: int | None


@dataclass(frozen=True)
class ChunkSigner:
    """What the signatures of a signed aws-chunked body chain to.

    `key` is the signing key derived from the client's secret: it stays out of
    repr (and so out of logs and errors).
    """

    key: bytes = field(repr=False)
    timestamp: str
    scope: str
    seed: str  # the request's own signature: the first chunk's "previous signature"

    def chunk_signature(self, previous: str, chunk_sha256: str) -> str:
        """A chunk's signature: its string to sign is "AWS4-HMAC-SHA256-PAYLOAD",
        timestamp, scope, the previous signature, the hash of nothing (the chunk
        has no headers) and the hash of the chunk's data, one a line."""
        return self._sign(f"{ALGORITHM}-PAYLOAD", previous, _EMPTY_SHA256, chunk_sha256)

    def trailer_signature(self, previous: str, trailer_sha256: str) -> str:
        """The trailer's signature, over the hash of its `name:value\\n` lines."""
        return self._sign(f"{ALGORITHM}-TRAILER", previous, trailer_sha256)

    def _sign(self, algorithm: str, *lines: str) -> str:
        text = "\n".join((algorithm, self.timestamp, self.scope, *lines))
        return hmac.new(self.key, text.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Verified:
    """A request whose signature holds: who signed it, and what its body's chunk
    signatures (if any) must chain to."""

    access_key: str
    chunk_signer: ChunkSigner
    # The lower-cased names of the headers the signature covers: none of them
    # may be dropped on the way to the origin (sidecar.s3.dataport).
    signed_headers: frozenset[str] = frozenset()


SigningKeyFor = Callable[[Credential], bytes | None]

# Presigned URLs remembered once verified (PresignedMemo). A request target is
# at most aiohttp's 8 KiB request line: a full memo holds about 2 MiB.
PRESIGNED_MEMO_SIZE = 256


@dataclass(frozen=True)
class _Remembered:
    signed: _Signed
    covered: tuple[tuple[str, ...], ...]  # what the signature covers outside the target
    key: bytes = field(repr=False)
    verified: Verified


class PresignedMemo:
    """Presigned URLs that verified, by method and request target (the query
    holds the signature), so that the next request with the same URL is
    checked without working out its canonical request and HMAC again. A reader
    streaming an object signs one URL and sends it with every range it reads.

    What the signature covers beyond the target (the signed headers' values and
    the payload hash, as sent) must be the same; what may change between two
    uses is checked again: the time against the URL's expiry, the signing key
    (a rotated secret), and unsigned x-amz-* headers. A refused request is
    never remembered, nor a header-signed one (its signature changes with its
    date). Bounded: when full, the oldest entry goes. Looked up by dict, whose
    string hashes are keyed per process: a guessed signature is compared byte
    by byte with a remembered one only on a 64-bit hash collision."""

    def __init__(self, capacity: int = PRESIGNED_MEMO_SIZE) -> None:
        self._capacity = capacity
        self._entries: dict[tuple[str, str], _Remembered] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _recall(
        self, method: str, raw_path: str, headers: dict[str, list[str]],
        signing_key_for: SigningKeyFor, now: float,
    ) -> Verified | None:
        """The remembered verification, if it holds for this request; None to
        verify it in full. Raises SignatureRejected as verify would."""
        remembered = self._entries.get((method, raw_path))
        if remembered is None or "authorization" in headers:
            return None
        signed = remembered.signed
        if _covered(signed, headers) != remembered.covered:
            return None
        _check_amz_headers_signed(signed, headers)
        key = signing_key_for(signed.credential)
        if key is None or not hmac.compare_digest(key, remembered.key):
            return None
        _check_time(signed, now)
        return remembered.verified

    def _remember(self, method: str, raw_path: str, remembered: _Remembered) -> None:
        if len(self._entries) >= self._capacity:
            del self._entries[next(iter(self._entries))]
        self._entries[(method, raw_path)] = remembered


def _covered(signed: _Signed, headers: dict[str, list[str]]) -> tuple[tuple[str, ...], ...]:
    """The values, as sent, of what a signature covers outside the request
    target: its signed headers and the payload hash."""
    return (*(tuple(headers.get(name, ())) for name in signed.signed_headers),
            tuple(headers.get("x-amz-content-sha256", ())))


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")."""
    key = _hmac(("AWS4" + secret).encode("utf-8"), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


class _Query(NamedTuple):
    """A request's query, parsed once: its pairs as sent (percent-encoded), each
    name percent-decoded and lower-cased (as _auth_params matches them), and
    whether it carries a presigned URL's signature (valid or not)."""

    raw: str
    pairs: list[tuple[str, str]]
    names: list[str]
    presigned: bool


def _parse_query(raw_query: str) -> _Query:
    pairs: list[tuple[str, str]] = []
    for pair in raw_query.split("&"):
        if pair:
            name, _, value = pair.partition("=")
            pairs.append((name, value))
    names: list[str] = []
    presigned = False
    for name, _ in pairs:
        if "%" not in name and name.isascii():
            lowered = name.lower()  # nothing to decode: both lowerings agree
            presigned = presigned or lowered.encode() in _PRESIGN_MARKERS
        else:
            raw = unquote_to_bytes(name)
            lowered = raw.decode("utf-8", "replace").lower()
            # The markers are matched on bytes, lower-cased as ASCII only.
            presigned = presigned or raw.lower() in _PRESIGN_MARKERS
        names.append(lowered)
    return _Query(raw_query, pairs, names, presigned)


def _auth_params(query: _Query) -> dict[str, str]:
    """The X-Amz-* auth parameters of a query, percent-decoded (names case-insensitive)."""
    found: dict[str, str] = {}
    for lowered, (_, value) in zip(query.names, query.pairs, strict=True):
        if lowered in _QUERY_AUTH_PARAMS:
            if lowered in found:
                raise SignatureRejected(Reason.MALFORMED, f"Query parameter {lowered} is repeated.")
            found[lowered] = unquote_to_bytes(value).decode("utf-8", "replace")
    return found


def is_signed(raw_path: str, headers: Iterable[tuple[str, str]]) -> bool:
    """Whether the request carries a signature of either form (valid or not)."""
    if any(name.lower() == "authorization" for name, _ in headers):
        return True
    return _parse_query(raw_path.partition("?")[2]).presigned


def _parse_credential(text: str) -> Credential:
    parts = text.rsplit("/", 4)
    if len(parts) != 5 or parts[4] != "aws4_request" or not all(parts[:4]):
        raise SignatureRejected(
            Reason.MALFORMED,
            "The credential is not of the form AKID/YYYYMMDD/region/service/aws4_request.",
        )
    access_key, date, region, service = parts[:4]
    if not _DATE_RE.match(date):
        raise SignatureRejected(Reason.MALFORMED, "The credential's date is not YYYYMMDD.")
    if service != "s3":
        raise SignatureRejected(Reason.MALFORMED, "The credential is not scoped to service s3.")
    return Credential(access_key, date, region, service)


def _parse_signed_headers(text: str) -> tuple[str, ...]:
    names = tuple(text.split(";"))
    if not all(names) or any(name != name.lower() or name != name.strip() for name in names):
        raise SignatureRejected(Reason.MALFORMED, "SignedHeaders must be lower-case names.")
    if "host" not in names:
        raise SignatureRejected(Reason.MALFORMED, "The host header must be signed.")
    return names


def _parse_authorization(value: str) -> tuple[Credential, tuple[str, ...], str]:
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SignatureRejected(
            Reason.MALFORMED, f"Only {ALGORITHM} (Signature Version 4) is accepted."
        )
    fields: dict[str, str] = {}
    for component in rest.split(","):
        name, eq, field_value = component.strip().partition("=")
        if not eq or name in fields:
            raise SignatureRejected(Reason.MALFORMED, "The Authorization header is malformed.")
        fields[name] = field_value
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise SignatureRejected(
            Reason.MALFORMED,
            "The Authorization header needs exactly Credential, SignedHeaders and Signature.",
        )
    return (
        _parse_credential(fields["Credential"]),
        _parse_signed_headers(fields["SignedHeaders"]),
        fields["Signature"],
    )


def _amz_timestamp_from_http_date(value: str) -> str:
    try:
        parsed = parsedate_to_datetime(value)
        # RFC 9110 §5.6.7: an HTTP date is in GMT; a zone-less one is taken as GMT.
        epoch = parsed.timestamp() if parsed.tzinfo else calendar.timegm(parsed.timetuple())
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch))
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        raise SignatureRejected(Reason.MALFORMED, "The Date header is not an HTTP date.") from None


def _claims(query: _Query, headers: dict[str, list[str]]) -> _Signed:
    presigned = query.presigned
    authorization = headers.get("authorization", [])
    if presigned and authorization:
        raise SignatureRejected(
            Reason.MALFORMED, "Only one auth mechanism allowed: header or query string."
        )
    if len(authorization) > 1:
        raise SignatureRejected(Reason.MALFORMED, "More than one Authorization header.")
    if authorization:
        credential, signed_headers, signature = _parse_authorization(authorization[0])
        dates = headers.get("x-amz-date", [])
        if len(dates) > 1:
            raise SignatureRejected(Reason.MALFORMED, "More than one X-Amz-Date header.")
        if dates:
            timestamp = dates[0].strip()
        elif len(headers.get("date", [])) == 1:
            timestamp = _amz_timestamp_from_http_date(headers["date"][0])
        else:
            raise SignatureRejected(Reason.MALFORMED, "The request has no X-Amz-Date or Date.")
        if "x-amz-content-sha256" not in headers:
            raise SignatureRejected(
                Reason.MALFORMED, "Missing required header for this request: x-amz-content-sha256."
            )
        expires: int | None = None
    else:
        params = _auth_params(query)
        if "x-amz-algorithm" not in params and "AWSAccessKeyId=" in query.raw:
            raise SignatureRejected(
                Reason.MALFORMED, f"Only {ALGORITHM} (Signature Version 4) is accepted."
            )
        missing = sorted(_QUERY_AUTH_PARAMS - set(params))
        if missing:
            raise SignatureRejected(
                Reason.MALFORMED, f"The presigned URL lacks the query parameter {missing[0]}."
            )
        if params["x-amz-algorithm"] != ALGORITHM:
            raise SignatureRejected(
                Reason.MALFORMED, f"Only {ALGORITHM} (Signature Version 4) is accepted."
            )
        credential = _parse_credential(params["x-amz-credential"])
        signed_headers = _parse_signed_headers(params["x-amz-signedheaders"])
        signature = params["x-amz-signature"]
        timestamp = params["x-amz-date"]
        text = params["x-amz-expires"]
        # ASCII digits of a bounded length: int() of 5,000 digits raises, of '²' too.
        if not is_decimal(text, 7) or not 1 <= int(text) <= MAX_PRESIGN_EXPIRES_S:
            raise SignatureRejected(
                Reason.MALFORMED,
                f"X-Amz-Expires must be a number of seconds from 1 to {MAX_PRESIGN_EXPIRES_S}.",
            )
        expires = int(text)
    if not _TIMESTAMP_RE.match(timestamp):
        raise SignatureRejected(Reason.MALFORMED, "X-Amz-Date is not of the form YYYYMMDDTHHMMSSZ.")
    if timestamp[:8] != credential.date:
        raise SignatureRejected(
            Reason.MALFORMED, "The credential's date does not match the request's date."
        )
    return _Signed(not authorization, credential, signed_headers, signature, timestamp, expires)


def _epoch(timestamp: str) -> float:
    """`timestamp` has passed _TIMESTAMP_RE (YYYYMMDDTHHMMSSZ): its fields are
    read by position, which its fixed layout allows and which costs a request
    less than a format parser."""
    try:
        return datetime(int(timestamp[0:4]), int(timestamp[4:6]), int(timestamp[6:8]),
                        int(timestamp[9:11]), int(timestamp[11:13]), int(timestamp[13:15]),
                        tzinfo=UTC).timestamp()
    except ValueError:
        raise SignatureRejected(Reason.MALFORMED, "X-Amz-Date is not a valid time.") from None


def _check_time(signed: _Signed, now: float) -> None:
    signed_at = _epoch(signed.timestamp)
    if signed.expires_s is not None and now > signed_at + signed.expires_s:
        raise SignatureRejected(Reason.EXPIRED, "Request has expired.")
    # A presigned URL may be used long after it was made, but not before.
    too_old = signed.expires_s is None and now - signed_at > MAX_SKEW_S
    if too_old or signed_at - now > MAX_SKEW_S:
        raise SignatureRejected(
            Reason.SKEWED,
            "The difference between the request time and the server's time is too large.",
        )


def _canonical_uri_candidates(path: str) -> list[str]:
    """The URI-encoded-once path, and (if different) the path exactly as sent.

    Clients encode the key into the path themselves (botocore and the AWS SDKs
    with RFC 3986 rules) and sign that; re-encoding the decoded path gives the
    same string for them and for any client that encodes a character it did not
    have to. Both candidates name the same key, so accepting either admits no
    request for another object.
    """
    path = path or "/"
    encoded = _encoded_once(path, _PATH_SAFE, _CANONICAL_PATH_RE)
    return [encoded] if encoded == path else [encoded, path]


def _encoded_once(text: str, safe: str, canonical: re.Pattern[str]) -> str:
    """``text`` percent-decoded, then URI-encoded as SigV4 wants it. Text that
    ``canonical`` matches would come back as it is: it is not worked out again."""
    if canonical.match(text):
        return text
    return quote(unquote_to_bytes(text), safe=safe)


def _canonical_query_candidates(query: _Query) -> list[str]:
    pairs = query.pairs
    if query.presigned:
        pairs = [pair for pair, lowered in zip(pairs, query.names, strict=True)
                 if lowered != "x-amz-signature"]
    encoded = sorted(
        (_encoded_once(name, _QUERY_SAFE, _CANONICAL_QUERY_RE),
         _encoded_once(value, _QUERY_SAFE, _CANONICAL_QUERY_RE))
        for name, value in pairs
    )
    canonical = "&".join(f"{name}={value}" for name, value in encoded)
    as_sent = "&".join(f"{name}={value}" for name, value in sorted(pairs))
    return [canonical] if canonical == as_sent else [canonical, as_sent]


def _check_amz_headers_signed(signed: _Signed, headers: dict[str, list[str]]) -> None:
    exempt = _UNSIGNED_OK_PRESIGNED if signed.presigned else frozenset()
    unsigned = sorted(
        name for name in headers
        if name.startswith("x-amz-") and name not in signed.signed_headers and name not in exempt
    )
    if unsigned:
        raise SignatureRejected(
            Reason.MALFORMED,
            "There were headers present in the request which were not signed: "
            + ", ".join(unsigned)[:200] + ".",
        )


def _canonical_headers(signed: _Signed, headers: dict[str, list[str]]) -> str:
    lines = []
    for name in signed.signed_headers:
        values = headers.get(name)
        if values is None:
            raise SignatureRejected(
                Reason.BAD_SIGNATURE, "A header named in SignedHeaders is not in the request."
            )
        # "Trimall": trim, and collapse runs of white space to one space.
        lines.append(f"{name}:{','.join(' '.join(value.split()) for value in values)}\n")
    return "".join(lines)


def canonical_requests(
    method: str, raw_path: str, headers: Sequence[tuple[str, str]]
) -> list[str]:
    """The canonical request(s) the signature may cover (see _canonical_uri_candidates)."""
    by_name = _headers_by_name(headers)
    query = _parse_query(raw_path.partition("?")[2])
    return _canonical_requests(method, raw_path, query, by_name, _claims(query, by_name))


def _canonical_requests(
    method: str, raw_path: str, query: _Query, headers: dict[str, list[str]], signed: _Signed
) -> list[str]:
    path = raw_path.partition("?")[0]
    payload_hashes = headers.get("x-amz-content-sha256", [])
    if len(payload_hashes) > 1:
        raise SignatureRejected(Reason.MALFORMED, "More than one x-amz-content-sha256 header.")
    payload_hash = payload_hashes[0].strip() if payload_hashes else UNSIGNED_PAYLOAD
    if not _PAYLOAD_HASH_RE.match(payload_hash):
        raise SignatureRejected(
            Reason.MALFORMED, "x-amz-content-sha256 is not a SHA-256 or a known payload mode."
        )
    tail = (
        f"{_canonical_headers(signed, headers)}\n{';'.join(signed.signed_headers)}\n{payload_hash}"
    )
    # The method as sent: methods are case-sensitive (RFC 9110 section 9.1), so a
    # signature over GET does not vouch for a "get" (found by tests/fuzz).
    return [
        f"{method}\n{uri}\n{canonical_query}\n{tail}"
        for uri in _canonical_uri_candidates(path)
        for canonical_query in _canonical_query_candidates(query)
    ]


def string_to_sign(timestamp: str, scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{timestamp}\n{scope}\n{digest}"


def _headers_by_name(headers: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value)
    return by_name


def verify(
    method: str,
    raw_path: str,
    headers: Sequence[tuple[str, str]],
    signing_key_for: SigningKeyFor,
    now: float,
    memo: PresignedMemo | None = None,
) -> Verified:
    """Check a signed request; return who signed it and its ChunkSigner.

    `raw_path` is the request target as sent (path and query, percent-encoded),
    `headers` every header in order (repeats kept), `now` the epoch time,
    `memo` presigned URLs verified before (remembered there once verified).
    Raises SignatureRejected.
    """
    by_name = _headers_by_name(headers)
    if memo is not None:
        recalled = memo._recall(method, raw_path, by_name, signing_key_for, now)
        if recalled is not None:
            return recalled
    query = _parse_query(raw_path.partition("?")[2])
    if "authorization" not in by_name and not query.presigned:
        raise SignatureRejected(Reason.UNSIGNED, "Anonymous requests are not allowed here.")
    signed = _claims(query, by_name)
    _check_amz_headers_signed(signed, by_name)
    key = signing_key_for(signed.credential)
    if key is None:
        raise SignatureRejected(
            Reason.UNKNOWN_KEY, "The AWS access key Id you provided does not exist in our records."
        )
    _check_time(signed, now)
    if not _SIGNATURE_RE.match(signed.signature):
        raise SignatureRejected(Reason.MALFORMED, "The signature is not 64 lower-case hex digits.")
    given = signed.signature.encode("ascii")
    matched = False
    for canonical in _canonical_requests(method, raw_path, query, by_name, signed):
        expected = hmac.new(
            key, string_to_sign(signed.timestamp, signed.credential.scope, canonical).encode(),
            hashlib.sha256,
        ).hexdigest().encode("ascii")
        # No early exit: every candidate is compared, in constant time.
        matched |= hmac.compare_digest(expected, given)
    if not matched:
        raise SignatureRejected(
            Reason.BAD_SIGNATURE,
            "The request signature we calculated does not match the signature you provided.",
        )
    verified = Verified(
        signed.credential.access_key,
        ChunkSigner(key, signed.timestamp, signed.credential.scope, signed.signature),
        frozenset(signed.signed_headers),
    )
    if memo is not None and signed.presigned:
        memo._remember(method, raw_path,
                       _Remembered(signed, _covered(signed, by_name), key, verified))
    return verified
