"""Playing the chaos schedule against the running rig: each event done, held
and healed in turn, on one thread."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.cache.slot_format import FILE_HEADER_SIZE, SLAB_FILE_NAME, SLOT_HEADER_SIZE
from tests.soak.rig import Supervisor
from tests.soak.schedule import Event, eio_start_s
from tests.support.fault_proxy import Fault, FaultProxy, Rule
from tests.support.loop_disk import LoopDisk, drop_pages

ADMIN_TIMEOUT_S = 60.0  # a warm call waits for its blocks
FILLER_NAME = "filler"


@dataclass
class FlippingObject:
    """An object the origin rewrites behind the sidecar's back, each time with
    the other of its two versions."""

    key: str
    versions: tuple[bytes, bytes]
    current: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def flip(self, origin_s3: Any, bucket: str) -> None:
        with self._lock:
            self.current = 1 - self.current
            origin_s3.put_object(Bucket=bucket, Key=self.key, Body=self.versions[self.current])


def origin_fault(event: Event) -> Fault:
    if event.detail == "503_burst":
        return Fault("status", 503, "ServiceUnavailable")
    if event.detail == "slow_down":
        return Fault("status", 503, "SlowDown")
    return Fault(event.detail, after_bytes=event.after_bytes, seconds=event.seconds)


@dataclass
class Chaos:
    supervisor: Supervisor
    proxy: FaultProxy
    disk: LoopDisk
    origin_s3: Any
    bucket: str
    segments: Sequence[str]
    flipping: Sequence[FlippingObject]
    block_size: int
    slots: int
    rng: random.Random
    stop: threading.Event
    injected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    warm_answers: Counter[str] = field(default_factory=Counter)
    # Origin requests an injected fault actually met (a fault waits for the
    # sidecar's next origin GETs, which a cache full of hits may not make).
    origin_requests_hit: Counter[str] = field(default_factory=Counter)
    mode_with_disk_full: Counter[str] = field(default_factory=Counter)
    log: list[tuple[float, str]] = field(default_factory=list)  # (seconds into the run, event)

    def play(self, events: Sequence[Event], started: float, duration_s: float) -> None:
        """Each event at its time (late if the one before ran long). An event that
        could not be healed before the EIO phase is skipped and counted."""
        eio_at = eio_start_s(duration_s)
        for event in events:
            if self.stop.wait(max(0.0, started + event.at_s - time.monotonic())):
                return
            late = time.monotonic() - started + event.hold_s >= eio_at
            if event.kind != "eio" and late:
                self.skipped[event.name] += 1
                continue
            self.log.append((round(time.monotonic() - started, 1), event.name))
            self.apply(event)
            self.injected[event.name] += 1
            # The proxy remembers every request it saw; the soak asks it nothing,
            # and a long run must not keep them all.
            self.proxy.seen.clear()

    def apply(self, event: Event) -> None:
        actions: dict[str, Callable[[Event], None]] = {
            "kill": lambda _: self.supervisor.kill_and_restart(),
            "origin_fault": lambda e: self._hold(e, lambda: self.proxy.add(
                origin_fault(e), "GET", None, e.times)),
            "etag_flip": self._etag_flip,
            "origin_down": lambda e: self._hold(e, lambda: setattr(self.proxy, "down", e.detail)),
            "warm": self._warm,
            "mode": self._mode,
            "disk_full": self._disk_full,
            "slab_truncate": self._slab_truncate,
            "punch_holes": self._punch_holes,
            "eio": self._eio,
        }
        actions[event.kind](event)

    def _hold(self, event: Event, inject: Callable[[], object]) -> None:
        rule = inject()
        self.stop.wait(event.hold_s)
        self.proxy.clear()
        if isinstance(rule, Rule):
            self.origin_requests_hit[event.name] += rule.hits

    def _etag_flip(self, event: Event) -> None:
        """The object is rewritten at the origin just before the sidecar's next
        GETs of it reach the origin: after its HEAD, before its GET."""
        target = self.rng.choice(self.flipping)
        self._hold(event, lambda: self.proxy.add(
            Fault("pass"), "GET", target.key, event.times,
            before=lambda: target.flip(self.origin_s3, self.bucket)))

    def _admin(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """(status, JSON answer); status 0 when the sidecar did not answer."""
        request = urllib.request.Request(
            self.supervisor.admin_url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {self.supervisor.admin_token}"})
        try:
            with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT_S) as response:
                return int(response.status), json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (OSError, ValueError):
            return 0, None

    def _warm(self, _: Event) -> None:
        keys = self.rng.sample(list(self.segments), 2)
        status, _ = self._admin("POST", "/api/v1/warm", {
            "objects": [{"bucket": self.bucket, "key": key, "start": 0, "end": None}
                        for key in keys], "ttl_s": 600})
        self.warm_answers[str(status)] += 1

    def _mode(self, event: Event) -> None:
        self._admin("PUT", "/api/v1/mode", {"mode": event.detail})
        self.stop.wait(event.hold_s)
        self._admin("PUT", "/api/v1/mode", {"mode": "normal"})

    def _disk_full(self, event: Event) -> None:
        """A filler file takes all the free space but two slots' worth: the
        cache's next writes fail with ENOSPC or it shrinks under its reserve."""
        filler = self.disk.mount / FILLER_NAME
        stats = os.statvfs(self.disk.mount)
        room = stats.f_bavail * stats.f_frsize - 2 * (self.block_size + SLOT_HEADER_SIZE)
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            if room > 0:
                os.posix_fallocate(fd, 0, room)
        except OSError as exc:  # the cache wrote meanwhile: the disk is full all the same
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        self.stop.wait(event.hold_s)
        _, answer = self._admin("GET", "/api/v1/mode")
        self.mode_with_disk_full[answer["mode"] if answer else "no answer"] += 1
        filler.unlink()

    def _slab_truncate(self, _: Event) -> None:
        slab = self.disk.mount / SLAB_FILE_NAME
        os.truncate(slab, slab.stat().st_size // 8)

    def _punch_holes(self, event: Event) -> None:
        """The data of a few slots (headers left alone) reads as zeros."""
        slab = self.disk.mount / SLAB_FILE_NAME
        for slot in self.rng.sample(range(self.slots), event.times):
            data_at = (FILE_HEADER_SIZE + slot * (SLOT_HEADER_SIZE + self.block_size)
                       + SLOT_HEADER_SIZE)
            subprocess.run(["fallocate", "--punch-hole", "--offset", str(data_at),
                            "--length", str(self.block_size), str(slab)], check=True)

    def _eio(self, _: Event) -> None:
        """The device loses all but its first 4 MiB (its superblock): reads of the
        slab's extents beyond fail with EIO, as from a dying disk."""
        drop_pages(self.disk.mount / SLAB_FILE_NAME)
        os.truncate(self.disk.backing, 4 * 1024 * 1024)
