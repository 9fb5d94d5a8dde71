"""The optional JSON-lines access log of the data port (`access_log = PATH | "-"`).

One line per request, for offline analysis that the metrics cannot carry
because their labels must stay bounded: hit rates per node, topic and
partition, and the cache sizing of `python -m spark_warmup.capacity`, which
replays the `blocks` of these lines through the cache's own eviction policy.

    {"node": "broker-1", "time": "2026-11-01T06:00:00.123Z", "request_id": "9F3C...",
     "method": "GET", "bucket": "tiered", "key": "orders-Ab3/0/00000000000000000000-x.log",
     "etag": "\\"5d41...\\"", "object_size": 104857600, "range": "bytes=0-",
     "first_byte": 0, "last_byte": 104857599, "status": 206, "bytes": 1048576,
     "block_size": 4194304, "blocks": {"first": 0, "found": "f"}, "lane": "foreground",
     "cache": "miss", "duration_s": 0.0312, "cache_bytes": 68719476736,
     "origin_bytes": 4194304, "cut_off": null}

A read-ahead or warm fetch, which no request of the data port waits for, has a
line of its own when it ends: method "FETCH", request_id null, bytes 0, the
blocks it fetched ("f" each), its lane, and the origin bytes it brought. So
the log's origin_bytes, summed, are what the sidecar read from the origin
(sidecar_origin_bytes_total, `sidecar stats`), every lane included.

Fields (docs/ARCHITECTURE.md "Access log" has the same list):
  node         the sidecar's `node_name` (default: the host name)
  time         when the answer was complete (UTC, milliseconds)
  request_id   the x-amz-request-id the client was given
  method, bucket, key   as asked (key percent-decoded)
  etag, object_size     the object version answered (null without one: errors,
               requests that are not object reads)
  range        the Range header as sent (null without one)
  first_byte, last_byte the byte range the answer covers, inclusive (null without
               object data); `bytes` says how much of it was delivered
  status       the HTTP status (499: the client left before the answer)
  bytes        object bytes delivered (0 for HEAD and errors)
  block_size   the cache's block size
  blocks       the blocks the request touched, {"first": N, "found": "ccjf"}: one
               letter a block from block N on, c cached, j joined a fetch already on
               its way, f fetched by this request (sidecar.tally); null when it read none
  lane         the lane whose origin reads brought the uncached blocks (foreground,
               prefetch, warm), null when all were cached
  cache        hit, partial, miss or none, as the request duration metric's label
  duration_s   from the request's arrival to its last byte
  cache_bytes  the cache's configured size (what the capacity report calls current)
  origin_bytes body bytes this line's origin reads brought: a request's own
               fetches (whole blocks) and uncached reads; a FETCH line's blocks
               that landed whole
  cut_off      null, or why the sidecar cut the answer off after its status went
               out (client_timeout, paused, overloaded, origin, passthrough_timeout,
               stopped, error):
               `bytes` is then short of the range although `status` says 200 or 206

Writing never happens on the event loop: a line is formatted there and queued
(bounded); a thread writes it. A writer that falls behind or a log disk that
fails or fills drops lines, counted in sidecar_access_log_dropped_lines_total,
and service goes on. The file rotates at `access_log_max_size` (PATH.1 the
newest old file, up to `access_log_backups`), and each file rotated out is handed
to `rotated` (sidecar.telemetry.log_shipping ships it to the object store); "-"
writes to stdout for an orchestrator to collect.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import IO
from urllib.parse import unquote

from aiohttp import web

from sidecar.http_fields import as_sent
from sidecar.model import FetchDone
from sidecar.tally import ReadTally
from sidecar.telemetry.thread_names import name_this_thread

# The key a request's handler adds the object bytes it sent to (request[BODY_BYTES]);
# a typed key, as aiohttp asks (a plain string warns, NotAppKeyWarning).
LOG = logging.getLogger(__name__)

BODY_BYTES = web.RequestKey("sidecar_body_bytes", int)
# Lines queued for the writer thread at most: about 30 MB, a few seconds of a
# busy node's requests; past it lines are dropped rather than memory grown.
QUEUE_LINES = 65536
# Lines the writer takes from the queue per write() call.
BATCH_LINES = 512
# How often the writer checks that PATH is still the file it writes to.
WATCH_EVERY_S = 1.0
# How long close() waits for the writer to take the end marker and write what is
# queued: a hung disk (an NFS mount gone, a stuck device) must not hold a stop
# (SIGTERM) forever; past it the lines still queued are dropped, counted.
CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class NodeFacts:
    """What every line of one sidecar's log carries."""

    name: str
    block_size: int
    cache_bytes: int


@dataclass
class ReadFacts:
    """What the data port knew of an object read, filled as it answers."""

    etag: str | None = None
    object_size: int | None = None
    first_byte: int | None = None
    last_byte: int | None = None
    tally: ReadTally | None = None
    # Why the sidecar cut the answer off after its headers (its status says 200
    # or 206, as sent), one of metrics.CUTOFF_REASONS; None when it was not.
    cut_off: str | None = None


