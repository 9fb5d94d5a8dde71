"""How a passed-through request's headers and body go to the origin. Pure: no I/O.

The sidecar re-signs what it passes on (sidecar.s3.passthrough): the client's
signature, Host and the connection's own fields are dropped, and the payload is
forwarded as the client framed it, or decoded from signed aws-chunked framing,
whose chunk signatures chain to the client's signature and cannot be re-signed
(https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Also pure: the framing's length is part of deciding how a body is forwarded.
from sidecar.numerals import parse_decimal
from sidecar.s3.aws_chunked import AwsChunkedDecoder, ChunkedFormatError, unsigned_trailer_length

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
    # DECODE and REFRAME: x-amz-decoded-content-length, the payload's length.
    decoded_length: int = 0


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
    try:
        length = parse_decimal(decoded)
    except ValueError:
        raise BadPayload("a streaming upload needs x-amz-decoded-content-length, "
                         "a number of ASCII digits") from None
    trailer = lower.get("x-amz-trailer", "").strip().lower()
    if match.group(2) and trailer:
        framed = unsigned_trailer_length(length, reframe_chunk, trailer)
        if framed is not None:
            return Payload(PayloadMode.REFRAME, STREAMING_UNSIGNED_TRAILER, framed, trailer,
                           declared, length)
    return Payload(PayloadMode.DECODE, UNSIGNED_PAYLOAD, length, None, declared, length)


def outbound_headers(headers: Iterable[tuple[str, str]], payload: Payload) -> list[tuple[str, str]]:
    """The client's headers as forwarded: hop-by-hop fields (and those the
    Connection header names), the client's signature and Host dropped; the
    payload headers rewritten for a decoded body."""
    pairs = list(headers)
    named = connection_named(pairs)
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


def connection_named(headers: Iterable[tuple[str, str]]) -> set[str]:
    """The field names the Connection header lists (RFC 9110 section 7.6.1: a
    proxy removes them before forwarding), lower-cased."""
    return {
        token.strip().lower()
        for name, value in headers if name.lower() == "connection"
        for token in value.split(",") if token.strip()
    }


def _without_aws_chunked(value: str) -> str:
    return ",".join(t.strip() for t in value.split(",") if t.strip().lower() != "aws-chunked")


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The origin's response headers as sent to the client (hop-by-hop dropped)."""
    pairs = list(headers)
    named = connection_named(pairs)
    return [(n, v) for n, v in pairs if n.lower() not in HOP_BY_HOP and n.lower() not in named]


@dataclass
class DeclaredLength:
    """The decoded bytes of a signed aws-chunked body, gated by the length the
    signature covers (x-amz-decoded-content-length).

    The origin stores an object once it has received Content-Length bytes, so
    the last declared byte is held back until the caller has seen the framing
    end and every chunk signature hold (`release`); a byte past the declared
    length is refused as it arrives, never forwarded.
    """

    declared: int
    admitted: int = 0
    _held: bytes = b""

    def admit(self, piece: bytes | memoryview) -> bytes | memoryview:
        """What of ``piece`` may go to the origin now (possibly nothing)."""
        if self.admitted + len(piece) > self.declared:
            raise BadPayload("the aws-chunked body holds more bytes than "
                             "x-amz-decoded-content-length declares", "IncompleteBody")
        self.admitted += len(piece)
        if not piece or self.admitted < self.declared:
            return piece
        # The piece reaches the declared length: its last byte waits for release().
        self._held = bytes(piece[-1:])
        return piece[:-1]

    def release(self) -> bytes:
        """The held last byte, once the whole body has verified; BadPayload if
        the body was shorter than declared."""
        if self.admitted != self.declared:
            raise BadPayload("the aws-chunked body does not match x-amz-decoded-content-length",
                             "IncompleteBody")
        held, self._held = self._held, b""
        return held


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
