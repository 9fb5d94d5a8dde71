"""Plain HTTP on loopback for the tests: a threaded server (what the test proxies
share), relaying one request to the upstream with the answer streamed back, and
one raw request sent exactly as written (no client library adding or fixing
headers)."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

# RFC 9110 §7.6.1: connection-specific fields, never forwarded by a proxy.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding",
                        "proxy-connection", "upgrade"})


class LoopbackServer:
    """`handler` served on 127.0.0.1 on a free port (over TLS with `tls`), from a
    daemon thread, until `stop`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler],
                 tls: ssl.SSLContext | None = None) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        scheme = "http"
        if tls is not None:  # HTTPS: each accepted connection does the handshake
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.endpoint = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def relay(
    handler: BaseHTTPRequestHandler, upstream: tuple[str, int], headers: dict[str, str],
    body: bytes | None, timeout: float,
    heard: Callable[[list[tuple[str, str]]], None] | None = None,
) -> None:
    """Send the handler's request (with `headers` and `body`) upstream and stream
    the answer back to its client; `heard` is given the upstream's answer
    headers before they go on."""
    connection = http.client.HTTPConnection(*upstream, timeout=timeout)
    response: http.client.HTTPResponse | None = None
    try:
        connection.request(handler.command, handler.path, body=body, headers=headers)
        response = connection.getresponse()
        if heard is not None:
            heard(response.getheaders())
        handler.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                handler.send_header(name, value)
        handler.end_headers()
        while chunk := response.read(256 * 1024):
            handler.wfile.write(chunk)
    except (BrokenPipeError, ConnectionResetError):
        handler.close_connection = True
    finally:
        # With `Connection: close` (moto) the socket belongs to the response,
        # which a client that hung up leaves half read.
        if response is not None:
            response.close()
        connection.close()


def raw_request(url: str, method: str, path: str, headers: dict[str, str] | None = None
                ) -> tuple[int, dict[str, str], bytes]:
    """Status, lower-cased headers and body of one request on a fresh connection."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def admin_call(url: str, method: str, path: str, body: object, token: str | None
               ) -> tuple[int, dict[str, Any]]:
    """A JSON call to the admin port (BODY as bytes, or encoded as JSON), with the
    bearer TOKEN when given; status and the answer's JSON."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.request(method, path, body=raw, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()
