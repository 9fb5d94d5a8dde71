"""Rotated access log files shipped to the object store (`access_log_upload`).

The capacity analysis reads a fleet's access logs from one place
(`python -m spark_warmup.capacity --logs s3://BUCKET/PREFIX`), so each sidecar
puts every file its access log rotates out there, as PREFIX/NODE/TIME.jsonl
(`object_key`): one folder per node, names that sort by time.

How, without the event loop ever touching the disk:
- the log's writer thread, right after it renamed PATH to PATH.1, opens PATH.1 and
  hands the open file over (`rotated`, safe from any thread). Held open, the file
  cannot be taken away by the next rotation's rename or removal of that name;
- a task on the event loop uploads one file at a time, oldest first, as one
  multipart upload through the sidecar's origin client (`Origin.upload`), reading
  8 MiB parts in the executor;
- an upload that fails is tried again after 1 s, doubling up to 5 minutes, for as
  long as the origin refuses. Meanwhile at most `max_pending` further files wait
  (the access log's backups: what the disk would keep anyway); past that the
  oldest is given up, counted (`sidecar_access_log_uploads_total{outcome="dropped"}`)
  and logged;
- at stop the live file is rotated too and what waits gets a few seconds
  (`STOP_DRAIN_S`) to go; whatever is left then stays on disk as PATH.N.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO

from sidecar.config import S3Location

log = logging.getLogger(__name__)

# S3 parts must be 5 MiB at least, but for the last (S3 User Guide, "Multipart
# upload limits"); 8 MiB keeps one part's bytes in memory at a time.
PART_BYTES = 8 * 1024 * 1024
FIRST_RETRY_S = 1.0
LAST_RETRY_S = 300.0
# What waits at stop gets this long: well inside systemd's TimeoutStopSec (30 s)
# and the pod's terminationGracePeriodSeconds (30 s).
STOP_DRAIN_S = 10.0
CONTENT_TYPE = "application/x-ndjson"

# (bucket, key, parts, content type) -> bytes uploaded: Origin.upload.
Upload = Callable[[str, str, AsyncIterator[bytes], str], Awaitable[int]]


def object_key(location: S3Location, node: str, rotated_at: float) -> str:
    """PREFIX/NODE/20261127T160203.123456Z.jsonl (UTC, microseconds: one node
    cannot rotate twice within one)."""
    stamp = datetime.fromtimestamp(rotated_at, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{location.prefix}{node_folder(node)}/{stamp}.jsonl"


def node_folder(node: str) -> str:
    """The node's folder: its name as one path segment, one folder a name. A
    '/' and the escape's own '%' are percent-encoded (RFC 3986 section 2.1),
    so that nodes named a/b and a_b never share one. The config refuses the
    names no folder can have (sidecar.config.parsing.parse_node_name)."""
    return node.replace("%", "%25").replace("/", "%2F") or "unnamed"


@dataclass(frozen=True)
class RotatedFile:
    file: BinaryIO
    rotated_at: float


class LogShipper:
    """Uploads each rotated access log file once, in the background."""

    def __init__(
        self, location: S3Location, node: str, upload: Upload, executor: Executor,
        outcome: Callable[[str], None], max_pending: int,
        clock: Callable[[], float] = time.time,
        retry_s: tuple[float, float] = (FIRST_RETRY_S, LAST_RETRY_S),
    ) -> None:
        self.location = location
        self._node = node
        self._upload = upload
        self._executor = executor
        self._outcome = outcome
        self._max_pending = max(1, max_pending)
        self._clock = clock
        self._retry_s = retry_s
        self._pending: deque[RotatedFile] = deque()
        # The file being uploaded (or retried): out of the queue, still not shipped.
        self._current: RotatedFile | None = None
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # nothing waits and nothing is being uploaded
        self._idle.set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="access-log-shipper")

    def rotated(self, path: str) -> None:
        """PATH has just become `path`: take it (from the writer thread; it opens
        the file, the loop never does)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            file = open(path, "rb")  # noqa: SIM115 (held until uploaded)
        except OSError as exc:
            log.warning("access log upload: cannot open %s (%s); it is not shipped",
                        path, exc.strerror)
            self._outcome("dropped")
            return
        item = RotatedFile(file, self._clock())
        try:
            loop.call_soon_threadsafe(self._offer, item)
        except RuntimeError:  # the loop closed meanwhile: the sidecar is gone
            file.close()

    def _offer(self, item: RotatedFile) -> None:
        self._pending.append(item)
        while len(self._pending) > self._max_pending:
            oldest = self._pending.popleft()
            log.warning("access log upload: %d files wait for the origin; the one rotated "
                        "at %s is given up", len(self._pending) + 1,
                        datetime.fromtimestamp(oldest.rotated_at, UTC).isoformat())
            self._outcome("dropped")
            self._close(oldest)
        self._idle.clear()
        self._wake.set()

    async def _run(self) -> None:
        first, last = self._retry_s
        delay = first
        while True:
            while not self._pending:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            item = self._current = self._pending.popleft()
            try:
                while not await self._ship(item):
                    # Kept out of the queue while it is retried: the bound holds
                    # the files behind it.
                    await asyncio.sleep(delay)
                    delay = min(last, delay * 2)
                delay = first
            finally:
                self._current = None
                self._close(item)

    async def _ship(self, item: RotatedFile) -> bool:
        key = object_key(self.location, self._node, item.rotated_at)
        try:
            size = await self._upload(self.location.bucket, key, self._parts(item.file),
                                      CONTENT_TYPE)
        except Exception as exc:  # origin, disk or SDK: counted, tried again
            self._outcome("failed")
            log.warning("access log upload to s3://%s/%s failed: %s", self.location.bucket,
                        key, exc)
            return False
        self._outcome("ok")
        log.info("access log shipped to s3://%s/%s (%d bytes)", self.location.bucket, key,
                 size)
        return True

    async def _parts(self, file: BinaryIO) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, file.seek, 0)
        while chunk := await loop.run_in_executor(self._executor, file.read, PART_BYTES):
            yield chunk

    def _close(self, item: RotatedFile) -> None:
        # The last close of a file already rotated away frees its blocks: disk work.
        self._executor.submit(item.file.close)

    async def stop(self, drain_s: float = STOP_DRAIN_S) -> None:
        """Give what waits `drain_s` to go, then stop; the files left stay on disk."""
        if self._task is None:
            return
        # Files the writer thread handed over just before (call_soon_threadsafe)
        # are queued once the loop has run its ready callbacks: one turn.
        await asyncio.sleep(0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_s)
        # The file the task holds when cancelled is left unshipped too: counted
        # before the cancel's cleanup forgets it.
        left = len(self._pending) + (self._current is not None)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if left:
            log.warning("access log upload: %d rotated files not shipped at stop; they stay "
                        "beside the log", left)
        while self._pending:
            self._close(self._pending.popleft())
