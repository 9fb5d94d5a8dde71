"""A misbehaving origin: an HTTP proxy in front of the local S3 server that the
test scripts, request by request.

A rule names a method (and a key), a fault and how many requests it hits; the
first matching rule is applied, else the request is forwarded untouched. The
faults are those of real object stores and the networks before them: error
answers (500, 503, SlowDown XML), connection resets before and in the middle of
a body, a body that stalls, a body shorter than its range with a clean close
(Content-Length lying, or `Connection: close` without one), an over-long body,
an origin that ignores If-Match or Range (a 200 with the whole object; with
`after_bytes`, stalling after them as stall_mid_body does),
latency spikes, answers held back after the origin gave them (late_answer), and
a HEAD answer without a Content-Length or with one that is no number
(no_length, bad_length: S3 always sends it, an S3-compatible store may not),
and a body that trickles (`after_bytes` at a time, `seconds` apart, at full
speed again once the proxy is cleared).
`before` runs just before a request is forwarded: an ETag flip is the object
really rewritten in moto between the sidecar's HEAD and its GET. `down` makes
the whole origin answer
503 (or reset every connection) until it is cleared.

Like RecordingProxy: 127.0.0.1 on port 0, a thread per connection, every wait
interruptible, always stopped. Bodies are small test objects, read whole.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from urllib.parse import unquote, urlsplit

from tests.support.loopback_http import HOP_BY_HOP, LoopbackServer

KINDS = (
    "status", "reset_before_body", "reset_mid_body", "stall_mid_body", "truncate",
    "truncate_close", "overlong", "overlong_close", "latency", "late_answer",
    "ignore_if_match", "ignore_range", "no_length", "bad_length", "trickle", "pass",
)
# What a bad_length fault sends as the HEAD answer's Content-Length.
BAD_LENGTH = "twelve"


@dataclass(frozen=True)
class Fault:
    kind: str
    status: int = 503
    code: str = "ServiceUnavailable"
    after_bytes: int = 0  # body bytes sent before a mid-body fault
    seconds: float = 0.0  # stall or latency
    extra: int = 0  # bytes an over-long body carries beyond its range

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


@dataclass
class Rule:
    fault: Fault
    method: str
    key: str | None
    times: int | None  # None: every matching request
    before: Callable[[], None] | None = None
    hits: int = 0


@dataclass(frozen=True)
class Seen:
    method: str
    key: str
    range: str | None
    if_match: str | None
    fault: str | None


@dataclass
class _Upstream:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def error_body(code: str, message: str = "injected by the fault proxy") -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>FAULTPROXY</RequestId></Error>"
    ).encode()


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._wake = threading.Event()
        self.down: str | None = None  # "503" or "reset": the whole origin fails
        self.seen: list[Seen] = []
        self._http: LoopbackServer | None = None
        self.endpoint = ""

    def add(
        self, fault: Fault, method: str = "GET", key: str | None = None,
        times: int | None = 1, before: Callable[[], None] | None = None,
    ) -> Rule:
        rule = Rule(fault, method, key, times, before)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Heal the origin: no rules, not down, and every stall ends now."""
        with self._lock:
            self._rules.clear()
            self.down = None
            wake, self._wake = self._wake, threading.Event()
        wake.set()

    def requests(self, method: str | None = None, key: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen
                    if (method is None or s.method == method) and (key is None or s.key == key)]

    def _take(self, method: str, key: str) -> tuple[Rule | None, str | None, threading.Event]:
        with self._lock:
            wake = self._wake
            for rule in self._rules:
                if rule.method == method and rule.key in (None, key) and (
                        rule.times is None or rule.hits < rule.times):
                    rule.hits += 1
                    return rule, self.down, wake
            return None, self.down, wake

    def __enter__(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except (BrokenPipeError, ConnectionResetError, OSError, ValueError):
                    # The sidecar gave up on this connection (its own timeout)
                    # or a fault closed it: nothing more to say on it.
                    self.close_connection = True

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request_body = self.rfile.read(length) if length else None
                key = unquote(self.path.partition("?")[0].lstrip("/").partition("/")[2])
                rule, down, wake = proxy._take(self.command, key)
                fault = rule.fault if rule is not None else None
                with proxy._lock:
                    proxy.seen.append(Seen(
                        self.command, key, self.headers.get("Range"),
                        self.headers.get("If-Match"),
                        f"down:{down}" if down else (fault.kind if fault else None),
                    ))
                if down == "reset":
                    self._reset()
                    return
                if down is not None:
                    self._error(503, "ServiceUnavailable")
                    return
                if rule is not None and rule.before is not None:
                    rule.before()
                if fault is None or fault.kind == "pass":
                    self._send(self._forward(request_body))
                    return
                kind = fault.kind
                if kind == "latency":
                    wake.wait(fault.seconds)
                    self._send(self._forward(request_body))
                elif kind == "late_answer":
                    # The origin answers at once; the answer arrives late, so it
                    # can describe an object rewritten meanwhile.
                    answer = self._forward(request_body)
                    wake.wait(fault.seconds)
                    self._send(answer)
                elif kind == "status":
                    self._error(fault.status, fault.code)
                elif kind == "reset_before_body":
                    self._reset()
                elif kind in ("no_length", "bad_length"):
                    self._head_length(self._forward(request_body), kind)
                elif kind in ("ignore_if_match", "ignore_range"):
                    dropped = "if-match" if kind == "ignore_if_match" else "range"
                    answer = self._forward(request_body, drop=(dropped,))
                    if fault.after_bytes:  # and then stalls, as stall_mid_body does
                        self._body_fault(replace(fault, kind="stall_mid_body"), answer, wake)
                    else:
                        self._send(answer)
                else:
                    self._body_fault(fault, self._forward(request_body), wake)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

            def _forward(self, body: bytes | None, drop: tuple[str, ...] = ()) -> _Upstream:
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in HOP_BY_HOP and k.lower() not in drop}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    kept = [(k, v) for k, v in response.getheaders()
                            if k.lower() not in HOP_BY_HOP]
                    return _Upstream(response.status, kept, data)
                finally:
                    upstream.close()

            def _head(self, answer: _Upstream, length: int | None,
                      close: bool = False) -> None:
                self.send_response(answer.status)
                for name, value in answer.headers:
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                if length is not None:
                    self.send_header("Content-Length", str(length))
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()

            def _send(self, answer: _Upstream) -> None:
                declared = dict((k.lower(), v) for k, v in answer.headers).get("content-length")
                self._head(answer, int(declared) if declared is not None else len(answer.body))
                if self.command != "HEAD":
                    self.wfile.write(answer.body)

            def _head_length(self, answer: _Upstream, kind: str) -> None:
                if answer.status >= 300 or self.command != "HEAD":
                    self._send(answer)  # a HEAD's fault: a body needs its length
                    return
                self.send_response(answer.status)
                for name, value in answer.headers:
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                if kind == "bad_length":
                    self.send_header("Content-Length", BAD_LENGTH)
                self.end_headers()

            def _body_fault(self, fault: Fault, answer: _Upstream, wake: threading.Event
                            ) -> None:
                if answer.status >= 300 or self.command == "HEAD":
                    self._send(answer)  # faults of bodies apply to bodies
                    return
                body, cut = answer.body, min(fault.after_bytes, len(answer.body))
                if fault.kind == "reset_mid_body":
                    self._head(answer, len(body))
                    self.wfile.write(body[:cut])
                    self._reset()
                elif fault.kind == "stall_mid_body":
                    self._head(answer, len(body))
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    if cut < len(body):  # a body shorter than that is whole: no stall
                        wake.wait(fault.seconds)
                        self.wfile.write(body[cut:])
                elif fault.kind == "truncate":  # Content-Length promises more than comes
                    self._head(answer, len(body), close=True)
                    self.wfile.write(body[:cut])
                elif fault.kind == "truncate_close":  # no length: the close ends the body
                    self._head(answer, None, close=True)
                    self.wfile.write(body[:cut])
                elif fault.kind == "trickle":
                    self._head(answer, len(body))
                    step = max(1, fault.after_bytes)
                    for at in range(0, len(body), step):
                        self.wfile.write(body[at:at + step])
                        self.wfile.flush()
                        if at + step < len(body):
                            wake.wait(fault.seconds)
                elif fault.kind == "overlong":  # a consistent length, too many bytes
                    self._head(answer, len(body) + fault.extra)
                    self.wfile.write(body + b"\xee" * fault.extra)
                elif fault.kind == "overlong_close":
                    self._head(answer, None, close=True)
                    self.wfile.write(body + b"\xee" * fault.extra)

            def _error(self, status: int, code: str) -> None:
                body = error_body(code) if self.command != "HEAD" else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(error_body(code))))
                self.end_headers()
                self.wfile.write(body)

            def _reset(self) -> None:
                # SO_LINGER with a zero timeout: close() sends RST, not FIN.
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.close_connection = True
                self.connection.close()

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
        self.clear()
        self._http.stop()
