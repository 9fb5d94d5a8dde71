"""Signed aws-chunked uploads as the AWS SDKs send them, written from the spec
(https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html and
sigv4-streaming-trailers.html) with hmac alone, not with the sidecar's code:
`STREAMING-AWS4-HMAC-SHA256-PAYLOAD` and its `-TRAILER` variant.

No botocore client sends these (botocore signs the whole payload, or sends
`STREAMING-UNSIGNED-PAYLOAD-TRAILER`); the AWS SDK for Java and the CRT do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ZERO_SIGNATURE = "0" * 64


def key_of(secret: str, date: str, region: str) -> bytes:
    key = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _sign(key: bytes, *lines: str) -> str:
    return hmac.new(key, "\n".join(lines).encode(), hashlib.sha256).hexdigest()


def crc32_trailer(data: bytes) -> tuple[str, str]:
    return "x-amz-checksum-crc32", base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def chunked_body(
    data: bytes, chunk: int, key: bytes, timestamp: str, scope: str, seed: str,
    trailer: tuple[str, str] | None = None, sign: bool = True,
) -> bytes:
    """The framed body: data cut into `chunk`-byte chunks, then the final empty
    chunk, then (with `trailer`) the trailer line and its signature. With
    sign=False every signature is zeros (same length: for sizing the body)."""
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
    out = bytearray()
    previous = seed
    for piece in pieces:
        signature = _sign(key, "AWS4-HMAC-SHA256-PAYLOAD", timestamp, scope, previous,
                          EMPTY_SHA256, hashlib.sha256(piece).hexdigest())
        previous = signature if sign else ZERO_SIGNATURE
        out += b"%x;chunk-signature=%s\r\n" % (len(piece), previous.encode())
        if piece:
            out += piece + b"\r\n"
    if trailer is not None:
        line = f"{trailer[0]}:{trailer[1]}"
        # The trailer's string to sign hashes its lines each ended by "\n".
        signature = _sign(key, "AWS4-HMAC-SHA256-TRAILER", timestamp, scope, previous,
                          hashlib.sha256(f"{line}\n".encode()).hexdigest())
        out += f"{line}\r\nx-amz-trailer-signature:{signature if sign else ZERO_SIGNATURE}\r\n"\
            .encode()
    return bytes(out + b"\r\n")


def signed_chunked(
    url: str, data: bytes, chunk: int, access_key: str, secret: str, trailer: bool = False,
    method: str = "PUT", region: str = "us-east-1", cut: int = 0, declared: int | None = None,
) -> tuple[dict[str, str], bytes]:
    """Headers (signed by botocore) and framed body of a signed streaming upload
    of `data` to `url`; with `trailer`, a CRC-32 checksum trailer. `cut`: the
    body loses its last `cut` bytes, and its signed Content-Length says so.
    `declared`: the signed x-amz-decoded-content-length, if not len(data)."""
    trailer_line = crc32_trailer(data) if trailer else None
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" + ("-TRAILER" if trailer else "")
    length = len(chunked_body(data, chunk, b"", "", "", "", trailer_line, sign=False))
    headers = {
        "x-amz-content-sha256": mode, "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data) if declared is None else declared),
        "Content-Length": str(length - cut),
    }
    if trailer_line is not None:
        headers["x-amz-trailer"] = trailer_line[0]
    request = AWSRequest(method=method, url=url, headers=headers, data=b"")
    signer = S3SigV4Auth(Credentials(access_key, secret), "s3", region)
    signer.payload = lambda request: mode  # type: ignore[method-assign]
    signer.add_auth(request)
    timestamp = request.context["timestamp"]
    seed = request.headers["Authorization"].rpartition("Signature=")[2]
    body = chunked_body(data, chunk, key_of(secret, timestamp[:8], region), timestamp,
                        signer.credential_scope(request), seed, trailer_line)
    return dict(request.headers.items()), body[:len(body) - cut]
