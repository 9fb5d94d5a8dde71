"""Admin port: /healthz, /readyz, /metrics, /ui, /api/v1/stats and the mutating calls.

Mutating calls always need `Authorization: Bearer <token>` (docs/ARCHITECTURE.md):
the operator's token, or the one generated into the token file at the first start
(sidecar.admin.token). Their bodies must be `application/json` (415 otherwise): a
browser sends a cross-site form post only as form data or text/plain without a
CORS preflight (Fetch standard, "CORS-safelisted request-header"), so no page a
local user opens can drive the port. Off loopback, /metrics, /ui and
/api/v1/stats need the token too (they name objects and show origin errors);
Prometheus then scrapes the token-free `metrics_app`, which serves /metrics only,
on its own address (`metrics_listen`). On loopback they need none, but are
served only under a loopback Host (sidecar.admin.host_names): 421 otherwise, so a
page that rebinds its own name to 127.0.0.1 cannot read them. A `metrics_listen`
on loopback answers only under a loopback Host too: it serves the same counters.

While the port runs, a sampler reads the counters every `sample_interval_s` into a
bounded ring (sidecar.admin.history): the stats' last-minute `window` and the
charts of /ui are rates between those samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.admin import ui, warm
from sidecar.admin.history import SampleRing, take_sample
from sidecar.admin.host_names import names_loopback
from sidecar.admin.stats import stats_snapshot
from sidecar.config.reloading import Reload
from sidecar.engine import Engine
from sidecar.errors import ConfigError
from sidecar.http_fields import undecodable_field
from sidecar.isolation.modes import ModeState, parse_mode
from sidecar.origin.client import Origin
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.refused import mark_handled

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_INTERVAL_S = 2.0
# 15 minutes at the default interval; about 1.4 KiB a sample (under 1 MiB in all).
HISTORY_SAMPLES = 450
# The stats' `window`: long enough to hold a few Kafka fetches of every reader,
# short enough that a collapse shows within the minute.
WINDOW_S = 60.0
# `?since=`: seconds since the epoch, ASCII decimal with an optional fraction.
_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")

# The index at `/` (GET): every endpoint of this port and what it is for.
ENDPOINTS = {
    "GET /healthz": "the process is up",
    "GET /readyz": "ready to serve (503 while not), with the mode and any disk problem",
    "GET /metrics": "Prometheus metrics (admin token off loopback; metrics_listen serves "
                    "them without one)",
    "GET /ui": "the operator's page: state, last-minute rates, charts, recent warm calls "
               "(admin token off loopback)",
    "GET /api/v1/stats": "hit rates, bytes and the cache, as JSON, with the rates of the "
                         "last minute; ?history=1 (or ?since=UNIX_TIME) adds the samples "
                         "behind /ui's charts (admin token off loopback)",
    "POST /api/v1/warm": 'warm blocks: {"objects": [{"bucket", "key", "start", "end"}], '
                         '"ttl_s"} (admin token)',
    "GET /api/v1/mode": "the download mode",
    "PUT /api/v1/mode": '{"mode": "normal|no-prefetch|cache-only|bypass"} (admin token)',
    "POST /api/v1/reload": "read the configuration again, as SIGHUP does; says what "
                           "changed and what needs a restart (admin token)",
    "DELETE /api/v1/cache/{bucket}/{key}": "purge an object's cached blocks (admin token)",
}


@web.middleware
async def _refuse_undecodable_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A header that is not UTF-8 (sidecar.http_fields) is a 400 before any handler
    compares it with the admin token or reads it. Every request the router
    takes passes here, so it is marked as seen by the sidecar (a 404 too)."""
    mark_handled(request)
    unreadable = undecodable_field(request.headers.items())
    if unreadable is not None:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"header {unreadable} is not valid UTF-8"}),
            content_type="application/json",
        )
    return await handler(request)


