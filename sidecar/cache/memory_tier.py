"""The memory tier: verified chunks in memory the sidecar owns, sent with sendfile.

One anonymous memory file (memfd_create(2)) of ``memory_tier`` bytes, cut into
page-aligned regions of one chunk each. It is outside the Python heap and
outside the page cache of the slab, so it neither grows the interpreter nor
pushes the broker's pages out; it can be handed to ``sendfile(2)``, so a hit
in it goes to the socket with no read of the disk, no second hash and no copy
through Python.

- **Bounded.** The file is sized once and sealed against growing and
  shrinking (F_ADD_SEALS with F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL,
  memfd_create(2)): whatever the load, its memory never exceeds its size.
  The memory is shared memory (shmem): it counts toward a container's memory
  limit, not toward the process's RSS (regions are filled with pwrite, not
  through the mapping; the mapping is only read by the fallback below).
  ``reserve`` has the kernel give the pages ahead of use
  (``sidecar.cache.tier_reserve`` does so at start).
- **Verified on entry.** A chunk enters from the origin after its checksum
  was taken over the same bytes in hand, or from the disk after a read
  verified it. Hits are served without hashing again (DESIGN: verified bytes
  in the sidecar's own memory).
- **No byte on the wire changes.** The kernel keeps references to the pages
  a socket was handed until the peer read them. A region is therefore never
  rewritten in place: an evicted region's pages are released first
  (fallocate(2) FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, via ctypes: the
  os module has no fallocate with flags), and the refill lands in fresh
  pages while the old ones stay with the socket until sent. And a region is
  pinned for as long as a send from it is under way (``TierSlice``), because
  ``loop.sendfile`` hands the pages over in several calls as the socket
  drains: the policy never picks a pinned region.

Thread safe: the origin's worker threads and the disk executor put chunks in
(``put``), the event loop looks them up and sends them (``slice``); the
region table (``sidecar.cache.tier_regions``) is only touched under a lock,
the copies into the file are made outside it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from sidecar.cache.tier_regions import Key, RegionTable, TierCounts

log = logging.getLogger(__name__)

_FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]

Bytes = bytes | bytearray | memoryview

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_bytes() -> int:
    """The memory the tier could ever have: the machine's, or the memory limit
    of the cgroup the sidecar runs in where it is lower (a container's, or a
    systemd unit's MemoryMax=): the tier's shared memory counts toward it."""
    total = int(psutil.virtual_memory().total)
    try:
        membership = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return total
    return min([total, *cgroup_limits(membership, _CGROUP_ROOT)])


def cgroup_limits(membership: list[str], root: Path) -> list[int]:
    """The memory limits set on the process's cgroup and its ancestors, from the
    lines of /proc/self/cgroup (cgroups(7)): cgroup v2's memory.max under the
    unified line "0::PATH", or v1's memory.limit_in_bytes under the memory
    controller's line, under ``root`` (/sys/fs/cgroup). "max" (v2) is no
    limit; v1's default is a huge number, which the machine's memory is under."""
    found: list[int] = []
    for line in membership:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        group = base / path.lstrip("/")
        for folder in (group, *group.parents):
            if not folder.is_relative_to(base):
                break
            try:
                text = (folder / name).read_text().strip()
            except OSError:
                continue
            if text.isascii() and text.isdigit():
                found.append(int(text))
    return found


class TierSlice:
    """Bytes of one live region, pinned until ``release``: what a send takes.

    ``fd``/``offset``/``count`` are for ``loop.sendfile``; ``view`` is the
    same bytes in the mapping, for a transport that cannot send a file.
    """

    __slots__ = ("_region", "_tier", "count", "offset")

    def __init__(self, tier: MemoryTier, region: int, offset: int, count: int) -> None:
        self._tier = tier
        self._region: int | None = region
        self.offset = offset
        self.count = count

    def __len__(self) -> int:
        return self.count

    @property
    def file(self) -> int:
        return self._tier.fd

    def view(self) -> memoryview:
        return self._tier.view(self.offset, self.count)

    def release(self) -> None:
        """The send is over (or will not happen): the region may be evicted
        again. Idempotent."""
        region, self._region = self._region, None
        if region is not None:
            self._tier.unpin(region)


class MemoryTier:
    def __init__(self, size_bytes: int, region_size: int) -> None:
        page = mmap.PAGESIZE
        # Regions start on page boundaries: a hole punched over one frees whole
        # pages, and never a page of its neighbours.
        self.region_size = -(-region_size // page) * page
        regions = size_bytes // self.region_size
        if regions < 1:
            raise ValueError(f"memory_tier {size_bytes} cannot hold one chunk of "
                             f"{region_size} bytes")
        self.size_bytes = regions * self.region_size
        available = memory_bytes()
        if self.size_bytes > available:
            # The file and its mapping would be made (they are only address
            # space until written), but the tier could never fill: refused
            # before the table, which takes seconds for a mistyped size.
            raise OSError(errno.ENOMEM, f"more than the {available} bytes of memory "
                                        f"this machine or container has")
        self.fd = os.memfd_create("sidecar-memory-tier", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size_bytes)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, self.size_bytes, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self._table = RegionTable(regions, self.region_size)
        self._lock = threading.Lock()
        self._closed = False
        self._users = 0  # fills and sends under way
        # Whether the last fill was refused: once memory is short, every chunk
        # offered (thousands a second in a catch-up) is, and one line says so.
        self._refusing = False
        # Where the punch of a region purged while a send held it is run when the
        # send ends (the store's disk work); None: right there, blocking.
        self.release_later: Callable[[list[int]], None] | None = None

    @classmethod
    def create(cls, size_bytes: int, region_size: int) -> MemoryTier | None:
        """The tier, or None when ``size_bytes`` is 0 (turned off)."""
        return cls(size_bytes, region_size) if size_bytes else None

    @property
    def regions(self) -> int:
        return self._table.regions

    @property
    def counts(self) -> TierCounts:
        return self._table.counts

    def used_bytes(self) -> int:
        """Bytes of the chunks it holds."""
        with self._lock:
            return self._table.live_bytes

    def protected_bytes(self) -> int:
        """Bytes of the chunks a warm-up put here, kept until first read."""
        with self._lock:
            return self._table.protected_bytes

    def held_bytes(self) -> int:
        """Bytes of the regions that may hold pages (live, filling, or freed
        once a send lets go): what the accounting allows in memory, besides
        the pages ``reserve`` took ahead of use."""
        with self._lock:
            return self._table.held_regions * self.region_size

    def resident_bytes(self) -> int:
        """The memory the file holds now, as the kernel counts it (0 once closed)."""
        try:
            return os.fstat(self.fd).st_blocks * 512
        except OSError:
            return 0

    def figures(self) -> dict[str, int]:
        """Its size, use and counts, for the metrics (sidecar_memory_tier_*)."""
        counts = self.counts
        return {"size_bytes": self.size_bytes, "used_bytes": self.used_bytes(),
                "protected_bytes": self.protected_bytes(),
                "resident_bytes": self.resident_bytes(),
                "hits": counts.hits, "misses": counts.misses, "inserts": counts.inserts,
                "evictions": counts.evictions, "refused": counts.refused,
                "declined": counts.declined}

    def reserve(self, offset: int, length: int) -> int:
        """Have the kernel give the file's pages in [offset, offset + length)
        now (fallocate(2) mode 0; clipped to the file), so that chunks put
        there later are copied into pages it already holds: taking a fresh
        page costs more than copying into it, much more on memory the host
        never gave this machine (bench/ANALYSIS.md). Pages already holding a
        chunk are left as they are (mode 0 only fills holes), so a send under
        way sees no change; a region evicted later still gets fresh pages for
        its refill. Blocking; the bytes asked for (0 once closed). Raises
        OSError when the memory is refused."""
        end = min(offset + length, self.size_bytes)
        if not 0 <= offset < end:
            return 0
        with self._lock:
            if self._closed:
                return 0
            self._users += 1  # the file stays open until this call is over
        try:
            self._fallocate(0, offset, end - offset)
        finally:
            self._let_go()
        return end - offset

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._table

    def could_take(self, key: Key, *, reader: int | None = None) -> bool:
        """Whether a chunk read again may be ``put`` now, from the table's
        accounting alone (no I/O, a short lock: fit for the event loop). When
        not (held already, closed, or a full tier would decline or refuse it),
        the offer is counted as ``put``'s would be, and the caller spares the
        copy its trip to a thread."""
        with self._lock:
            return not self._closed and key not in self._table \
                and self._table.could_claim(key, reader=reader)

    def put(self, key: Key, data: Bytes, *, read: bool = True, warm: bool = False,
            reader: int | None = None) -> bool:
        """Keep a verified chunk; False when it is held already, no region is
        free of sends, it is not admitted, the tier is closed, or the memory
        refused it (a failed fill is the tier's own: never the disk's or the
        fetch's). ``read`` False: it was just fetched, not read; ``warm``: for
        a warm-up, kept until read; ``reader``: who read it (``RegionTable.claim``).
        Any thread; the copy is made outside the lock."""
        length = len(data)
        if not 0 < length <= self.region_size:
            return False
        with self._lock:
            if self._closed or key in self._table:
                return False
            claimed = self._table.claim(key, read=read, warm=warm, reader=reader)
            if claimed is None:
                return False
            self._users += 1  # the file stays open until this fill is over
        region, offset = claimed.region, claimed.region * self.region_size
        try:
            if claimed.evicted is not None:
                # Fresh pages for the refill: a socket may still hold the old ones.
                try:
                    self._punch(offset)
                except OSError as exc:
                    with self._lock:
                        self._table.withhold(region)
                    log.warning("memory tier region %d kept out of use: %s", region, exc)
                    return False
            try:
                self._fill(offset, data)
                with self._lock:
                    published = self._table.publish(region, key, length, warm=warm)
                    if published:
                        self._refusing = False
            except OSError as exc:
                self._give_back(region, offset)
                self._fill_refused(exc)
                return False
            except BaseException:
                self._give_back(region, offset)
                raise
            if not published:
                self._give_back(region, offset)
            return published
        finally:
            self._let_go()

    def protect(self, key: Key) -> bool:
        """Keep the chunk held under ``key`` until its first read, as one put
        for a warm-up is; False when it is not held (``RegionTable.protect``).
        Any thread, no I/O."""
        with self._lock:
            return not self._closed and self._table.protect(key)

    def protectable_chunks(self) -> int:
        """Chunks a warm-up may still protect here before the oldest
        protection lapses."""
        with self._lock:
            return 0 if self._closed else self._table.protectable_regions

    def slice(self, key: Key, start: int, end: int, *,
              reader: int | None = None) -> TierSlice | None:
        """Bytes [start, end) of the chunk held under ``key``, pinned, or None;
        ``reader`` as in ``RegionTable.find``."""
        with self._lock:
            if self._closed:
                return None
            found = self._table.find(key, reader)
            if found is None:
                return None
            region, length = found
            if not 0 <= start < end <= length:
                self._table.unpin(region)
                raise ValueError(f"bytes {start}..{end} outside a chunk of {length}")
            self._users += 1  # the file stays open until the send lets go
        return TierSlice(self, region, region * self.region_size + start, end - start)

    def forget(self, matches: Callable[[Key], bool]) -> None:
        """Drop the chunks whose keys match, and punch their pages out
        (blocking)."""
        with self._lock:
            if self._closed:
                return
            releasing = self._table.forget(matches)
            if releasing:
                self._users += 1
        self.release(releasing)

    def forget_object(self, bucket: str, key: str) -> list[int]:
        """Drop the object's chunks (purged or rewritten): lookups miss them
        from now on. The regions whose pages are still to be punched out:
        hand them to ``release``, once, off the event loop (a large object's
        punches take milliseconds). The file stays open until then."""
        with self._lock:
            if self._closed:
                return []
            releasing = self._table.forget_object(bucket, key)
            if releasing:
                self._users += 1
        return releasing

    def release(self, regions: list[int], *, punch: bool = True) -> None:
        """Punch the pages of regions ``forget_object`` returned out, and make
        them claimable again. Blocking. ``punch`` False: the tier is about to
        close (its store is closing), and its file goes with its pages, so
        none is punched (no kernel work on the event loop at shutdown); the
        regions stay releasing, never claimable (a fill until the close would
        land in pages a socket may hold), and only the hold on the file goes."""
        if not regions:
            return
        try:
            if punch:
                for region in regions:
                    self._release(region)
        finally:
            self._let_go()

    def unpin(self, region: int) -> None:
        """A send from the region is over (on the event loop). The last one of
        a purged region leaves its punch to ``release_later``: a hole punch is
        kernel work the loop must not wait for. The region stays releasing, so
        unclaimable, until the punch is done; the send's hold on the file is
        let go by ``release`` then."""
        try:
            with self._lock:
                releasing = self._table.unpin(region)
        except BaseException:
            self._let_go()
            raise
        if not releasing:
            self._let_go()
        elif self.release_later is None:
            self.release([region])
        else:
            self.release_later([region])

    def view(self, offset: int, count: int) -> memoryview:
        return memoryview(self._map)[offset:offset + count]

    def close(self) -> None:
        """Let the memory go, once the fills and sends under way are over (a
        worker thread may still be filling a region: the file must not close
        under it, and its number be reused, before it is done)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._let_go(0)

    def _let_go(self, users: int = 1) -> None:
        with self._lock:
            self._users -= users
            fd = self.fd
            last = self._closed and self._users == 0 and fd >= 0
            if last:
                self.fd = -1
        if last:
            try:
                self._map.close()
            except BufferError:
                pass  # a view is still out: the mapping goes with the last one
            os.close(fd)

    def _release(self, region: int) -> None:
        """A releasing region's pages out, then the region claimable again;
        never claimable before (a fill would land in pages a socket may hold,
        and the late punch would wipe what it published). A region whose
        punch fails is not given back: a region less, no byte changed."""
        with self._lock:
            closed = self._closed
        if not closed:  # a closed tier's file goes with its pages
            try:
                self._punch(region * self.region_size)
            except OSError as exc:
                log.warning("memory tier region %d kept out of use: %s", region, exc)
                return
        with self._lock:
            self._table.released(region)

    def _fill_refused(self, exc: OSError) -> None:
        """A fill the kernel refused: logged once until a chunk is kept again,
        not once a chunk (a memory limit refuses every one of them)."""
        with self._lock:
            first, self._refusing = not self._refusing, True
        if first:
            log.warning("memory tier: a chunk not kept: %s; chunks are declined, unlogged, "
                        "until one is kept again", exc)

    def _give_back(self, region: int, offset: int) -> None:
        """A claimed region back to the free list. Its pages were never sent
        (fresh, or punched before the fill), so a failed punch only leaves
        them to the next fill."""
        try:
            self._punch(offset)
        except OSError as exc:
            log.debug("memory tier region %d given back unpunched: %s", region, exc)
        finally:
            with self._lock:
                self._table.abandon(region)

    def _fill(self, offset: int, data: Bytes) -> None:
        # pwrite, not the mapping: the pages are never mapped into this
        # process, so they do not count in its RSS, and the copy runs without
        # the GIL (os.pwrite releases it).
        view = memoryview(data).cast("B")
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def _punch(self, offset: int) -> None:
        self._fallocate(_FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, self.region_size)

    def _fallocate(self, mode: int, offset: int, length: int) -> None:
        if _libc.fallocate(self.fd, mode, offset, length) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