@dataclass(frozen=True)
class AccessEntry:
    node: str
    time: str
    request_id: str | None
    method: str
    bucket: str
    key: str
    etag: str | None
    object_size: int | None
    range: str | None
    first_byte: int | None
    last_byte: int | None
    status: int
    bytes: int
    block_size: int
    blocks: dict[str, int | str] | None
    lane: str | None
    cache: str
    duration_s: float
    cache_bytes: int
    origin_bytes: int = 0
    # Last, so that readers of the older lines (spark_warmup.capacity) see
    # every field where it was.
    cut_off: str | None = None


# The method of a background fetch's line (no request of the data port has it).
FETCH_METHOD = "FETCH"


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def entry(
    *, now: float, request_id: str, method: str, raw_path: str, range_header: str | None,
    status: int, body_bytes: int, cache: str, duration_s: float,
    node: NodeFacts | None = None, read: ReadFacts | None = None,
) -> AccessEntry:
    """What one request did. Pure: the caller hands in the clock and the request's facts."""
    node = node or NodeFacts("", 0, 0)
    path = raw_path.partition("?")[0]
    bucket, _, key = path.lstrip("/").partition("/")
    tally = read.tally if read is not None else None
    blocks: dict[str, int | str] | None = None
    if tally is not None and tally.first_block is not None:
        blocks = {"first": tally.first_block, "found": tally.letters}
    return AccessEntry(
        node=node.name, time=_stamp(now), request_id=request_id,
        method=method,
        # A malformed escape is logged as sent rather than dropped.
        bucket=unquote(bucket, errors="replace"), key=unquote(key, errors="replace"),
        etag=read.etag if read else None,
        object_size=read.object_size if read else None,
        range=None if range_header is None else as_sent(range_header),
        first_byte=read.first_byte if read else None,
        last_byte=read.last_byte if read else None,
        status=status, bytes=body_bytes, block_size=node.block_size, blocks=blocks,
        lane=tally.lane if tally is not None else None, cache=cache,
        duration_s=round(duration_s, 6), cache_bytes=node.cache_bytes,
        origin_bytes=tally.origin_bytes if tally is not None else 0,
        cut_off=read.cut_off if read is not None else None,
    )


def fetch_entry(*, now: float, done: FetchDone, node: NodeFacts) -> AccessEntry:
    """A background fetch that ended (read-ahead or warm). Pure, as `entry`."""
    info = done.info
    block_size = node.block_size or 1
    first_byte = done.first_block * block_size
    last_byte = min(info.size, (done.last_block + 1) * block_size) - 1
    return AccessEntry(
        node=node.name, time=_stamp(now), request_id=None, method=FETCH_METHOD,
        bucket=info.bucket, key=info.key, etag=info.etag, object_size=info.size,
        range=None, first_byte=first_byte, last_byte=last_byte,
        # 200: every block landed; 500: some did not (no slot, an origin failure).
        status=200 if done.ok else 500, bytes=0, block_size=node.block_size,
        blocks={"first": done.first_block,
                "found": "f" * (done.last_block - done.first_block + 1)},
        lane=done.lane, cache="none", duration_s=round(done.duration_s, 6),
        cache_bytes=node.cache_bytes, origin_bytes=done.origin_bytes,
    )


def format_entry(item: AccessEntry) -> str:
    """One JSON object on one line (json.dumps escapes any newline in a key)."""
    return json.dumps(asdict(item), separators=(",", ":"), ensure_ascii=False)