@web.middleware
async def _json_router_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The router's own answers to a wrong method (405) and an unknown path (404)
    are plain text; every other error of this port is a JSON object with "error",
    which is what scripts and `sidecar mode|purge` parse. The 405 keeps its Allow."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        raise web.HTTPMethodNotAllowed(
            request.method, exc.allowed_methods,
            text=json.dumps({"error": f"method {request.method} not allowed here "
                                      f"(allowed: {allowed})"}),
            content_type="application/json",
        ) from None
    except web.HTTPNotFound as exc:
        if exc.content_type == "application/json":
            raise
        raise web.HTTPNotFound(
            text=json.dumps({"error": "no such endpoint"}),
            content_type="application/json",
        ) from None


def _is_json(request: web.Request) -> bool:
    """A body declared as JSON, or no body at all (a bodiless POST such as a reload
    is no form post: a form always declares its type)."""
    if request.content_type == "application/json":
        return True
    return "Content-Type" not in request.headers and not request.body_exists


def _names_loopback(request: web.Request, listen_host: str) -> bool:
    """Whether the request's Host names loopback or the configured host (two Host
    fields name nothing: RFC 9112 section 3.2 allows one)."""
    hosts = request.headers.getall("Host", [])
    return len(hosts) <= 1 and names_loopback(hosts[0] if hosts else None, listen_host)


def _misdirected(served: str) -> web.HTTPMisdirectedRequest:
    # RFC 9110 section 15.5.20: not a name this port answers for.
    return web.HTTPMisdirectedRequest(
        text=json.dumps({"error": f"{served} only under a loopback Host "
                                  "(127.0.0.1, [::1] or localhost)"}),
        content_type="application/json",
    )


def metrics_app(metrics: Metrics, loopback_host: str | None = None) -> web.Application:
    """The token-free listener for Prometheus (`metrics_listen`): GET /metrics and
    nothing else, so what it shows is counters, never object names or errors.

    `loopback_host`: the configured host when the listener is on loopback; it then
    answers only under a loopback Host (or that host), as the admin port's pages
    do. The counters are the ones the admin port guards so (a rebound page would
    learn the node's traffic and cache state); a Prometheus on the node scrapes
    127.0.0.1, [::1] or localhost. None (off loopback): any Host, since a scraper
    there may use any of the node's names or addresses."""
    async def serve_metrics(request: web.Request) -> web.Response:
        if loopback_host is not None and not _names_loopback(request, loopback_host):
            raise _misdirected("this listener serves /metrics")
        return _exposition(metrics)

    application = web.Application(middlewares=[_json_router_errors, _refuse_undecodable_headers])
    application.router.add_get("/metrics", serve_metrics)
    return application


