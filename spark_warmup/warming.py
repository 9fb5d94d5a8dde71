"""Executor side: ask one node's sidecar to warm its segments (`POST /api/v1/warm`).

One Spark task per sidecar sends one call per segment (the whole object), at most
`concurrency` at a time, so a sidecar's warm lane sees a bounded number of
callers however large the cluster. Connection errors, timeouts and 5xx answers
are retried with exponential backoff; the sidecar's single-flight table and
cache make a repeated call cheap (its blocks come back `already_cached`), so a
retry, or a rerun of the whole plan, never fetches a block twice.

A node whose calls keep failing after all retries is given up for the rest of
the run: its remaining segments are reported failed at once rather than each
waiting out its own retries. A call that times out is not simply retried: a
sidecar that took the connection and answers nothing (hung) would hold the
task for every retry's whole timeout, so the node's /healthz is asked first,
with a short timeout, and a node that does not answer it either is given up
at once. One that answers it (alive, its warm-up stuck) gets one more try, and
is given up when that times out too. Failing on the network (refused, reset, timed out)
takes it as down; answering 5xx (its origin unavailable) is said as such, since
the node answered. A sidecar whose mode (`cache-only`, `bypass`) pauses warm-up
answers 503 naming the mode: that lasts until an operator changes it, far
beyond a call's retries, so it is not retried and the node gets no more calls;
its rows fail naming the mode. A 4xx (a key the origin does not have, a refused
body) fails its row with the sidecar's message and is not retried.

HTTP is the standard library's urllib, to keep what executors need small; it
follows no redirect and verifies TLS against the plan's CA file
(spark_warmup.sidecar_http).
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sidecar.blocks import block_count
from spark_warmup.outcome import WarmRow
from spark_warmup.sidecar_http import ANSWER_BYTES, Post, http_answers, opener, poster

_BACKOFF_S = 0.25
_MAX_BACKOFF_S = 5.0
# Segments of a node that fail in a row, after their retries, before it is given up.
_DOWN_AFTER = 2
# A call's timeout: room for the sidecar to fetch every object of the call at a
# slow 1 MiB/s, with a base for its HEADs and first bytes and a little more for
# each object beyond the first (each is HEADed and starts a block of its own).
_BASE_TIMEOUT_S = 30.0
_PER_OBJECT_S = 2.0
_SLOW_BYTES_PER_S = 1024 * 1024
_MAX_TIMEOUT_S = 3600.0
# How long a node whose warm call timed out has to answer its /healthz, which
# a live sidecar answers at once whatever its warm-up is doing.
_PROBE_TIMEOUT_S = 5.0
# Warm calls of one segment that time out while the node answers /healthz before
# the node is given up: the first may be a slow origin, the second is not.
_WEDGED_AFTER = 2
# The modes in which a sidecar pauses warm-up (sidecar/isolation/modes.py).
_PAUSING_MODES = ("cache-only", "bypass")
# How a sidecar from before the 503's "mode" field says it (sidecar/engine/warm_up.py).
_PAUSED_MESSAGE = re.compile(r"mode ([a-z-]+): warm-up is paused")


@dataclass(frozen=True)
class PlannedSegment:
    topic: str
    partition: int
    key: str
    size: int  # of the .log
    node: str
    companions: tuple[tuple[str, int], ...] = ()  # its manifest and indexes, (key, size)

    @property
    def bytes(self) -> int:
        """Everything a warm call of the segment fetches: its log and its companions."""
        return self.size + sum(size for _, size in self.companions)

    def blocks(self, block_size: int) -> int:
        """The blocks of the segment's objects (each object starts a block of its own)."""
        return sum(block_count(size, block_size)
                   for size in (self.size, *(size for _, size in self.companions)))


@dataclass(frozen=True)
class NodeBatch:
    """Everything one task needs to warm one node's share of the plan."""

    node: str
    url: str  # the sidecar's admin URL
    bucket: str
    segments: tuple[PlannedSegment, ...]
    ttl_s: float
    token: str | None
    concurrency: int
    retries: int
    block_size: int  # only to count the blocks of a segment no sidecar answered for
    ca_file: str | None = None  # PEM CAs for https:// sidecars; None: the system's


