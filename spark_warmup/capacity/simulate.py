"""Replay one node's reads through the sidecar's own cache policy and read-ahead. Pure.

The simulation drives the very classes the sidecar serves with:
`sidecar.cache.slot_fifo.SlotFifo` (S3-FIFO over slot numbers, as the store
keeps it) through its public methods, over slots taken and freed as the store
takes and frees them, and
`sidecar.prefetch.planner.ReadAheadPlanner` with its `StreamTable`, told what
the engine tells them (sidecar/engine/): a request starts, bytes were
delivered (per 1 MiB piece), a reader took a block, a block left the cache.
What the engine adds around them is modelled here as it does it:

- a lookup that finds the block resident is a hit; the first read of a block
  cached before anyone read it (coalesced run, read-ahead) is its first use,
  not a reuse, and does not count for eviction (BlockStore.lookup);
- a miss of a bounded range fetches the missing blocks from there on, up to
  max_coalesce blocks, in one run; an open-ended one a block at a time;
- manifests and indexes of the Aiven layout skip probation (admit_to_main);
- the slab holds capacity // (block_size + slot header) blocks.

Fetches land at once: a block read ahead is there when its reader comes, which
the real sidecar counts as a hit too (joined, it costs no origin read of the
reader's own). What is counted: bytes delivered, those found resident, and
the bytes fetched from the origin per lane (foreground, prefetch).

Sampling (SHARDS, Waldspurger et al., FAST '15): a trace sampled spatially at
rate R (whole partitions kept when hash < R) behaves like the whole trace in a
cache R times smaller, so the caller replays it at capacity * R.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from sidecar.cache.ident import BlockIdent
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.layout import Layout, is_small_object
from sidecar.model import ObjectInfo
from sidecar.prefetch.planner import NextSegment, ReadAheadPlanner
from sidecar.prefetch.streams import Stream, StreamTable

# Bytes of each slot's header in the slab (sidecar/cache/slot_format.py SLOT_HEADER_SIZE,
# asserted equal by the tests): not imported here, the format needs xxhash, which
# the executors lack.
SLOT_HEADER_SIZE = 4096
# The engine's piece size: read heads advance, and read-ahead is planned, per piece.
PIECE_SIZE = 1024 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Read(NamedTuple):
    """One object read of a node's trace (what the simulation needs of a log line)."""

    time_s: float
    bucket: str
    key: str
    etag: str
    object_size: int
    first_byte: int
    bytes: int
    lazy: bool


