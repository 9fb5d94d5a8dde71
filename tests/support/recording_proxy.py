"""A recording HTTP proxy in front of the local S3 server.

The sidecar is pointed at it instead of at moto, so tests see every request the
sidecar makes to its origin (method, path, Range) and can assert alignment,
coalescing and "each block fetched once". Bodies are streamed, not buffered.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from urllib.parse import unquote, urlsplit

from tests.support.loopback_http import HOP_BY_HOP, LoopbackServer, relay


@dataclass(frozen=True)
class OriginRequest:
    method: str
    path: str
    range: str | None

    @property
    def key(self) -> str:
        return unquote(self.path.partition("?")[0].lstrip("/").partition("/")[2])

    def byte_range(self) -> tuple[int, int]:
        assert self.range is not None and self.range.startswith("bytes=")
        first, _, last = self.range[len("bytes="):].partition("-")
        return int(first), int(last)


class RecordingProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.requests: list[OriginRequest] = []
        self._lock = threading.Lock()
        self._http: LoopbackServer | None = None
        self.endpoint = ""

    def gets(self, key: str | None = None) -> list[OriginRequest]:
        with self._lock:
            return [r for r in self.requests
                    if r.method == "GET" and r.range is not None
                    and (key is None or r.key == key)]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def __enter__(self) -> RecordingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                with proxy._lock:
                    proxy.requests.append(
                        OriginRequest(self.command, self.path, self.headers.get("Range"))
                    )
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP}
                relay(self, proxy._upstream, headers, body, timeout=30)

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