def _exposition(metrics: Metrics) -> web.Response:
    response = web.Response(body=generate_latest(metrics.registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


class AdminPort:
    def __init__(
        self,
        metrics: Metrics,
        is_ready: Callable[[], bool],
        engine: Engine,
        origin: Origin,
        token: str | None,
        modes: ModeState | None = None,
        cache_recovery: Callable[[], dict[str, Any] | None] | None = None,
        reload: Callable[[], Awaitable[Reload]] | None = None,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
        guard_reads: bool = False,
        listen_host: str = "",
        memory_tier_off: str | None = None,
    ) -> None:
        """`token`: the admin token (None: every mutating call is refused);
        `guard_reads`: /metrics, /ui and /api/v1/stats need it too (off loopback);
        `listen_host`: the host of the configured address, a Host they are served
        under besides the loopback names (when not guarded); `memory_tier_off`:
        why a memory tier asked for came out as none (the start-up warning), for
        the page to say instead of a bare "off"."""
        self._memory_tier_off = memory_tier_off
        self._metrics = metrics
        self._guard_reads = guard_reads
        self._listen_host = listen_host
        self._sample_interval_s = sample_interval_s
        self._samples = SampleRing(HISTORY_SAMPLES, sample_interval_s, started=time.time())
        self.warm_calls = warm.RecentWarmCalls()
        # What rebuilding the cache index at start found (cache.recovery in the stats).
        self._cache_recovery = cache_recovery
        self._is_ready = is_ready
        self._engine = engine
        self._origin = origin
        self._token = token
        self._modes = modes or ModeState()
        self._reload = reload

    def authorize(self, request: web.Request) -> None:
        """Raise 401 unless the request carries the admin token; 415 when it carries
        a body that is not declared JSON."""
        given = request.headers.get("Authorization", "")
        # Constant-time: the token is a secret compared with attacker input.
        if self._token is None or not hmac.compare_digest(
                given.encode(), f"Bearer {self._token}".encode()):
            raise web.HTTPUnauthorized(
                text='{"error": "missing or wrong admin token"}',
                content_type="application/json",
                headers={"WWW-Authenticate": 'Bearer realm="sidecar-admin"'},
            )
        if request.method in ("POST", "PUT") and not _is_json(request):
            raise web.HTTPUnsupportedMediaType(
                text=json.dumps({"error": "the body must be application/json, got "
                                          f"{request.content_type}"}),
                content_type="application/json",
            )

    def authorize_read(self, request: web.Request) -> None:
        """Off loopback, the pages that name objects and show errors need the token.
        On loopback they need a loopback Host instead (or the token, as anywhere)."""
        if self._guard_reads:
            self.authorize(request)
            return
        if _names_loopback(request, self._listen_host):
            return
        if "Authorization" in request.headers:
            self.authorize(request)
            return
        raise _misdirected("this page is served without a token")

    def app(self) -> web.Application:
        application = web.Application(
            middlewares=[_json_router_errors, _refuse_undecodable_headers])
        application.router.add_get("/healthz", self.healthz)
        application.router.add_get("/readyz", self.readyz)
        application.router.add_get("/metrics", self.metrics)
        application.router.add_get("/ui", self.ui)
        application.router.add_get("/api/v1/stats", self.stats)
        application.router.add_post("/api/v1/warm", self.warm)
        application.router.add_get("/api/v1/mode", self.get_mode)
        application.router.add_put("/api/v1/mode", self.put_mode)
        application.router.add_post("/api/v1/reload", self.reload)
        # "[\s\S]", not ".": S3 keys may hold CR and LF, and the router's "."
        # stops at a decoded LF (a plain-text 404 that never reaches purge).
        application.router.add_delete(r"/api/v1/cache/{bucket}/{key:[\s\S]+}", self.purge)
        application.router.add_get("/", self.index)
        application.cleanup_ctx.append(self._sampling)
        return application

    async def _sampling(self, application: web.Application) -> AsyncIterator[None]:
        """Sample the counters while the port serves: once at start, so the first
        stats already have a window, then every interval."""
        self._take_sample()
        task = asyncio.get_running_loop().create_task(self._sample_forever())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sample_interval_s)
            try:
                self._take_sample()
            except Exception:  # a chart missing a point is no reason to stop sampling
                log.exception("could not sample the counters for /ui")

    def _take_sample(self) -> None:
        self._samples.add(take_sample(self._metrics.read(), time.time(), time.monotonic()))

    async def index(self, request: web.Request) -> web.Response:
        """What this port answers, for whoever opens it in a browser or with curl."""
        return web.json_response({"endpoints": ENDPOINTS})

    async def get_mode(self, request: web.Request) -> web.Response:
        return web.json_response(self._mode_answer())

    def _mode_answer(self) -> dict[str, str]:
        answer = {"mode": self._modes.current.value, "requested": self._modes.requested.value}
        if self._modes.disk_problem is not None:
            # Why the mode is not the one requested: the cache disk forces bypass.
            answer["disk_problem"] = self._modes.disk_problem
        return answer

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        # A bypassing sidecar still serves every read (from the origin), so it
        # stays ready; the body says why it bypasses.
        ready = self._is_ready()
        return web.json_response(
            {"ready": ready, "mode": self._modes.current.value,
             "disk_problem": self._modes.disk_problem},
            status=200 if ready else 503,
        )

    async def put_mode(self, request: web.Request) -> web.Response:
        self.authorize(request)
        expected = 'the body must be {"mode": "normal|no-prefetch|cache-only|bypass"}'
        try:
            body = json.loads(await request.text())
        except (ValueError, RecursionError):
            # A bare word or anything else that is not JSON; or JSON nested
            # deeper than the decoder can recurse.
            return web.json_response({"error": f"not JSON: {expected}"}, status=400)
        try:
            if not isinstance(body, dict) or set(body) != {"mode"}:
                raise ValueError(expected)
            mode = parse_mode(body["mode"])
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self._modes.request(mode)
        return web.json_response(self._mode_answer())

    async def reload(self, request: web.Request) -> web.Response:
        """Read the configuration again, as SIGHUP does; what changed, and what of
        it needs a restart. A configuration that is not valid changes nothing."""
        self.authorize(request)
        if self._reload is None:
            return web.json_response({"error": "nothing to reload"}, status=409)
        try:
            plan = await self._reload()
        except ConfigError as exc:
            return web.json_response(
                {"error": f"{exc}; the running configuration stays"}, status=400)
        return web.json_response({"applied": list(plan.applied),
                                  "needs_restart": list(plan.needs_restart)})

    async def purge(self, request: web.Request) -> web.Response:
        self.authorize(request)
        bucket, key = request.match_info["bucket"], request.match_info["key"]
        self._origin.forget(bucket, key)
        return web.json_response({"purged_blocks": self._engine.invalidate(bucket, key)})

    async def metrics(self, request: web.Request) -> web.Response:
        self.authorize_read(request)
        return _exposition(self._metrics)

    async def ui(self, request: web.Request) -> web.Response:
        self.authorize_read(request)
        # The page arrives with the stats and the whole history in it: its first
        # paint shows figures and charts, not a placeholder waiting for a poll.
        return web.Response(
            text=ui.render(self._snapshot(with_history=True)),
            content_type="text/html", charset="utf-8",
            headers={"Cache-Control": "no-store", "Content-Security-Policy": ui.CSP},
        )

    async def stats(self, request: web.Request) -> web.Response:
        # Without a parameter the answer stays small, for `sidecar stats` and scripts;
        # the page asks ?since= the last point it has.
        self.authorize_read(request)
        since: float | None = None
        if "since" in request.query:
            # ASCII digits and one point only: float() also takes '١', '1_0' and ' 1 '.
            text = request.query["since"]
            since = float(text) if _SECONDS.fullmatch(text) else math.nan
            if not math.isfinite(since):
                return web.json_response(
                    {"error": "since: must be a time in seconds since the epoch"}, status=400)
        with_history = since is not None or request.query.get("history", "0") not in ("0", "")
        return web.json_response(self._snapshot(with_history, since))

    def _snapshot(self, with_history: bool = False, since: float | None = None
                  ) -> dict[str, Any]:
        """The stats; `with_history`: also the chart points of the samples taken
        after `since` (wall-clock seconds; None: all the ring holds)."""
        reading = self._metrics.read()
        now = take_sample(reading, time.time(), time.monotonic())
        snapshot = stats_snapshot(reading)
        snapshot["time"] = now.wall  # wall-clock seconds
        snapshot["mode"] = self._modes.current.value
        snapshot["requested_mode"] = self._modes.requested.value
        snapshot["disk_problem"] = self._modes.disk_problem
        snapshot["memory_tier"]["off_reason"] = self._memory_tier_off
        if self._cache_recovery is not None:
            snapshot["cache"]["recovery"] = self._cache_recovery()
        snapshot["engine"] = self._engine.activity()
        # Rates over the last minute up to this very reading (the newest sample
        # may be an interval old).
        snapshot["window"] = self._samples.window(now, WINDOW_S)
        snapshot["warm_calls"] = self.warm_calls.as_json()
        if with_history:
            snapshot["history"] = self._samples.history(since)
        return snapshot

    async def warm(self, request: web.Request) -> web.Response:
        self.authorize(request)
        return await warm.handle(request, self._origin, self._engine, self.warm_calls)
