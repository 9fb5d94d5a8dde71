"""The running sidecar: builds every part from the config and owns their lifetimes."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry

from sidecar.admin.port import AdminPort, metrics_app
from sidecar.admin.token import ensure_token_file
from sidecar.cache import BlockIdent, BlockStore
from sidecar.config import Config, HostPort
from sidecar.config.bandwidth import bandwidth_refusal
from sidecar.config.reloading import Reload, plan_reload
from sidecar.engine import Engine, max_coalesce_blocks
from sidecar.errors import ConfigError
from sidecar.isolation.disk import DiskWatcher, check_dedicated
from sidecar.isolation.host import apply_host_settings
from sidecar.isolation.lanes import LaneLimiter
from sidecar.isolation.modes import Mode, ModeState
from sidecar.layout import Layout, is_small_object
from sidecar.model import PREFETCH, WARM
from sidecar.origin.client import Origin
from sidecar.prefetch.planner import ReadAheadPlanner
from sidecar.prefetch.streams import StreamTable
from sidecar.s3.access import AccessPolicy
from sidecar.s3.auth import Authenticator
from sidecar.s3.dataport import DataPort
from sidecar.s3.held_send import quiet_sendfile_hangups
from sidecar.s3.passthrough import PassThrough, PassThroughLimits
from sidecar.s3.plain_ranges import PlainConnections, PlainRanges
from sidecar.stop_deadline import StopDeadline
from sidecar.telemetry.access_log import AccessLog, NodeFacts, fetch_entry
from sidecar.telemetry.log_shipping import LogShipper
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.refused import refusal_counter
from sidecar.telemetry.thread_names import name_this_thread

log = logging.getLogger(__name__)


_CLOSING_CACHE = "the cache to close"

# The share of `stop_timeout` that requests in progress get to finish once a
# stop begins; aiohttp then cancels what is left (each cancelled request is
# still logged and counted, cut off as `stopped`), and the rest of the bound
# goes to the engine, the access log and the index snapshot.
DRAIN_SHARE = 0.5
# aiohttp's TCPSite's, for the data port's own listener (sidecar.s3.plain_ranges).
LISTEN_BACKLOG = 128
MAX_HEADER_LINE = 8190
MAX_HEADERS = 128


class MalformedRequestLog(logging.Logger):
    """aiohttp's server logger, minus a stack trace per malformed request.

    aiohttp answers a request it cannot parse (bad request line, oversized or
    invalid header, broken chunking) with 400 itself, then logs it as ERROR with
    a traceback: anyone able to connect could flood the log. Such a request
    is logged at DEBUG in one line (and counted in
    sidecar_malformed_requests_total, telemetry/refused.py); every other error
    keeps its traceback.
    """

    def __init__(self, parent: logging.Logger) -> None:
        super().__init__(parent.name)
        self.parent = parent  # records go to aiohttp.server's handlers and level

    def exception(
        self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any
    ) -> None:
        if isinstance(exc_info, HttpProcessingError) and 400 <= (exc_info.code or 0) < 500:
            self.debug("refused a malformed request (%d): %.200s", exc_info.code,
                       str(exc_info.message).replace("\n", " "))
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def check_cache_dir(directory: Path) -> None:
    """Fail early and clearly: a missing or read-only cache disk is an operator error."""
    if not directory.is_dir():
        raise ConfigError(f"--cache-dir {directory} does not exist or is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--cache-dir {directory} is not writable: {exc.strerror}") from None


class Sidecar:
    def __init__(self, config: Config, registry: CollectorRegistry,
                 load: Callable[[], Config] | None = None) -> None:
        """`load`: the configuration read afresh from its sources, for reloads
        (blocking: it reads the config file; run on a thread of its own)."""
        self.config = config
        self._load = load
        self.metrics = Metrics(registry)
        self._runners: list[web.AppRunner] = []
        # The data port's listener and the connections its plain-range path answers.
        self._data_servers: list[asyncio.Server] = []
        self._plain = PlainConnections()
        self._executor = ThreadPoolExecutor(
            max_workers=config.server.io_threads, thread_name_prefix="sidecar-io",
            initializer=name_this_thread,
        )
        self.modes = ModeState(on_change=self._show_mode)
        self._show_mode(self.modes.current, changed=False)
        self.origin = Origin(config.origin, self.metrics, limiter=self._lanes(config))
        self._watcher: asyncio.Task[None] | None = None
        self._access_log: AccessLog | None = None
        self._shipper: LogShipper | None = None
        self._store: BlockStore | None = None
        self._engine: Engine | None = None
        self._passthrough: PassThrough | None = None
        self._planner: ReadAheadPlanner | None = None
        self._data_port: DataPort | None = None
        self._ready = False
        # Held by the start and by each reload: a reload asked meanwhile (SIGHUP
        # during a long cache recovery, a second SIGHUP) waits its turn, then
        # reads the file. Taken during the start, it would change self.config
        # under parts being built from what it held before (the data port's
        # admission), or land after a newer one.
        self._reconfiguring = asyncio.Lock()
        self._reconfiguring_for = ""
        self.stop_step = "the stop to begin"
        self.data_url = ""
        self.admin_url = ""
        self.metrics_url = ""  # the metrics_listen one, "" when there is none
        self.admin_token_file = ""  # where the admin token came from, "" when configured

    async def start(self) -> None:
        async with self._reconfiguring:
            self._reconfiguring_for = "the start"
            await self._start()

    async def _start(self) -> None:
        quiet_sendfile_hangups(asyncio.get_running_loop())
        cache = self.config.cache
        check_cache_dir(cache.directory)
        device = check_dedicated(cache.directory, cache.protect_paths, cache.allow_shared_disk)
        server = self.config.server
        applied = apply_host_settings(server.cpus, server.ionice, server.nice)
        if cache.memory_tier_off_reason is not None:
            log.warning("%s", cache.memory_tier_off_reason)
        await self.origin.start()
        if self.config.origin.check_on_start:
            await self.origin.check_reachable()
        try:
            self._store = await BlockStore.open(
                cache.directory, cache.size_bytes, cache.block_size, self._executor,
                self.metrics, drop_written_pages=cache.drop_written_pages,
                direct_io=cache.direct_io,
                preallocate=cache.preallocate, scrub_rate=cache.scrub_rate,
                admit_to_main=self._small_objects(),
                recent_chunk_bytes=cache.recent_chunk_bytes,
                memory_tier_bytes=cache.memory_tier_bytes,
                reserve_tier=cache.memory_tier_reserve,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot create a {cache.size_bytes}-byte cache in {cache.directory}: "
                f"{exc.strerror}"
            ) from None
        store = self._store
        self.metrics.cache_capacity.set_function(lambda: store.capacity_bytes())
        self.metrics.cache_used.set_function(lambda: store.used_bytes())
        self.metrics.cache_blocks.set_function(lambda: store.block_count())
        self.metrics.cache_protected_blocks.set_function(lambda: store.protected_blocks())
        if store.tier is not None:
            self.metrics.memory_tier.watch(store.tier.figures)
        self._planner = self._read_ahead_planner(store.slot_count)
        self._engine = Engine(
            self._store, self.origin, self.metrics, cache.block_size,
            max_coalesce_blocks(cache.max_coalesce_bytes, cache.block_size),
            modes=self.modes, max_buffered_bytes=server.max_buffered_bytes,
            warm_concurrency=self.config.origin.warm_concurrency,
            planner=self._planner,
        )
        if server.access_log is not None:
            node = server.node_name or socket.gethostname()
            if server.access_log_upload is not None:
                self._shipper = LogShipper(
                    server.access_log_upload, node, self.origin.upload, self._executor,
                    lambda outcome: self.metrics.access_log_uploads.labels(outcome).inc(),
                    server.access_log_backups)
                self._shipper.start()
            try:
                self._access_log = AccessLog(
                    server.access_log, NodeFacts(node, cache.block_size, cache.size_bytes),
                    max_bytes=server.access_log_max_bytes, backups=server.access_log_backups,
                    dropped=self._access_log_dropped,
                    rotated=self._shipper.rotated if self._shipper is not None else None)
            except OSError as exc:
                raise ConfigError(f"cannot open the access log {server.access_log}: "
                                  f"{exc.strerror}") from None
            access_log = self._access_log
            self._engine.tell_background_fetches(lambda done: access_log.write(
                fetch_entry(now=time.time(), done=done, node=access_log.node)))
        auth = self.config.auth
        self._passthrough = PassThrough(
            self.config.origin, self._written(self._engine), server.client_timeout_s,
            PassThroughLimits(server.passthrough_acquire_timeout_s,
                              server.passthrough_timeout_s, server.passthrough_per_client),
            forget_head=self.origin.forget,
        )
        await self._passthrough.start()
        self._say_who_may_sign(auth.keys, auth.allow_anonymous)
        self._say_what_is_served(self.config)
        data = self._data_port = DataPort(
            self._engine, self.origin, self.metrics, server.max_requests,
            server.client_timeout_s, self._access_log, self._authenticator(self.config),
            passthrough=self._passthrough, access=self._access(self.config))
        admin = AdminPort(
            self.metrics, lambda: self._ready, self._engine, self.origin,
            await self._admin_token(), self.modes,
            cache_recovery=store.recovery_stats, reload=self.reload_from_source,
            sample_interval_s=server.stats_interval_s,
            guard_reads=not server.admin_listen.is_loopback,
            listen_host=server.admin_listen.host,
            memory_tier_off=cache.memory_tier_off_reason,
        )
        watcher = DiskWatcher(
            cache.directory, cache.disk_reserve_bytes, cache.disk_check_interval_s,
            self._executor, shrink=self._engine.shrink_cache, grow=store.grow,
            failed=lambda: self.modes.disk_problem is not None,
            recovered=functools.partial(self._disk_recovered, store),
        )
        self._watcher = asyncio.get_running_loop().create_task(watcher.run())
        self.device = device
        log.info("isolation: %s; origin bandwidth %s", applied,
                 f"{self.config.origin.bandwidth} B/s" if self.config.origin.bandwidth
                 else "unlimited")
        log.info("cache dir %s is on device %s (%s mounted at %s)", cache.directory,
                 device.device, device.source, device.mount_point)
        self.data_url = await self._listen(data.app(), self.config.server.listen, "data")
        self.admin_url = await self._listen(admin.app(), self.config.server.admin_listen,
                                            "admin")
        if server.metrics_listen is not None:
            listener = server.metrics_listen
            self.metrics_url = await self._listen(
                metrics_app(self.metrics,
                            listener.host if listener.is_loopback else None),
                listener, "metrics")
        self._ready = True

    async def _admin_token(self) -> str:
        """The operator's token, else the one kept in (or now generated into) the
        token file; a token always guards the admin port's mutating calls."""
        server = self.config.server
        if server.admin_token is not None:
            return server.admin_token
        path = server.admin_token_file
        token, generated = await asyncio.get_running_loop().run_in_executor(
            self._executor, ensure_token_file, path)
        self.admin_token_file = str(path)
        if generated:
            log.warning("admin token generated into %s (mode 0600): `sidecar stats` and the "
                        "warm-up job read it from there (SIDECAR_ADMIN_TOKEN_FILE)", path,
                        extra={"event": "admin_token_generated", "path": str(path)})
        return token

    def _access_log_dropped(self, reason: str, lines: int) -> None:
        # Called from the log's writer thread: prometheus_client counters are
        # thread-safe.
        self.metrics.access_log_dropped.labels(reason).inc(lines)

    def _lanes(self, config: Config) -> LaneLimiter:
        return LaneLimiter(
            config.origin.bandwidth,
            {PREFETCH: config.origin.prefetch_share, WARM: config.origin.warm_share},
            time.monotonic, foreground_reserve=config.cache.block_size,
        )

    def _authenticator(self, config: Config) -> Authenticator:
        return Authenticator(config.auth.keys, config.auth.allow_anonymous,
                             origin_key=self.origin.own_key)

    @staticmethod
    def _access(config: Config) -> AccessPolicy:
        return AccessPolicy.of(config.access, config.auth.scopes)

    async def reload_from_source(self) -> Reload:
        """Read the configuration again (SIGHUP, POST /api/v1/reload) and take
        what can change live. Raises ConfigError, and changes nothing, when
        the new configuration is not valid."""
        if self._load is None:
            raise ConfigError("this sidecar was started without a configuration to reload")
        if self._reconfiguring.locked():
            log.info("configuration reload waits for %s to end", self._reconfiguring_for)
        async with self._reconfiguring:
            self._reconfiguring_for = "the reload under way"
            # Not on the disk threads: a cache disk that stopped answering holds
            # them all, and a reload (say, to a lower max_requests) is wanted then.
            loaded = await asyncio.to_thread(self._load)
            return self.reload(loaded)

    def reload(self, loaded: Config) -> Reload:
        """Take what can change live from a configuration loaded afresh
        (sidecar.config.reloading); the rest waits for a restart."""
        plan = plan_reload(self.config, loaded)
        new = plan.config
        # The loaded file was checked against its own block_size; a changed one
        # waits for a restart, so the bandwidth that is taken now must suit the
        # blocks that are read now.
        refusal = bandwidth_refusal(new.origin.bandwidth, new.origin.prefetch_share,
                                    new.origin.warm_share, new.cache.block_size)
        if refusal is not None:
            raise ConfigError(f"{refusal} (with the running block_size)")
        if new.origin != self.config.origin:
            self.origin.set_limiter(self._lanes(new))
        if self._data_port is not None and (new.server, new.auth, new.access) != (
                self.config.server, self.config.auth, self.config.access):
            self._data_port.configure(new.server.max_requests, new.server.client_timeout_s,
                                      self._authenticator(new), self._access(new))
        if self._passthrough is not None:
            self._passthrough.client_timeout_s = new.server.client_timeout_s
        if self._planner is not None:
            self._planner.table.max_window = new.prefetch.max_window_blocks
        old, self.config = self.config, new
        if plan.applied:
            log.warning("configuration reloaded: %s changed", ", ".join(plan.applied),
                        extra={"event": "reloaded", "applied": list(plan.applied)})
        # Who may sign and what is served, said again as at the start: a reload
        # may leave no signer (every request 403) or open every bucket.
        if new.auth != old.auth:
            self._say_who_may_sign(new.auth.keys, new.auth.allow_anonymous)
        if new.access != old.access:
            self._say_what_is_served(new)
        if plan.needs_restart:
            log.warning("configuration reloaded: %s changed but take effect only after a "
                        "restart", ", ".join(plan.needs_restart),
                        extra={"event": "reloaded", "needs_restart": list(plan.needs_restart)})
        if not plan.applied and not plan.needs_restart:
            log.info("configuration reloaded: nothing changed")
        return plan

    def _say_who_may_sign(self, keys: Mapping[str, str], allow_anonymous: bool) -> None:
        own = self.origin.own_key()
        # An access key id names a key and proves nothing (its secret does): shown whole.
        signers = ([f"the origin credentials (access key {own[0]})"] if own else []) + \
            ([f"{len(keys)} configured key(s)"] if keys else [])
        anonymous = "; unsigned requests may read" if allow_anonymous else ""
        if signers:
            log.info("data port: requests signed by %s%s", " and ".join(signers), anonymous)
        elif not allow_anonymous:
            log.warning("data port: no origin credentials and no [auth] keys, so no "
                        "request can be signed: every request will get 403")

    @staticmethod
    def _say_what_is_served(config: Config) -> None:
        access = config.access
        if access.buckets:
            log.info("data port: serving bucket(s) %s%s", ", ".join(access.buckets),
                     "; bucket administration allowed" if access.bucket_admin else "")
        else:
            log.warning("data port: access_buckets is empty, so every bucket the origin "
                        "credentials reach is served; set it to the tiered-storage bucket "
                        "([access] buckets = [\"...\"])")

    def _disk_recovered(self, store: BlockStore) -> None:
        store.disk_recovered()
        self.modes.disk_recovered()

    def _small_objects(self) -> Callable[[BlockIdent], bool] | None:
        """Blocks that skip probation, also when recovered at start: a segment's
        manifest and indexes (Aiven layout), read whole and often."""
        if self.config.prefetch.layout is not Layout.AIVEN:
            return None
        prefix = self.config.prefetch.layout_prefix
        return lambda ident: is_small_object(ident.key, prefix)

    def _written(self, engine: Engine) -> Callable[[str, str], None]:
        """What a write or delete passed through to the origin makes stale here."""
        def invalidate(bucket: str, key: str) -> None:
            self.origin.forget(bucket, key)
            engine.invalidate(bucket, key)
        return invalidate

    def _read_ahead_planner(self, slot_count: int) -> ReadAheadPlanner | None:
        settings = self.config.prefetch
        if not settings.enabled:
            return None
        table = StreamTable(
            block_size=self.config.cache.block_size,
            max_window_blocks=settings.max_window_blocks,
            idle_s=settings.stream_idle_s, clock=time.monotonic,
        )
        return ReadAheadPlanner(
            table, max_in_flight=settings.max_in_flight,
            max_pending=int(slot_count * settings.cache_share),
            layout=settings.layout, layout_prefix=settings.layout_prefix,
        )

    async def _listen(self, application: web.Application, address: HostPort, name: str
                      ) -> str:
        """Serve `application` on `address`; `name` ("data", "admin", "metrics")
        labels what aiohttp refuses there before any handler runs."""
        # aiohttp's keep-alive timer starts with the connection and moves only
        # when a request completes: a client trickling its headers (slowloris)
        # or idling between requests is closed after client_timeout. Set here
        # once: aiohttp takes it per connection at its start, with no way to
        # change it after, so a reload's client_timeout reaches the requests
        # (DataPort.configure) and this waits for a restart (README, "Live reload").
        # Header bounds are aiohttp's defaults, stated so they stay: a longer
        # request line or header gets 400 before any handler runs (S3 itself
        # takes at most 8 KiB of headers).
        # auto_decompress=False: a body is relayed as the client encoded it. aiohttp
        # would otherwise inflate a `Content-Encoding: gzip` upload and cut it at
        # the client's Content-Length, and the origin would store those bytes.
        # aiohttp's access logger is not the access log (that is written by the data
        # port's handler): it only counts the requests aiohttp refused before any
        # handler ran (telemetry/refused.py).
        # shutdown_timeout: aiohttp's own (60 s) would outlast `stop_timeout`, and
        # the deadline would end the process before a cancelled request is logged.
        # aiohttp waits it twice (for the handler to finish; then, its request
        # cancelled, for it to end) before it cancels the handler: half each.
        runner = web.AppRunner(application, handle_signals=False,
                               shutdown_timeout=self.config.server.stop_timeout_s
                               * DRAIN_SHARE / 2,
                               access_log_class=refusal_counter(
                                   self.metrics.malformed_requests, name),
                               access_log=logging.getLogger("aiohttp.access"),
                               auto_decompress=False,
                               keepalive_timeout=self.config.server.client_timeout_s,
                               max_line_size=MAX_HEADER_LINE, max_field_size=MAX_HEADER_LINE,
                               max_headers=MAX_HEADERS,
                               logger=MalformedRequestLog(logging.getLogger("aiohttp.server")))
        await runner.setup()
        self._runners.append(runner)
        if name == "data" and self._data_port is not None:
            return await self._listen_plain(runner, address, self._data_port)
        site = web.TCPSite(runner, address.host, address.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {address}: {exc.strerror}") from None
        host, port = runner.addresses[0][:2]
        return HostPort(host, port).url

    async def _listen_plain(self, runner: web.AppRunner, address: HostPort,
                           data_port: DataPort) -> str:
        """The data port's connections start in the plain-range path
        (sidecar.s3.plain_ranges), which hands them to `runner`'s aiohttp server
        for every request but a plain ranged read of a cached object."""
        handler = runner.server
        assert handler is not None  # set up above
        data_port.close_handled = True
        idle_timeout_s = self.config.server.client_timeout_s
        plain = self._plain

        def connection() -> PlainRanges:
            return PlainRanges(data_port, handler, plain, idle_timeout_s)

        try:
            listener = await asyncio.get_running_loop().create_server(
                connection, address.host, address.port, reuse_address=True,
                backlog=LISTEN_BACKLOG)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {address}: {exc.strerror}") from None
        self._data_servers.append(listener)
        host, port = listener.sockets[0].getsockname()[:2]
        return HostPort(host, port).url

    def _show_mode(self, current: Mode, changed: bool = True) -> None:
        for mode in Mode:
            self.metrics.mode.labels(mode.value).set(1 if mode is current else 0)
        if changed:
            # A `mode` field, so a log query finds every switch (the why is logged by ModeState).
            log.info("mode changed to %s", current.value, extra={
                "mode": current.value, "requested_mode": self.modes.requested.value,
                "disk_problem": self.modes.disk_problem,
            })

    def stopping_at(self) -> str:
        """The step of the stop under way (read by the stop's deadline, from
        its own thread: plain attributes only)."""
        if self.stop_step == _CLOSING_CACHE and self._store is not None:
            return f"{self.stop_step}: {self._store.close_step}"
        return self.stop_step

    async def stop(self) -> None:
        self._ready = False
        self.stop_step = "the disk watcher to stop"
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        self.stop_step = "the listeners to close (requests in progress)"
        # Side by side: each port's requests get the same drain, not one after another's.
        for listener in self._data_servers:
            listener.close()
        await asyncio.gather(
            *(runner.cleanup() for runner in self._runners),
            self._plain.close(self.config.server.stop_timeout_s * DRAIN_SHARE / 2))
        self.stop_step = "the engine to close (fetches in progress)"
        if self._engine is not None:
            await self._engine.close()
        # After the engine: the fetches it stopped have their lines too.
        self.stop_step = "the access log's last lines to be written"
        if self._access_log is not None:
            # Joins the writer thread, which writes (and rotates) the last lines.
            await asyncio.get_running_loop().run_in_executor(self._executor,
                                                             self._access_log.close)
        self.stop_step = "the access log upload to stop"
        if self._shipper is not None:
            await self._shipper.stop()
        self.stop_step = _CLOSING_CACHE
        if self._store is not None:
            await self._store.close()
        self.stop_step = "the pass-through's origin connections to close"
        if self._passthrough is not None:
            await self._passthrough.close()
        self.stop_step = "the origin client to close"
        await self.origin.close()
        self.stop_step = "the disk threads to finish"
        self._executor.shutdown(wait=True)
        self.stop_step = "the process to exit"


async def _reload_on_signal(sidecar: Sidecar) -> None:
    try:
        await sidecar.reload_from_source()
    except ConfigError as exc:
        log.error("configuration reload failed, the running configuration stays: %s", exc,
                  extra={"event": "reload_failed"})


async def serve(config: Config, summary: Mapping[str, object] | None = None,
                load: Callable[[], Config] | None = None) -> None:
    """Run until SIGTERM or SIGINT; SIGHUP reloads the configuration from `load`.
    Prints one JSON line on stdout once serving.

    `summary` is the effective configuration with secrets redacted
    (config_reference.effective_values); it goes into the start-up log record.
    """
    sidecar = Sidecar(config, CollectorRegistry(), load)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reloads: set[asyncio.Task[None]] = set()

    def hang_up() -> None:
        task = loop.create_task(_reload_on_signal(sidecar))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, hang_up)
    try:
        await sidecar.start()
        print(json.dumps({"event": "ready", "data": sidecar.data_url,
                          "admin": sidecar.admin_url, "pid": os.getpid(),
                          "metrics": sidecar.metrics_url or None,
                          "admin_token_file": sidecar.admin_token_file or None}), flush=True)
        # One record that says what this process runs with (logged only once
        # serving, so a failed start still ends in its one line on stderr).
        log.info("serving S3 reads on %s, admin on %s, cache %s (%d bytes, blocks of %d)",
                 sidecar.data_url, sidecar.admin_url, config.cache.directory,
                 config.cache.size_bytes, config.cache.block_size,
                 extra={"event": "started", "data_url": sidecar.data_url,
                        "admin_url": sidecar.admin_url, "pid": os.getpid(),
                        "mode": sidecar.modes.current.value, "config": dict(summary or {})})
        await stop.wait()
    finally:
        await _stop_within_deadline(sidecar, config.server.stop_timeout_s)
        sys.stdout.flush()


async def _stop_within_deadline(sidecar: Sidecar, deadline_s: float) -> None:
    """Stop, ended by ``StopDeadline`` past ``deadline_s`` or at a second
    SIGTERM/SIGINT. The deadline is left running until the process exits: a
    stop that returns and then hangs at the interpreter's exit is ended too."""
    deadline = StopDeadline(deadline_s, sidecar.stopping_at)
    deadline.start()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Off the loop: its handler would only run once the loop turns again.
        loop.remove_signal_handler(signum)
        signal.signal(signum, deadline.signalled)
    await sidecar.stop()