class LinesLost(OSError):
    """A write to the log file failed; `lines` of its lines are not in any file."""

    def __init__(self, lines: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.lines = lines


class RotatingFile:
    """Appends to PATH; at `max_bytes` PATH becomes PATH.1 (PATH.1 PATH.2 ...) and
    a new PATH starts; `rotated` is told "PATH.1" each time. Used by the writer
    thread only."""

    def __init__(self, path: str, max_bytes: int, backups: int,
                 rotated: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._rotated = rotated
        self._file: IO[bytes] | None = None
        self._size = 0
        self._checked = 0.0
        self.open()

    def open(self) -> None:
        # Unbuffered: a write the disk refuses leaves no bytes in a buffer for
        # a later flush (or close) to append after the file was cut back.
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (held open between writes)
        self._size = self._file.tell()

    def write(self, lines: list[bytes]) -> None:
        """Append whole lines, rotating between two lines when the next would
        take the file past max_bytes (a line is never split across files)."""
        if self._file is None or self._moved_away():
            self.close()
            self.open()
        batch: list[bytes] = []
        size = self._size
        kept = 0
        try:
            for line in lines:
                if self.max_bytes and size and size + len(line) > self.max_bytes:
                    self._append(batch)
                    kept += len(batch)
                    batch = []
                    self._rotate()
                    size = self._size
                batch.append(line)
                size += len(line)
            self._append(batch)
        except OSError as exc:
            # The lines before a rotation are in the rotated file: only the
            # rest are lost.
            raise LinesLost(len(lines) - kept, exc) from exc

    def _moved_away(self) -> bool:
        """Whether PATH is no longer the open file (an operator deleted or moved
        it): checked at most once a second, as logging.handlers.WatchedFileHandler
        does at each record, or the lines would go on to a deleted inode."""
        now = time.monotonic()
        if now - self._checked < WATCH_EVERY_S:
            return False
        self._checked = now
        assert self._file is not None
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False  # PATH cannot be looked at now: the open file is kept
        opened = os.fstat(self._file.fileno())
        return (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino)

    def _append(self, batch: list[bytes]) -> None:
        assert self._file is not None
        data = memoryview(b"".join(batch))
        if not data:
            return
        # Where this batch starts: the file's end now (not self._size, which
        # a copytruncate by a log rotator leaves stale).
        start = os.fstat(self._file.fileno()).st_size
        written = 0
        try:
            while written < len(data):
                written += self._file.write(data[written:]) or 0
        except OSError:
            # A full disk takes part of the batch, then refuses the rest: the
            # file is cut back to its last whole line (which frees the bytes),
            # or the next line would be appended to half of one, and neither
            # would be JSON.
            self._cut_back(start)
            raise
        self._size += written

    def _cut_back(self, size: int) -> None:
        assert self._file is not None
        try:
            os.ftruncate(self._file.fileno(), size)
        except OSError:
            pass  # the file is reopened for the next lines; what is there stays

    def _rotate(self) -> None:
        self.close()
        if self.backups:
            for number in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{number}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{number + 1}")
            os.replace(self.path, f"{self.path}.1")
            if self._rotated is not None:
                self._rotated(f"{self.path}.1")
            self.open()
        else:
            self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 (as in open())
            self._size = 0

    def rotate_out(self) -> None:
        """Rotate now if anything was written (at stop, so that a shipped log
        leaves nothing behind in PATH)."""
        if self._file is None:
            self.open()
        if self._size:
            self._rotate()

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:
                pass


class AccessLog:
    """Writes entries to `target` ("-" for stdout, else a file appended to and rotated)."""

    def __init__(
        self, target: str, node: NodeFacts | None = None, *, max_bytes: int = 0,
        backups: int = 0, dropped: Callable[[str, int], None] | None = None,
        queue_lines: int = QUEUE_LINES, rotated: Callable[[str], None] | None = None,
    ) -> None:
        self.node = node or NodeFacts("", 0, 0)
        self._rotates_out = rotated is not None
        self._file = None if target == "-" else RotatingFile(target, max_bytes, backups,
                                                               rotated)
        self._dropped = dropped or (lambda reason, lines: None)
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=queue_lines)
        self._in_hand = 0  # lines the writer thread is writing now
        self._thread = threading.Thread(target=self._run, name="sidecar-access-log",
                                        daemon=True)
        self._thread.start()

    def write(self, item: AccessEntry) -> None:
        """Queue one line (never blocks: a full queue drops it, counted)."""
        try:
            self._queue.put_nowait(format_entry(item) + "\n")
        except queue.Full:
            self._dropped("queue", 1)

    def _run(self) -> None:
        name_this_thread()
        while True:
            first = self._queue.get()
            lines = [first]
            while len(lines) < BATCH_LINES:
                try:
                    lines.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in lines
            batch = [line for line in lines if line is not None]
            if batch:
                self._in_hand = len(batch)  # what a stop cut short would lose
                self._emit(batch)
                self._in_hand = 0
            if done:
                return

    def _emit(self, lines: list[str]) -> None:
        try:
            if self._file is None:
                sys.stdout.write("".join(lines))
                sys.stdout.flush()
            else:
                self._file.write([line.encode("utf-8") for line in lines])
        except (OSError, ValueError) as exc:
            # A full or failing disk (or a closed stdout): these lines are lost,
            # counted; the file is opened afresh for the next ones.
            self._dropped("disk", exc.lines if isinstance(exc, LinesLost) else len(lines))
            if self._file is not None:
                self._file.close()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Write what is queued and close the file (rotated out first when rotated
        files are shipped), waiting `wait_s` at most for the writer thread: a
        hung disk leaves it (a daemon thread) and the lines it still holds,
        dropped and counted. Blocking: call it off the event loop."""
        deadline = time.monotonic() + wait_s
        try:
            self._queue.put(None, timeout=wait_s)
        except queue.Full:
            pass  # the writer takes nothing: it is stuck on the disk
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            # The writer thread owns the file while it runs: it is left as it is,
            # with the batch it holds and the lines still queued (not the end
            # marker, if it went in).
            with self._queue.mutex:
                queued = sum(1 for line in self._queue.queue if line is not None)
            left = self._in_hand + queued
            self._dropped("disk", left)  # the disk held them past the stop
            LOG.warning("access log: the disk did not take the last lines within "
                        "%.0f s; %d queued lines dropped", wait_s, left)
            return
        if self._file is not None:
            if self._rotates_out:
                try:
                    self._file.rotate_out()
                except OSError:
                    pass  # the lines are in PATH still, where the next start appends
            self._file.close()
