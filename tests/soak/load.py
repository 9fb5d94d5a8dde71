"""The soak's clients: Kafka-like replay readers, random range readers and a
writer, every answer judged against the truth and counted in one Tally."""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from sidecar.tools.local_s3 import loopback_client
from tests.soak.judge import Ending, verify

MiB = 1024 * 1024
TIMEOUT_S = 30.0  # per socket operation: no request of the soak can hang
READ_PIECE = 256 * 1024
MAX_STEPS = 1_000_000  # every loop is bounded; the stop event ends them long before
BACKOFF_S = 0.2  # after an error, so that a sidecar being restarted is not spun on
WRONG_EXAMPLES = 20
TIMELINE_STEP_S = 10

Truth = tuple[bytes | None, ...]  # the versions an object may have; None: absent


@dataclass(frozen=True)
class Reply:
    status: int  # 0: no answer at all
    body: bytes
    ending: Ending
    error: str | None  # what went wrong, for the count by kind; None: judge it


def error_kind(exc: BaseException) -> str:
    return "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__


def fetch(url: str, bucket: str, key: str, first: int, last: int | None,
          want: int | None = None) -> Reply:
    """GET `bytes=first-last` on a new connection, reading at most `want` bytes
    of the body before hanging up (a Kafka fetch), else all of it."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port,
                                            timeout=TIMEOUT_S)
    span = f"bytes={first}-{'' if last is None else last}"
    pieces: list[bytes] = []
    status = 0
    try:
        connection.request("GET", f"/{bucket}/{quote(key)}", headers={"Range": span})
        response = connection.getresponse()
        status = response.status
        if response.status not in (200, 206):
            text = response.read(64 * 1024)
            code = text.partition(b"<Code>")[2].partition(b"</Code>")[0].decode(errors="replace")
            error = None if response.status == 404 else f"{response.status} {code}".strip()
            return Reply(response.status, b"", "whole", error)
        promised = response.length  # None only for a chunked body
        limit = promised if want is None or promised is None else min(want, promised)
        received = 0
        while limit is None or received < limit:
            piece = response.read(READ_PIECE if limit is None else min(READ_PIECE,
                                                                       limit - received))
            if not piece:
                break
            pieces.append(piece)
            received += len(piece)
        body = b"".join(pieces)
        if limit is not None and received < limit:
            return Reply(response.status, body, "cut", None)
        stopped = want is not None and promised is not None and want < promised
        return Reply(response.status, body, "stopped" if stopped else "whole", None)
    except (OSError, http.client.HTTPException) as exc:
        if pieces:
            return Reply(status, b"".join(pieces), "cut", None)
        return Reply(0, b"", "cut", error_kind(exc))
    finally:
        connection.close()


@dataclass
class Tally:
    started: float
    requests: int = 0
    bytes_verified: int = 0
    wrong_bytes: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    wrong_answers: list[dict[str, object]] = field(default_factory=list)
    # Per 10 s of the run: the answers that were not ok, to set beside the events.
    timeline: dict[int, Counter[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def judge(self, who: str, key: str, first: int, last: int | None, reply: Reply,
              truth: Truth) -> None:
        with self._lock:
            self.requests += 1
            if reply.error is not None:
                self.outcomes[reply.error] += 1
                self._mark(f"{who} {reply.error}")
                return
            verdict = verify(truth, reply.status, first, last, reply.body, reply.ending)
            self.outcomes[verdict.outcome] += 1
            if verdict.outcome != "ok":
                self._mark(f"{who} {verdict.outcome}")
            self.bytes_verified += verdict.bytes_verified
            self.wrong_bytes += verdict.wrong_bytes
            if verdict.outcome.startswith("wrong") and len(self.wrong_answers) < WRONG_EXAMPLES:
                self.wrong_answers.append({
                    "at_s": round(time.monotonic() - self.started, 1), "who": who, "key": key,
                    "range": f"{first}-{'' if last is None else last}", "status": reply.status,
                    "ending": reply.ending, "length": len(reply.body),
                    "wrong_bytes": verdict.wrong_bytes, "candidates": len(truth),
                })

    def count(self, outcome: str) -> None:
        with self._lock:
            self.requests += 1
            self.outcomes[outcome] += 1
            if outcome != "write ok":
                self._mark(outcome)

    def _mark(self, what: str) -> None:
        step = int(time.monotonic() - self.started) // TIMELINE_STEP_S * TIMELINE_STEP_S
        self.timeline.setdefault(step, Counter())[what] += 1


@dataclass
class Clients:
    """What every client shares: where the sidecar is now, the truth, the tally."""

    data_url: Callable[[], str]
    bucket: str
    truth: dict[str, Truth]
    tally: Tally
    stop: threading.Event


def replay_reader(clients: Clients, partitions: Sequence[Sequence[str]],
                  rng: random.Random) -> None:
    """A broker's remote reader: through a partition's segments in order, each a
    string of `bytes=pos-` fetches of about 1 MiB, the connection dropped after
    each; the next fetch starts a little before where this one ended (at the
    first record batch it did not get whole)."""
    for _ in range(MAX_STEPS):
        for key in rng.choice(partitions):
            (data,) = clients.truth[key]
            assert data is not None
            position = 0
            while position < len(data):
                if clients.stop.is_set():
                    return
                reply = fetch(clients.data_url(), clients.bucket, key, position, None,
                              want=rng.randrange(7 * MiB // 8, 9 * MiB // 8))
                clients.tally.judge("replay", key, position, None, reply, (data,))
                if reply.error is not None or reply.ending == "cut":
                    clients.stop.wait(BACKOFF_S)
                if reply.ending == "whole" and reply.error is None:
                    break
                if reply.body:
                    position += max(1, len(reply.body) - rng.randrange(16 * 1024))


def range_reader(clients: Clients, keys: Sequence[str], rng: random.Random) -> None:
    """Random ranges of random objects, now and then the whole object."""
    for _ in range(MAX_STEPS):
        if clients.stop.is_set():
            return
        key = rng.choice(keys)
        truth = clients.truth[key]
        # Within every version: an object that may be rewritten meanwhile
        # differs in size between its versions.
        size = min(len(version) for version in truth if version is not None)
        first, last = 0, None
        if rng.random() > 0.1:
            first = rng.randrange(size)
            last = min(size - 1, first + rng.choice((1, 4096, 65536, MiB, 3 * MiB)) - 1)
        reply = fetch(clients.data_url(), clients.bucket, key, first, last)
        clients.tally.judge("range", key, first, last, reply, truth)
        if reply.error is not None or reply.ending == "cut":
            clients.stop.wait(BACKOFF_S)


def s3_client(url: str) -> Any:
    """boto3 signs with the environment's credentials, the sidecar's own."""
    return loopback_client(url, connect_timeout=5, read_timeout=TIMEOUT_S)


def writer(clients: Clients, keys: int, rng: random.Random) -> None:
    """PUTs and DELETEs of its own scratch keys through the sidecar (signed),
    each followed by a read back. A write that failed may have reached the
    origin or not: until the next one succeeds, the key may be either. A key
    with too many such doubts is left and a new one taken."""
    names = [f"scratch/{n}-0" for n in range(keys)]
    truth: dict[str, Truth] = {name: (None,) for name in names}
    client: Any = None
    client_url = ""
    try:
        for step in range(MAX_STEPS):
            if clients.stop.is_set():
                return
            if clients.data_url() != client_url:  # restarted: a new port
                if client is not None:
                    client.close()
                client_url = clients.data_url()
                client = s3_client(client_url)
            slot = rng.randrange(keys)
            name = names[slot]
            new = None if rng.random() < 0.25 else rng.randbytes(rng.randrange(1, 3 * MiB))
            try:
                if new is None:
                    client.delete_object(Bucket=clients.bucket, Key=name)
                else:
                    client.put_object(Bucket=clients.bucket, Key=name, Body=new)
                truth[name] = (new,)
                clients.tally.count("write ok")
            except (BotoCoreError, ClientError) as exc:
                code = exc.response["Error"]["Code"] if isinstance(exc, ClientError) else ""
                clients.tally.count(f"write {code or error_kind(exc)}")
                truth[name] = (*truth[name], new)
                clients.stop.wait(BACKOFF_S)
            reply = fetch(client_url, clients.bucket, name, 0, None)
            clients.tally.judge("writer", name, 0, None, reply, truth[name])
            if reply.error is not None or reply.ending == "cut":
                clients.stop.wait(BACKOFF_S)
            if len(truth[name]) > 4:
                names[slot] = f"scratch/{slot}-{step + 1}"
                truth[names[slot]] = (None,)
                del truth[name]
    finally:
        if client is not None:
            client.close()
