"""A proxy in front of the local S3 server that checks the sidecar's signatures.

moto accepts any signature, so pass-through tests put this between the sidecar
and moto. For every request it recomputes the SigV4 signature with botocore from
what arrived (method, path, query decoded and re-encoded as a server does, the
signed headers, x-amz-content-sha256) and the test credentials, and, when the
payload hash is a hex SHA-256, hashes the body. Presigned requests (the
signature in the query, as the sidecar's block GETs are) are checked the same
way, with S3's query-string rules: UNSIGNED-PAYLOAD, X-Amz-Signature left out
of the canonical query, and the expiry enforced. Failures are collected in
`failures` (and the request is refused with 403, as S3 would); `verified` counts
the requests that passed, and `answers` holds the headers the origin answered
each of them with.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from urllib.parse import parse_qsl, urlsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sidecar.tools.local_s3 import CREDENTIALS
from tests.support.loopback_http import HOP_BY_HOP, LoopbackServer, relay


def expected_signature(
    method: str, host: str, raw_path: str, headers: dict[str, str], region: str = "us-east-1"
) -> tuple[str, str]:
    """(signature the test credentials give, signature the request carries)."""
    authorization = headers.get("authorization", "")
    assert authorization.startswith("AWS4-HMAC-SHA256 "), f"not SigV4: {authorization!r}"
    fields = dict(
        part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 "):].split(",")
    )
    access_key, date, scope_region, service, _ = fields["Credential"].split("/")
    assert access_key == CREDENTIALS["AWS_ACCESS_KEY_ID"], access_key
    assert (scope_region, service) == (region, "s3"), fields["Credential"]
    path, _, query = raw_path.partition("?")
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=b"")
    request.params = parse_qsl(query, keep_blank_values=True)
    for name in fields["SignedHeaders"].split(";"):
        assert name in headers, f"signed header {name} missing"
        if name != "host":
            request.headers[name] = headers[name]
    timestamp = headers["x-amz-date"]
    assert timestamp[:8] == date, (timestamp, date)
    request.context["timestamp"] = timestamp
    signer = S3SigV4Auth(
        Credentials(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]),
        "s3", region,
    )
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    return signature, fields["Signature"]


def expected_presigned_signature(
    method: str, host: str, raw_path: str, headers: dict[str, str], region: str = "us-east-1"
) -> tuple[str, str]:
    """Like `expected_signature`, for a SigV4 presigned URL (S3 API Reference,
    "Authenticating Requests: Using Query Parameters")."""
    path, _, query = raw_path.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    params = dict(pairs)
    assert params.get("X-Amz-Algorithm") == "AWS4-HMAC-SHA256", params.get("X-Amz-Algorithm")
    access_key, date, scope_region, service, _ = params["X-Amz-Credential"].split("/")
    assert access_key == CREDENTIALS["AWS_ACCESS_KEY_ID"], access_key
    assert (scope_region, service) == (region, "s3"), params["X-Amz-Credential"]
    timestamp = params["X-Amz-Date"]
    assert timestamp[:8] == date, (timestamp, date)
    signed_at = datetime.strptime(timestamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    expires = int(params["X-Amz-Expires"])
    assert datetime.now(UTC) <= signed_at + timedelta(seconds=expires), "presigned URL expired"
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=b"")
    request.params = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    for name in params["X-Amz-SignedHeaders"].split(";"):
        assert name in headers, f"signed header {name} missing"
        if name != "host":
            request.headers[name] = headers[name]
    request.context["timestamp"] = timestamp
    signer = S3SigV4QueryAuth(
        Credentials(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]),
        "s3", region, expires=expires,
    )
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    return signature, params["X-Amz-Signature"]


class VerifyingProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.failures: list[str] = []
        self.verified: list[tuple[str, str, str]] = []  # (method, path, payload hash)
        # (method, path, the origin's answer headers, names lower-cased)
        self.answers: list[tuple[str, str, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._http: LoopbackServer | None = None
        self.endpoint = ""

    def __enter__(self) -> VerifyingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    data = bytearray()
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if len(body) < length:
                    raise ConnectionAbortedError("the sender hung up mid-body")
                return body

            def _check(self, body: bytes) -> str | None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                presigned = "X-Amz-Signature=" in self.path
                check = expected_presigned_signature if presigned else expected_signature
                try:
                    expected, given = check(
                        self.command, headers.get("host", ""), self.path, headers
                    )
                except (AssertionError, KeyError, ValueError) as exc:
                    return f"{self.command} {self.path}: malformed signature: {exc!r}"
                if expected != given:
                    return f"{self.command} {self.path}: signature mismatch"
                declared = headers.get("x-amz-content-sha256", "")
                if len(declared) == 64 and hashlib.sha256(body).hexdigest() != declared:
                    return f"{self.command} {self.path}: body does not match x-amz-content-sha256"
                with proxy._lock:
                    proxy.verified.append((self.command, self.path, declared))
                return None

            def _forward(self) -> None:
                try:
                    body = self._body()
                except ConnectionAbortedError:
                    # As S3 does: a body shorter than its Content-Length stores nothing.
                    self.close_connection = True
                    return
                failure = self._check(body)
                if failure is not None:
                    with proxy._lock:
                        proxy.failures.append(failure)
                    message = b"<Error><Code>SignatureDoesNotMatch</Code></Error>"
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(message)
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                relay(self, proxy._upstream, headers, body or None, timeout=60,
                      heard=self._heard)

            def _heard(self, answer: list[tuple[str, str]]) -> None:
                with proxy._lock:
                    proxy.answers.append((self.command, self.path,
                                          {name.lower(): value for name, value in answer}))

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._http = LoopbackServer(Handler)
        self.endpoint = self._http.endpoint
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._http is not None
        self._http.stop()