class WarmCallError(Exception):
    """Why a warm call failed. `transient`: worth a retry; `network`: the sidecar
    did not answer at all; `mode`: it answered that its mode pauses warm-up;
    `down`: the node is to get no more calls this run (hung, or its mode)."""

    def __init__(self, message: str, transient: bool, *, network: bool = False,
                 mode: str | None = None, down: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
        self.network = network
        self.mode = mode
        self.down = down or mode is not None


def unanswered(node: str, url: str, timeout: float = 5.0,
               ca_file: str | None = None) -> str | None:
    """What a real run's calls to the sidecar at `url` would fail on, or None: it
    does not answer its admin port (GET /healthz), or its mode pauses warm-up
    (GET /readyz names the mode, without a token). A dry run checks what a real
    run would meet."""
    base = url.rstrip("/")
    try:
        director = opener(ca_file)  # a CA file gone bad since the plan was read: OSError
        with http_answers(), director.open(f"{base}/healthz", timeout=timeout) as response:
            if response.status != 200:
                return f"sidecar {node} at {url} answered {response.status} to /healthz"
    except urllib.error.HTTPError as exc:
        with exc:
            return f"sidecar {node} at {url} answered {exc.code} to /healthz"
    except OSError as exc:  # refused, reset, timed out (URLError is an OSError)
        return f"sidecar {node} at {url} unreachable: {_reason(exc)}"
    except ValueError as exc:  # not a URL urllib can open
        return f"sidecar {node}: {url!r} is not a URL: {exc}"
    mode = _mode_of(director, f"{base}/readyz", timeout)
    if mode in _PAUSING_MODES:
        return (f"sidecar {node} at {url} is in {mode} mode, which pauses warm-up: a real "
                "run would fail its segments")
    return None


def _mode_of(director: urllib.request.OpenerDirector, url: str, timeout: float
             ) -> str | None:
    """The mode /readyz names (it answers 503 with the same body while not ready),
    or None when it names none: a sidecar without it, or no answer now."""
    try:
        with http_answers():
            try:
                with director.open(url, timeout=timeout) as response:
                    answer = response.read(ANSWER_BYTES + 1)
            except urllib.error.HTTPError as exc:
                with exc:
                    answer = exc.read(ANSWER_BYTES + 1)
    except (OSError, ValueError):
        return None
    document = _json_object(answer)
    mode = document.get("mode") if document is not None else None
    return mode if isinstance(mode, str) else None


def warm_call(post: Post, batch: NodeBatch, segment: PlannedSegment,
              sleep: Callable[[float], None] = time.sleep,
              probe: Callable[[], str | None] | None = None) -> dict[str, int]:
    """One segment's warm call with retries; the sidecar's counts, or WarmCallError.
    `probe`: after a call timed out, why the node does not answer its health
    check (None: it does); default `unanswered` with a short timeout."""
    if probe is None:
        probe = functools.partial(unanswered, batch.node, batch.url, _PROBE_TIMEOUT_S,
                                  batch.ca_file)
    body = json.dumps({
        "objects": [{"bucket": batch.bucket, "key": key, "start": 0, "end": None}
                    for key in (segment.key, *(key for key, _ in segment.companions))],
        "ttl_s": batch.ttl_s,
    }).encode()
    headers = {"Content-Type": "application/json"}
    if batch.token:
        headers["Authorization"] = f"Bearer {batch.token}"
    timeout = call_timeout(segment)
    attempt = 0
    timed_out_while_healthy = 0
    while True:
        try:
            status, answer = post(f"{batch.url}/api/v1/warm", body, headers, timeout)
        except OSError as exc:  # refused, reset, timed out (URLError is an OSError)
            failure = WarmCallError(f"sidecar {batch.node} unreachable: {_reason(exc)}", True,
                                    network=True)
            if _timed_out(exc):
                if (hung := probe()) is not None:
                    # Not a long warm-up: the node answers nothing at all. Each
                    # retry would wait out the whole call timeout again.
                    raise WarmCallError(f"sidecar {batch.node} did not answer the warm call "
                                        f"in {timeout:.0f} s, nor then its health check "
                                        f"({hung})", False, network=True, down=True) from None
                timed_out_while_healthy += 1
                # It answered its health check, so no network fault: with no
                # retry left this is the row's error, and "unreachable" would
                # send the operator looking for one.
                failure = WarmCallError(
                    f"sidecar {batch.node} answers its health check but did not answer "
                    f"the warm call in {timeout:.0f} s", True)
                if timed_out_while_healthy >= _WEDGED_AFTER:
                    # Alive but its warm-up answers nothing: one more try was
                    # enough to tell a slow origin (the retry finds the blocks
                    # fetched so far cached) from a wedged warm-up, which would
                    # hold this task for every further retry's whole timeout.
                    raise WarmCallError(
                        f"sidecar {batch.node} answers its health check but did not answer "
                        f"the warm call in {timeout:.0f} s, {timed_out_while_healthy} times: "
                        "its warm-up is stuck (see its log; a restart frees it)",
                        False, down=True) from None
        else:
            if status == 200:
                return _counts(batch.node, answer)
            failure = _refusal(batch.node, status, answer)
        if not failure.transient or attempt >= batch.retries:
            raise failure
        sleep(min(_MAX_BACKOFF_S, _BACKOFF_S * 2 ** attempt))
        attempt += 1


def call_timeout(segment: PlannedSegment) -> float:
    """Seconds one warm call of `segment` may take: it warms the log and its
    companions (manifest, indexes) together, so all of them count."""
    seconds = (_BASE_TIMEOUT_S + _PER_OBJECT_S * len(segment.companions)
               + segment.bytes / _SLOW_BYTES_PER_S)
    return min(_MAX_TIMEOUT_S, seconds)


def _refusal(node: str, status: int, answer: bytes) -> WarmCallError:
    """The error of a call the sidecar answered with other than 200."""
    if 300 <= status < 400:
        return WarmCallError(
            f"sidecar {node} answered a redirect ({status}), which is not followed: "
            "the admin token goes only to the URL the plan names", False)
    mode = _pausing_mode(answer) if status == 503 else None
    if mode is not None:
        return WarmCallError(f"sidecar {node} is in {mode} mode, which pauses warm-up "
                             "(it answered 503; not retried: warm again once its mode is "
                             "normal)", False, mode=mode)
    return WarmCallError(f"sidecar {node} answered {status}: {_error_text(answer)}",
                         status >= 500)


def _pausing_mode(answer: bytes) -> str | None:
    """The mode a sidecar's 503 says pauses warm-up, or None for any other 503
    (the origin unavailable, a proxy's page)."""
    document = _json_object(answer)
    if document is None:
        return None
    mode = document.get("mode")
    if mode is None and isinstance(document.get("error"), str):
        said = _PAUSED_MESSAGE.fullmatch(document["error"])
        mode = said.group(1) if said else None
    return mode if mode in _PAUSING_MODES else None


def warm_node(batch: NodeBatch, post: Post | None = None,
              sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic,
              probe: Callable[[], str | None] | None = None) -> list[WarmRow]:
    """Warm every segment of the batch on its sidecar; one report row per segment.
    `post`: how to send a call (default: urllib, no redirects, the batch's CAs);
    `probe`: the health check after a timed-out call (warm_call)."""
    if post is None:
        try:
            post = poster(batch.ca_file)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            error = f"cannot use ca_file {batch.ca_file}: {exc}"
            return [_failed(WarmRow(s.topic, s.partition, s.key, batch.node, s.bytes), s,
                            batch, error, 0.0) for s in batch.segments]
    return _warm_all(batch, post, sleep, clock, probe)


def _warm_all(batch: NodeBatch, post: Post, sleep: Callable[[float], None],
              clock: Callable[[], float], probe: Callable[[], str | None] | None
              ) -> list[WarmRow]:
    lock = threading.Lock()
    failures_in_a_row = 0
    down: str | None = None  # why the node gets no more calls, once it does not

    def one(segment: PlannedSegment) -> WarmRow:
        nonlocal failures_in_a_row, down
        row = WarmRow(segment.topic, segment.partition, segment.key, batch.node, segment.bytes)
        with lock:
            known_down = down
        if known_down is not None:
            return _failed(row, segment, batch, known_down, 0.0)
        started = clock()
        try:
            counts = warm_call(post, batch, segment, sleep, probe)
        except WarmCallError as exc:
            with lock:
                if exc.down and down is None:
                    # Its mode outlasts the run, or it answers nothing: no more
                    # calls to it.
                    down = f"{exc}; no more calls to it this run"
                elif exc.transient:
                    failures_in_a_row += 1
                    if failures_in_a_row >= _DOWN_AFTER and down is None:
                        down = f"{exc} ({_given_up(exc)})"
            return _failed(row, segment, batch, str(exc), clock() - started)
        with lock:
            failures_in_a_row = 0
        return WarmRow(
            row.topic, row.partition, row.key, row.node, row.bytes,
            blocks=int(counts.get("requested_blocks", 0)),
            already_cached=int(counts.get("already_cached", 0)),
            fetched=int(counts.get("fetched", 0)),
            failed=int(counts.get("failed", 0)),
            bytes_fetched=int(counts.get("bytes_fetched", 0)),
            seconds=clock() - started,
        )

    with ThreadPoolExecutor(max_workers=batch.concurrency) as pool:
        return list(pool.map(one, batch.segments))


def _given_up(exc: WarmCallError) -> str:
    if exc.network:
        return "node taken as down for the rest of the run"
    # It answers, so it is not down; its origin is, most likely, for now.
    return (f"so for {_DOWN_AFTER} segments in a row, each after its retries: "
            "no more calls to it this run")


def _failed(row: WarmRow, segment: PlannedSegment, batch: NodeBatch, error: str,
            seconds: float) -> WarmRow:
    # No sidecar said how many blocks: count them at the plan's block size.
    blocks = segment.blocks(batch.block_size)
    return WarmRow(row.topic, row.partition, row.key, row.node, row.bytes,
                   blocks=blocks, failed=blocks, seconds=seconds, error=error)


# The counts of a warm answer (POST /api/v1/warm, docs/ARCHITECTURE.md).
_COUNTS = ("requested_blocks", "already_cached", "fetched", "failed", "bytes_fetched")


def _counts(node: str, answer: bytes) -> dict[str, int]:
    """The counts of a 200 answer, or WarmCallError (not retried) when it is not
    the warm API's JSON (a proxy's page, a truncated or huge body): the segment's
    row fails with a clear error, not the node's whole task."""
    document = _json_object(answer)
    counts = ({name: document.get(name, 0) for name in _COUNTS}
              if document is not None else {})
    if not counts or not all(type(value) is int and value >= 0 for value in counts.values()):
        raise WarmCallError(f"sidecar {node} answered 200 with what is not the warm API's "
                            f"answer: {answer[:200].decode(errors='replace')!r}", False)
    return counts


def _timed_out(exc: OSError) -> bool:
    """Whether a call failed on its timeout (connecting or waiting for the
    answer), not on a refused or reset connection."""
    return isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None),
                                                       TimeoutError)


def _reason(exc: OSError) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc)


def _error_text(answer: bytes) -> str:
    document = _json_object(answer)
    if document is not None and "error" in document:
        return str(document["error"])
    return answer[:200].decode(errors="replace")


def _json_object(answer: bytes) -> dict[str, Any] | None:
    """The JSON object a sidecar's answer holds, or None when it holds none: not
    JSON or not UTF-8 (a proxy's page, a body cut short), or JSON of another kind
    (an array, a string)."""
    try:
        document = json.loads(answer)
    except ValueError:  # UnicodeDecodeError too
        return None
    return document if isinstance(document, dict) else None