@dataclass(frozen=True)
class Settings:
    """The sidecar settings the replay follows (defaults: the option table's)."""

    block_size: int
    max_coalesce_bytes: int = 64 * 1024 * 1024
    read_ahead: bool = True
    max_window_bytes: int = 64 * 1024 * 1024
    max_in_flight: int = 16
    cache_share: float = 0.25
    stream_idle_s: float = 60.0
    layout: Layout = Layout.AIVEN
    layout_prefix: str = ""

    @property
    def max_coalesce_blocks(self) -> int:
        # As the sidecar derives them from its sizes (sidecar.config.loading,
        # sidecar.engine.max_coalesce_blocks).
        return max(1, self.max_coalesce_bytes // self.block_size)

    @property
    def max_window_blocks(self) -> int:
        return max(1, self.max_window_bytes // self.block_size)


@dataclass(frozen=True)
class Outcome:
    """A replay at one cache size (bytes of the sampled trace, not scaled)."""

    cache_bytes: int
    slots: int
    served_bytes: int
    hit_bytes: int
    blocks: int
    hit_blocks: int
    origin_foreground: int
    origin_prefetch: int
    # Read-ahead that left the cache unread: origin bytes for nothing.
    prefetch_wasted: int = 0

    @property
    def origin_bytes(self) -> int:
        return self.origin_foreground + self.origin_prefetch

    @property
    def byte_hit_ratio(self) -> float:
        return self.hit_bytes / self.served_bytes if self.served_bytes else 0.0

    @property
    def origin_per_served(self) -> float:
        return self.origin_bytes / self.served_bytes if self.served_bytes else 0.0

    @property
    def wasted_per_served(self) -> float:
        return self.prefetch_wasted / self.served_bytes if self.served_bytes else 0.0


def slots_for(cache_bytes: int, block_size: int) -> int:
    return max(1, cache_bytes // (block_size + SLOT_HEADER_SIZE))


class Replay:
    """One node's cache at one size, fed reads in time order."""

    def __init__(self, settings: Settings, cache_bytes: int, sample_rate: float = 1.0,
                 keys: Iterable[tuple[str, str, str, int]] = ()) -> None:
        self.settings = settings
        self.cache_bytes = cache_bytes
        self.slots = slots_for(int(cache_bytes * sample_rate), settings.block_size)
        self.now = 0.0
        # Slots as the store has them: free, being written, or resident (in the
        # policy, which names them by number; the maps say which block is where).
        self._free = list(range(self.slots - 1, -1, -1))
        self._slot_of: dict[BlockIdent, int] = {}
        self._ident_at: dict[int, BlockIdent] = {}
        self.policy = SlotFifo(self.slots, self._fingerprint_at)
        self.unread: set[BlockIdent] = set()
        # Blocks being fetched: a slot reserved, not yet in the policy (-> whether
        # a reader read them as they landed, and the slot).
        self._writing: dict[BlockIdent, tuple[bool, int]] = {}
        self._reading_ahead: set[BlockIdent] = set()  # of those, read-ahead fetches
        self.planner: ReadAheadPlanner | None = None
        if settings.read_ahead:
            table = StreamTable(block_size=settings.block_size,
                                max_window_blocks=settings.max_window_blocks,
                                idle_s=settings.stream_idle_s, clock=lambda: self.now)
            self.planner = ReadAheadPlanner(
                table, max_in_flight=settings.max_in_flight,
                max_pending=int(self.slots * settings.cache_share),
                layout=settings.layout, layout_prefix=settings.layout_prefix)
        # The objects the trace knows, for read-ahead into a partition's next
        # segment: (bucket, key) -> (etag, size); keys per bucket.
        self._objects: dict[tuple[str, str], tuple[str, int]] = {}
        self._keys: dict[str, list[str]] = {}
        for bucket, key, etag, size in keys:
            self._know(bucket, key, etag, size)
        self.served = self.hit_bytes = self.blocks = self.hit_blocks = 0
        self.origin_foreground = self.origin_prefetch = 0
        self.prefetch_wasted = 0
        self._ahead_unread: set[BlockIdent] = set()  # read ahead, cached, not yet read

    def _know(self, bucket: str, key: str, etag: str, size: int) -> None:
        if (bucket, key) not in self._objects:
            self._keys.setdefault(bucket, []).append(key)
        self._objects[(bucket, key)] = (etag, size)

    def finish(self) -> None:
        self._land()

    def outcome(self) -> Outcome:
        return Outcome(self.cache_bytes, self.slots, self.served, self.hit_bytes, self.blocks,
                       self.hit_blocks, self.origin_foreground, self.origin_prefetch,
                       self.prefetch_wasted)

    def read(self, read: Read) -> None:
        self.now = read.time_s
        block_size = self.settings.block_size
        piece = min(PIECE_SIZE, block_size)
        info = ObjectInfo(read.bucket, read.key, read.object_size, read.etag, _EPOCH)
        self._know(read.bucket, read.key, read.etag, read.object_size)
        self._land()  # what the previous request started has landed
        stream = self.planner.on_request(info, read.first_byte) if self.planner else None
        if stream is not None:
            self._read_ahead(stream, info, read.first_byte)
        end = read.first_byte + read.bytes  # exclusive
        last_block = (end - 1) // block_size
        position = read.first_byte
        started: set[int] = set()  # blocks this request's own fetches brought
        for block in range(read.first_byte // block_size, last_block + 1):
            ident = BlockIdent(read.bucket, read.key, read.etag, block)
            block_start = block * block_size
            block_end = min(read.object_size, block_start + block_size)
            delivered = min(end, block_end) - max(read.first_byte, block_start)
            self.blocks += 1
            self.served += delivered
            self._ahead_unread.discard(ident)
            if block in started:
                self._land(ident)  # the reader waits for it: read as it lands
            elif ident in self._writing:  # joined a fetch on its way
                self.hit_blocks += 1
                self.hit_bytes += delivered
                self._land(ident)
            elif ident in self._slot_of:
                self.hit_blocks += 1
                self.hit_bytes += delivered
                if ident in self.unread:
                    self.unread.discard(ident)
                else:
                    self.policy.touch(self._slot_of[ident])
            else:
                started.update(self._fetch_foreground(
                    info, block, last_block if not read.lazy else block))
                self._land(ident)
            if self.planner is not None:
                self.planner.on_block_read(ident)
            upto = min(end, block_end)
            while position < upto:
                position = min(upto, (position // piece + 1) * piece)
                if stream is not None:
                    self._read_ahead(stream, info, position)

    def _present(self, ident: BlockIdent) -> bool:
        return ident in self._slot_of or ident in self._writing

    def _fingerprint_at(self, slot: int) -> int:
        return _fingerprint(self._ident_at[slot])

    def _fetch_foreground(self, info: ObjectInfo, block: int, last_wanted: int) -> range:
        """A miss: the block and the missing ones after it in the range, one run.
        Their bytes reach this request from the origin (the engine's `started`)."""
        run_end = block + 1
        while run_end <= last_wanted and run_end - block < self.settings.max_coalesce_blocks:
            if self._present(BlockIdent(info.bucket, info.key, info.etag, run_end)):
                break
            run_end += 1
        for number in range(block, run_end):
            self.origin_foreground += self._length(info, number)
            self._reserve(BlockIdent(info.bucket, info.key, info.etag, number),
                          read=number == block)
        return range(block, run_end)

    def _main(self, ident: BlockIdent) -> bool:
        return self.settings.layout is Layout.AIVEN and \
            is_small_object(ident.key, self.settings.layout_prefix)

    def _reserve(self, ident: BlockIdent, read: bool) -> bool:
        """A slot for a block about to be fetched, as BlockStore.begin_write takes
        one: a free slot, else a victim chosen now; while other writes are on
        their way into probation, from the small FIFO only (or, when it has
        none, once the earliest of them landed). False: no slot (uncached)."""
        while len(self.policy) + len(self._writing) >= self.slots:
            joining = any(not self._main(other) for other in self._writing)
            victims = self.policy.choose_victims(1, probation_only=joining)
            if victims:
                self._evicted(victims[0])
                break
            if not joining:
                return False
            self._land(next(iter(self._writing)), read=None)
        self._writing[ident] = (read, self._free.pop())
        return True

    def _evicted(self, slot: int) -> None:
        victim = self._ident_at.pop(slot)
        del self._slot_of[victim]
        self._free.append(slot)
        self.unread.discard(victim)
        if victim in self._ahead_unread:
            self._ahead_unread.discard(victim)
            self.prefetch_wasted += self._block_bytes(victim)
        if self.planner is not None:
            self.planner.on_evicted(victim)

    def _land(self, ident: BlockIdent | None = None, read: bool | None = True) -> None:
        """A block being fetched lands and is cached (`read`: by a reader waiting
        for it); without `ident`, all of them, unread (a request's fetches are
        done by the time the next one comes: a consumer's next fetch follows
        its last answer)."""
        if ident is None:
            for pending in list(self._writing):
                self._land(pending, read=None)
            return
        if ident not in self._writing:
            return
        landed_read, slot = self._writing.pop(ident)
        read = landed_read if read is None else read or landed_read
        self._slot_of[ident] = slot
        self._ident_at[slot] = ident
        for victim in self.policy.insert(slot, _fingerprint(ident), main=self._main(ident)):
            self._evicted(victim)  # not with a slot per block: kept correct regardless
        if not read:
            self.unread.add(ident)
        if ident in self._reading_ahead:
            self._reading_ahead.discard(ident)
            assert self.planner is not None
            self.planner.finished(ident, cached=True)

    def _block_bytes(self, ident: BlockIdent) -> int:
        _, size = self._objects[(ident.bucket, ident.key)]
        start = ident.block * self.settings.block_size
        return max(0, min(size, start + self.settings.block_size) - start)

    def _length(self, info: ObjectInfo, block: int) -> int:
        start = block * self.settings.block_size
        return max(0, min(info.size, start + self.settings.block_size) - start)

    def _read_ahead(self, stream: Stream, info: ObjectInfo, position: int) -> None:
        assert self.planner is not None
        plan = self.planner.on_delivered(stream, info, position)
        self._fetch_ahead(stream, info, plan.blocks)
        if plan.next_segment is not None:
            self._into_next_segment(plan.next_segment)

    def _fetch_ahead(self, stream: Stream, info: ObjectInfo, blocks: Iterable[int]) -> None:
        assert self.planner is not None
        for block in blocks:
            ident = BlockIdent(info.bucket, info.key, info.etag, block)
            if self._present(ident):
                continue
            if not self.planner.admit(ident, stream):
                return
            if self._reserve(ident, read=False):
                self.origin_prefetch += self._length(info, block)
                self._ahead_unread.add(ident)
                # In flight (against the planner's bound) until it lands.
                self._reading_ahead.add(ident)
            else:
                self.planner.finished(ident, cached=False)

    def _into_next_segment(self, wanted: NextSegment) -> None:
        assert self.planner is not None
        bucket = wanted.after.bucket
        keys = [key for key in self._keys.get(bucket, ())
                if key.startswith(wanted.partition_prefix)]
        next_key = self.planner.next_key(wanted, keys)
        if next_key is None:
            return
        etag, size = self._objects[(bucket, next_key)]
        next_info = ObjectInfo(bucket, next_key, size, etag, _EPOCH)
        self._fetch_ahead(wanted.stream, next_info,
                          self.planner.continue_into(wanted, next_info))


def _fingerprint(ident: BlockIdent) -> int:
    """A 64-bit name of a block for the policy's ghost. The store uses its
    index's identity hash; any stable 64-bit hash remembers the same blocks
    (the executors need no xxhash for it)."""
    name = f"{ident.bucket}\0{ident.key}\0{ident.etag}\0{ident.block}".encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")


def replay(settings: Settings, cache_bytes: int, reads: Iterable[Read],
           sample_rate: float = 1.0) -> Outcome:
    """Replay `reads` (in time order) in a cache of `cache_bytes`."""
    reads = list(reads)
    keys = [(r.bucket, r.key, r.etag, r.object_size) for r in reads]
    simulation = Replay(settings, cache_bytes, sample_rate, keys)
    for read in reads:
        simulation.read(read)
    simulation.finish()
    return simulation.outcome()
