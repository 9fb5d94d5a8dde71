"""The running sidecar: builds every part from the config and owns their lifetimes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.admin import AdminPort
from sidecar.cache import BlockStore
from sidecar.config import Config, HostPort
from sidecar.engine import Engine, max_coalesce_blocks
from sidecar.errors import ConfigError
from sidecar.metrics import Metrics
from sidecar.origin import Origin
from sidecar.prefetch.prefetcher import Prefetcher
from sidecar.prefetch.streams import StreamTable
from sidecar.s3api import DataPort

log = logging.getLogger(__name__)


def check_cache_dir(directory: Path) -> None:
    """Fail early and clearly: a missing or read-only cache disk is an operator error."""
    if not directory.is_dir():
        raise ConfigError(f"--cache-dir {directory} does not exist or is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--cache-dir {directory} is not writable: {exc.strerror}") from None


def pin_cpus(cpus: tuple[int, ...] | None) -> None:
    if cpus is None:
        return
    available = set(range(psutil.cpu_count() or 1))
    unknown = sorted(set(cpus) - available)
    if unknown:
        raise ConfigError(f"--cpus names CPUs this machine does not have: {unknown}")
    psutil.Process().cpu_affinity(list(cpus))
    log.info("pinned to CPUs %s", ",".join(map(str, cpus)))


class Sidecar:
    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = Metrics(registry)
        self._runners: list[web.AppRunner] = []
        self._executor = ThreadPoolExecutor(
            max_workers=config.server.io_threads, thread_name_prefix="sidecar-io"
        )
        self.origin = Origin(config.origin, self.metrics)
        self._store: BlockStore | None = None
        self._engine: Engine | None = None
        self._prefetcher: Prefetcher | None = None
        self._ready = False
        self.data_url = ""
        self.admin_url = ""

    async def start(self) -> None:
        cache = self.config.cache
        check_cache_dir(cache.directory)
        pin_cpus(self.config.server.cpus)
        await self.origin.start()
        if self.config.origin.check_on_start:
            await self.origin.check_reachable()
        self._store = await BlockStore.open(
            cache.directory, cache.size_bytes, cache.block_size, self._executor, self.metrics
        )
        store = self._store
        self.metrics.cache_capacity.set_function(lambda: store.capacity_bytes())
        self.metrics.cache_used.set_function(lambda: store.used_bytes())
        self.metrics.cache_blocks.set_function(lambda: store.block_count())
        self._engine = Engine(
            self._store, self.origin, self.metrics, cache.block_size,
            max_coalesce_blocks(cache.max_coalesce_bytes, cache.block_size),
            # Only asyncio's selector loop has a native loop.sendfile.
            zero_copy=isinstance(asyncio.get_running_loop(), asyncio.selector_events.BaseSelectorEventLoop),
        )
        if self.config.prefetch.enabled:
            self._prefetcher = self._build_prefetcher(self._engine, self._store)
        data = DataPort(self._engine, self.origin, self.metrics)
        admin = AdminPort(
            self.metrics, lambda: self._ready, self._engine, self.origin,
            self.config.server.admin_token,
        )
        self.data_url = await self._listen(data.app(), self.config.server.listen)
        self.admin_url = await self._listen(admin.app(), self.config.server.admin_listen)
        self._ready = True

    def _build_prefetcher(self, engine: Engine, store: BlockStore) -> Prefetcher:
        settings = self.config.prefetch
        table = StreamTable(
            block_size=self.config.cache.block_size,
            max_window_blocks=settings.max_window_blocks,
            idle_s=settings.stream_idle_s, clock=time.monotonic,
        )
        prefetcher = Prefetcher(
            table, engine, self.metrics, head=self.origin.head,
            list_keys=self.origin.list_keys if settings.layout == "aiven" else None,
            layout_prefix=settings.layout_prefix, max_in_flight=settings.max_in_flight,
            max_pending=int(store.slot_count * settings.cache_share),
        )
        engine.prefetcher = prefetcher
        store.eviction_listeners.append(prefetcher.on_evicted)
        return prefetcher

    async def _listen(self, application: web.Application, address: HostPort) -> str:
        runner = web.AppRunner(application, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, address.host, address.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {address}: {exc.strerror}") from None
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        self._ready = False
        for runner in reversed(self._runners):
            await runner.cleanup()
        if self._prefetcher is not None:
            await self._prefetcher.close()
        if self._engine is not None:
            await self._engine.close()
        if self._store is not None:
            await self._store.close()
        await self.origin.close()
        self._executor.shutdown(wait=True)


async def serve(config: Config) -> None:
    """Run until SIGTERM or SIGINT. Prints one JSON line on stdout once serving."""
    sidecar = Sidecar(config, CollectorRegistry())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await sidecar.start()
        print(json.dumps({"event": "ready", "data": sidecar.data_url,
                          "admin": sidecar.admin_url, "pid": os.getpid()}), flush=True)
        log.info("serving S3 reads on %s, admin on %s, cache %s (%d bytes, blocks of %d)",
                 sidecar.data_url, sidecar.admin_url, config.cache.directory,
                 config.cache.size_bytes, config.cache.block_size)
        await stop.wait()
    finally:
        await sidecar.stop()
        sys.stdout.flush()
