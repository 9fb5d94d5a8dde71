"""Requests aiohttp refuses itself, before any handler of the sidecar runs.

aiohttp answers a request it cannot parse (a bad request line, a header line
longer than `max_line_size`, a Content-Length that is not a number) with 400
from its own error path (web_protocol's `handle_error`); an `Expect` it does
not know gets 417 from the router, before middlewares and handlers. No
handler runs, so neither `sidecar_requests_total` nor the access log sees it.

aiohttp's access logger is called after every answer, these included: it is
a public hook (AppRunner's `access_log_class`, an `AbstractAccessLogger`).
Each port's handlers mark the requests they see (`mark_handled`); an answer to
a request nobody marked is counted in `sidecar_malformed_requests_total{port,
code}`. Nothing here touches aiohttp's private state.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import Counter

HANDLED = web.RequestKey("sidecar_handled", bool)


def mark_handled(request: web.Request) -> None:
    """Say that a handler (or a middleware) of the sidecar saw `request`."""
    request[HANDLED] = True


def refusal_counter(counter: Counter, port: str) -> type[AbstractAccessLogger]:
    """An access logger class for `port` ("data", "admin", "metrics") that counts,
    by status, the answers to requests no handler of the sidecar saw."""

    class RefusedRequests(AbstractAccessLogger):
        def log(self, request: web.BaseRequest, response: web.StreamResponse,
                time: float) -> None:
            if not request.get(HANDLED, False):
                counter.labels(port, str(response.status)).inc()

        @property
        def enabled(self) -> bool:
            return True  # whatever the level of the logger aiohttp hands it

    return RefusedRequests
