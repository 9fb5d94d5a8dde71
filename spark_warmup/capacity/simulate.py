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
  not a reuse, and does not count for eviction (BlockStore.lookup); nor does
  the rest of the block a stream's previous read ended in, read by its next
  (the engine's lookup without a touch);
- a miss of a bounded range fetches the missing blocks from there on, up to
  max_coalesce blocks, in one run; an open-ended one a block at a time;
- manifests and indexes of the Aiven layout skip probation (admit_to_main);
- the slab holds capacity // (block_size + slot header) blocks.

- reads happen in time as the log places them: from arrival (`time` less
  `duration_s`), their blocks reached over their duration, shared out by what
  each kind of block costs in the same log (spark_warmup.capacity.pacing; the
  block a stream's previous read ended in gone through at once), and
  interleaved with the other reads in progress; a block on its way when its reader comes is
  joined (a hit, no origin read of the reader's own), and its reader pins it;
- read-ahead lands when its fetch completes (as long after it starts as the
  log's FETCH lines started about then took: spark_warmup.capacity.landing;
  scaled by how many blocks are on their way against the mean of the fetches
  started about then, and that mean against the replay at the log's own
  size's then: `origin_load`) and counts against the planner's bounds until then; one that finds no
  victim in probation while writes are on their way waits for its slot, on
  its way meanwhile (BlockStore.begin_write); one that lands before its
  reader comes is no victim for a fetch's time after (the sidecar's readers,
  paced by the read-ahead they wait for, have joined it by then);
- a warm-up's fetch lands when the logged one ended and is protected until
  read, within the store's protected share.

What is counted: bytes delivered, those found resident, the bytes fetched
from the origin per lane (foreground, prefetch, warm), and the read-ahead
evicted before anyone read it.

Sampling (SHARDS, Waldspurger et al., FAST '15): a trace sampled spatially at
rate R (whole partitions kept when hash < R) behaves like the whole trace in a
cache R times smaller, so the caller replays it at capacity * R.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from sidecar.cache.ident import BlockIdent
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.layout import Layout, is_small_object
from sidecar.model import ObjectInfo
from sidecar.prefetch.planner import NextSegment, ReadAheadPlanner
from sidecar.prefetch.streams import Stream, StreamTable
from spark_warmup.capacity.holdings import Catalogue, Held
from spark_warmup.capacity.landing import FetchTimes, LoadTally, OriginLoad
from spark_warmup.capacity.pacing import EVEN, BlockCosts

# Bytes of each slot's header in the slab (sidecar/cache/slot_format.py SLOT_HEADER_SIZE,
# asserted equal by the tests): not imported here, the format needs xxhash, which
# the executors lack.
SLOT_HEADER_SIZE = 4096
# The engine's piece size: read heads advance, and read-ahead is planned, per piece.
PIECE_SIZE = 1024 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# How far back a replay keeps its own load by moment: longer than any wait
# for a slot (a read-ahead granted one is timed from when it asked), the only
# earlier moment it asks about.
RUNNING_LOAD_KEEP_S = 60.0


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
    duration_s: float = 0.0  # from arrival to last byte (the log's `time` is the end)
    # A warm-up's fetch of these bytes (the log's FETCH line on the warm lane),
    # not a reader's: cached and kept from eviction until read.
    warm: bool = False
    # How the log found each block from the first (trace.Request.found): where
    # the read's time went. Empty: not known.
    found: str = ""

    @property
    def arrival_s(self) -> float:
        return self.time_s - self.duration_s


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
    # Of the slots, warmed blocks may hold at most this many, protected
    # (BlockStore's protected_share; not imported: the store does I/O).
    protected_share: float = 0.5
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
    origin_warm: int = 0

    @property
    def origin_bytes(self) -> int:
        return self.origin_foreground + self.origin_prefetch + self.origin_warm

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
                 keys: Iterable[tuple[str, str, str, int]] = (),
                 fetch_s: float | FetchTimes = 0.0, load: OriginLoad | None = None,
                 tally: LoadTally | None = None, costs: BlockCosts = EVEN) -> None:
        self.settings = settings
        # How a read's time is shared out over its blocks (spark_warmup.capacity.pacing).
        self.costs = costs
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
        self._writing: dict[BlockIdent, tuple[bool, int | None]] = {}
        # Of those, read-ahead without a slot yet, and when each asked for one.
        self._slotless: deque[tuple[BlockIdent, float]] = deque()
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
        self.catalogue = Catalogue(settings.block_size, keys)
        self.served = self.hit_bytes = self.blocks = self.hit_blocks = 0
        self.origin_foreground = self.origin_prefetch = 0
        self.prefetch_wasted = 0
        self._ahead_unread: set[BlockIdent] = set()  # read ahead, cached, not yet read
        # Read-ahead lands when its fetch completes, as long after it starts as
        # the log's fetches took then (a number: always that long):
        # (when, order, block), earliest first.
        self.fetch_times = fetch_s if isinstance(fetch_s, FetchTimes) else FetchTimes(fetch_s)
        # ... scaled by the origin's load against the log's own (`load`); the
        # load counted as it goes (`tally`: at the log's own size, what makes
        # `load`).
        self._load = load
        self._tally = tally if tally is not None else LoadTally(
            self.fetch_times.bin_s, keep_s=RUNNING_LOAD_KEEP_S)
        self._due: list[tuple[float, int, BlockIdent]] = []
        self._issued = 0
        self._pinned = Held(int(self.slots * settings.protected_share), lambda: self.now)
        self._warming: set[BlockIdent] = set()  # warm fetches on their way
        self.origin_warm = 0

    def finish(self) -> None:
        self._land()

    def outcome(self) -> Outcome:
        return Outcome(self.cache_bytes, self.slots, self.served, self.hit_bytes, self.blocks,
                       self.hit_blocks, self.origin_foreground, self.origin_prefetch,
                       self.prefetch_wasted, self.origin_warm)

    def run(self, reads: Iterable[Read]) -> None:
        """Every read, its blocks interleaved with those of the reads in progress at
        the same time, as the log's arrivals and durations place them."""
        ordered = sorted(reads, key=lambda r: (r.arrival_s, r.time_s))
        waiting: list[tuple[float, int, Iterator[float]]] = []
        arrivals = iter(enumerate(ordered))
        upcoming = next(arrivals, None)
        while waiting or upcoming is not None:
            if upcoming is not None and (not waiting or upcoming[1].arrival_s <= waiting[0][0]):
                number, read = upcoming
                upcoming = next(arrivals, None)
                self.advance(read.arrival_s)
                steps = self.steps(read)
            else:
                when, number, steps = heapq.heappop(waiting)
                self.advance(when)
            following = next(steps, None)
            if following is not None:
                heapq.heappush(waiting, (following, number, steps))
        self.finish()

    def read(self, read: Read) -> None:
        """One read alone, from its arrival to its end."""
        self.advance(read.arrival_s)
        for when in self.steps(read):
            self.advance(when)

    def advance(self, now: float) -> None:
        """The clock moves on to `now`: read-ahead fetches due by then land."""
        self.now = max(self.now, now)
        while self._due and self._due[0][0] <= self.now:
            _, _, ident = heapq.heappop(self._due)
            self._land(ident, read=None)

    def steps(self, read: Read) -> Iterator[float]:
        """Serve `read` block by block; before each block, the time it is reached
        (the read's duration shared out over its blocks by what each kind
        costs, the block its stream resumes taking none), for the caller to
        interleave with other reads."""
        block_size = self.settings.block_size
        piece = min(PIECE_SIZE, block_size)
        info = ObjectInfo(read.bucket, read.key, read.object_size, read.etag, _EPOCH)
        self.catalogue.know(read.bucket, read.key, read.etag, read.object_size)
        if read.warm:
            self._warm(read)
            return
        stream = self.planner.on_request(info, read.first_byte) if self.planner else None
        if stream is not None:
            self._read_ahead(stream, info, read.first_byte)
        end = read.first_byte + read.bytes  # exclusive
        first_block, last_block = read.first_byte // block_size, (end - 1) // block_size
        position = read.first_byte
        started: set[int] = set()  # blocks this request's own fetches brought
        pinned: int | None = None  # the slot being read: not evicted under it
        # The read's duration shared out over its blocks by what each kind
        # costs, but for the block its stream's previous read ended in: its
        # bytes were on their way or in hand already, and the sidecar goes on
        # to the next block at once.
        resumed_first = stream is not None and stream.resumed_block == first_block \
            and last_block > first_block
        weights = self.costs.weights(read.found, last_block - first_block + 1, resumed_first)
        through = [0.0]
        for weight in weights:
            through.append(through[-1] + weight)

        def reached(done: int) -> float:
            """When the read is through its first `done` blocks."""
            return read.arrival_s + read.duration_s * through[done] / through[-1]

        try:
            for block in range(first_block, last_block + 1):
                yield reached(block - first_block)
                ident = BlockIdent(read.bucket, read.key, read.etag, block)
                self._unpin(pinned)
                block_start = block * block_size
                block_end = min(read.object_size, block_start + block_size)
                upto = min(end, block_end)
                on_its_way = self._serve_block(
                    info, ident, upto - max(read.first_byte, block_start), started,
                    last_block if not read.lazy else block,
                    resumed=stream is not None and stream.resumed_block == block,
                    rest_after=upto < block_end)
                # A reader of a block on its way pins its slot until done with it
                # (the engine's _attach); a cached block's reads pin it only
                # while each chunk is read, too briefly to count here.
                pinned = self._pin(ident) if on_its_way else None
                # Its bytes are out by the block's share of the read's duration;
                # read-ahead follows what was delivered.
                yield reached(block - first_block + 1)
                while position < upto:
                    position = min(upto, (position // piece + 1) * piece)
                    if stream is not None:
                        self._read_ahead(stream, info, position)
        finally:
            self._unpin(pinned)
            for number in started:  # fetched for this read, never reached (it ended)
                self._land(BlockIdent(read.bucket, read.key, read.etag, number), read=None)

    def _serve_block(self, info: ObjectInfo, ident: BlockIdent, delivered: int,
                     started: set[int], last_wanted: int, resumed: bool = False,
                     rest_after: bool = False) -> bool:
        """One block of a read: found cached, joined on its way, or fetched;
        whether it was on its way (joined or fetched) when the reader came.
        `resumed`: the block its stream's previous read ended in, not a reuse
        (the engine's lookup without a touch). `rest_after`: the read ends
        inside the block, whose rest is still on its way when the read is done."""
        self.blocks += 1
        self.served += delivered
        self._ahead_unread.discard(ident)
        on_its_way = ident.block in started or ident in self._writing
        if ident.block in started:
            self._land_read(ident, started, rest_after)  # the reader waits for it
        elif ident in self._writing:  # joined a fetch on its way
            self.hit_blocks += 1
            self.hit_bytes += delivered
            if ident in self._reading_ahead:
                # Read as it lands, which is when its fetch completes: until
                # then it counts against the read-ahead bounds.
                self._writing[ident] = (True, self._writing[ident][1])
            else:
                self._land(ident)
        elif ident in self._slot_of:
            self.hit_blocks += 1
            self.hit_bytes += delivered
            self._pinned.release(self._slot_of[ident])  # warmed "until read": it was
            if ident in self.unread:
                self.unread.discard(ident)
            elif not resumed:
                self.policy.touch(self._slot_of[ident])
        else:
            started.update(self._fetch_foreground(info, ident.block, last_wanted))
            self._land_read(ident, started, rest_after)
            on_its_way = True
        if self.planner is not None:
            self.planner.on_block_read(ident)
        return on_its_way

    def _land_read(self, ident: BlockIdent, started: set[int], rest_after: bool) -> None:
        """A block this read's own fetch brings, read as it lands. One the read
        ends inside of lands when the rest of its bytes have come, a fetch's
        time on (the engine streams each chunk to the reader as it lands, and the
        answer ends before the block does): the stream's next read, which
        starts in it, joins it then, and meanwhile it is being written, not a
        victim. Landing it at once let other fetches evict it before that next
        read (16 streams in a cache of 29 blocks)."""
        slot = self._writing.get(ident, (False, None))[1]
        landing = self._fetch_s(self.now)
        if not rest_after or slot is None or landing <= 0:
            self._land(ident)
            return
        self._writing[ident] = (True, slot)
        started.discard(ident.block)  # not landed with the read's unreached ones
        self._issued += 1
        heapq.heappush(self._due, (self.now + landing, self._issued, ident))

    def _pin(self, ident: BlockIdent) -> int | None:
        """A reader on the block: its slot (the one it is written into, if it is
        on its way) is no victim until the reader lets go, its landing
        included (the engine's _attach pins the write; S3-FIFO moves a pinned
        entry on from probation to main, as the store's policy does). The
        slot pinned, if any."""
        slot = self._held_slot(ident)
        if slot is not None:
            self._pinned.pin(slot)
        return slot

    def _unpin(self, slot: int | None) -> None:
        if slot is not None:
            self._pinned.unpin(slot)

    def _held_slot(self, ident: BlockIdent) -> int | None:
        """The slot a block is in, or is being written into (None: it waits for one)."""
        slot = self._slot_of.get(ident)
        return slot if slot is not None else self._writing.get(ident, (False, None))[1]

    def _warm(self, read: Read) -> None:
        """A warm-up's fetch (POST /api/v1/warm, sidecar.engine.warm_up): each
        block not cached or on its way is fetched on the warm lane, landing when
        the logged fetch ended; cached ones are protected from then on."""
        block_size = self.settings.block_size
        last = (read.first_byte + read.bytes - 1) // block_size
        for block in range(read.first_byte // block_size, last + 1):
            ident = BlockIdent(read.bucket, read.key, read.etag, block)
            slot = self._slot_of.get(ident)
            if slot is not None:
                self._pinned.protect(slot)
            elif ident not in self._writing and self._reserve(ident, read=False):
                self.origin_warm += self.catalogue.length(ident)
                self._warming.add(ident)
                self._issued += 1
                heapq.heappush(self._due, (read.time_s, self._issued, ident))

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
            ident = BlockIdent(info.bucket, info.key, info.etag, number)
            self.origin_foreground += self.catalogue.length(ident)
            self._reserve(ident, read=number == block, may_wait=number == block)
        return range(block, run_end)

    def _main(self, ident: BlockIdent) -> bool:
        return self.settings.layout is Layout.AIVEN and \
            is_small_object(ident.key, self.settings.layout_prefix)

    def _reserve(self, ident: BlockIdent, read: bool, may_wait: bool = True,
                 ahead: bool = False) -> bool:
        """A slot for a block about to be fetched, as BlockStore.begin_write takes
        one: a free slot, else a victim chosen now. While other writes are on
        their way into probation, a fetch's first block takes its victim from
        the small FIFO only, and when it has none waits for the next of them to
        land (the rest of a run may not wait, and take any victim). A read-ahead
        fetch that must wait is on its way all the same (the engine's in-flight
        table has it, readers join it): it gets its slot when one is free for
        it, and lands a fetch's time after it asked. False: no slot (uncached)."""
        while not self._free:
            joining = may_wait and self._joining_probation()
            victims = self.policy.choose_victims(1, self._pinned, probation_only=joining)
            if victims:
                self._evicted(victims[0])
                break
            if ahead and joining:
                self._writing[ident] = (read, None)
                self._slotless.append((ident, self.now))
                return True
            if not joining:
                return False
            # A reader's fetch waits for the next write to land; by then its
            # readers (that fetch's and others') have read or pinned it, and
            # the wait ends in a victim that is not read-ahead left unread.
            victims = self.policy.choose_victims(1, self._pinned)
            if not victims:
                return False
            self._evicted(victims[0])
            break
        self._writing[ident] = (read, self._free.pop())
        return True

    def _joining_probation(self) -> bool:
        return any(slot is not None and not self._main(other)
                   for other, (_, slot) in self._writing.items())

    def _grant(self) -> None:
        """Read-ahead waiting for a slot gets one, in the order it asked, as
        victims in probation come free (BlockStore.begin_write's wait). It
        lands a fetch's time after it asked, or at once if its wait took
        longer: the log's FETCH durations run from the fetch's start, its
        slot's wait included (Fetches.fetch_run), so adding a fetch's time
        after the wait would count the wait twice."""
        while self._slotless:
            ident, asked = self._slotless[0]
            if ident not in self._writing:
                self._slotless.popleft()
                continue
            if not self._free:
                victims = self.policy.choose_victims(1, self._pinned, probation_only=True)
                if not victims:
                    return
                self._evicted(victims[0])
            self._slotless.popleft()
            read, _ = self._writing[ident]
            self._writing[ident] = (read, self._free.pop())
            self._issued += 1
            landing = asked + self._fetch_s(asked)
            heapq.heappush(self._due, (max(self.now, landing), self._issued, ident))

    def _fetch_s(self, when_s: float) -> float:
        """How long a fetch started at `when_s` takes: the log's fetches' then,
        scaled by the blocks on their way here against this moment's mean so
        far, and that mean against the log's own size's (OriginLoad.scaled)."""
        duration = self.fetch_times.at(when_s)
        on_their_way = len(self._writing)
        bin_mean = self._tally.add(when_s, on_their_way)
        if self._load is not None:
            return self._load.scaled(duration, when_s, on_their_way, bin_mean)
        return duration

    def _next_landing(self) -> BlockIdent:
        """The write that lands first: the read-ahead due soonest, else the
        oldest foreground write."""
        while self._due and self._writing.get(self._due[0][2], (False, None))[1] is None:
            heapq.heappop(self._due)
        if self._due:
            return self._due[0][2]
        return next(ident for ident, (_, slot) in self._writing.items() if slot is not None)

    def _evicted(self, slot: int) -> None:
        victim = self._ident_at.pop(slot)
        del self._slot_of[victim]
        self._free.append(slot)
        self._pinned.release(slot)
        self.unread.discard(victim)
        if victim in self._ahead_unread:
            self._ahead_unread.discard(victim)
            self.prefetch_wasted += self.catalogue.length(victim)
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
        landed_read, slot = self._writing[ident]
        if slot is None:
            # Still waiting for a slot when its reader needs it: the reader waits
            # with it, for a victim anywhere if probation has none.
            slot = self._any_slot()
            if slot is None:  # every slot pinned: read uncached
                del self._writing[ident]
                self._finished_ahead(ident, cached=False)
                return
        del self._writing[ident]
        read = landed_read if read is None else read or landed_read
        self._slot_of[ident] = slot
        self._ident_at[slot] = ident
        for victim in self.policy.insert(slot, _fingerprint(ident), self._pinned,
                                         main=self._main(ident)):
            self._evicted(victim)  # not with a slot per block: kept correct regardless
        if not read:
            self.unread.add(ident)
            if ident in self._reading_ahead:
                # The sidecar's readers are paced by the read-ahead they wait
                # for, so it lands as its reader comes for it, or after: the
                # reader has joined it and pins it. The log's readers keep the
                # log's pace whatever the replay's read-ahead does; one that
                # lands before its reader is held for it for a fetch's time,
                # not taken at once by the next write that wants a victim.
                self._pinned.await_reader(slot, self.now + self._fetch_s(self.now))
        if ident in self._warming:
            self._warming.discard(ident)
            if not read:
                self._pinned.protect(slot)
        self._finished_ahead(ident, cached=True)
        self._grant()

    def _finished_ahead(self, ident: BlockIdent, cached: bool) -> None:
        if ident in self._reading_ahead:
            self._reading_ahead.discard(ident)
            assert self.planner is not None
            self.planner.finished(ident, cached=cached)

    def _any_slot(self) -> int | None:
        if not self._free:
            victims = self.policy.choose_victims(1, self._pinned)
            if not victims:
                return None
            self._evicted(victims[0])
        return self._free.pop()

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
            if self._reserve(ident, read=False, ahead=True):
                self.origin_prefetch += self.catalogue.length(ident)
                self._ahead_unread.add(ident)
                # In flight (against the planner's bound) until it lands.
                self._reading_ahead.add(ident)
                if self._writing[ident][1] is not None:
                    self._issued += 1
                    heapq.heappush(self._due, (self.now + self._fetch_s(self.now),
                                               self._issued, ident))
            else:
                # No slot yet: asked again at the stream's next delivery, as a
                # bound's refusal is (ReadAheadPlanner.admit).
                self.planner.finished(ident, cached=False)
                if ident.key == stream.object_id[1]:
                    stream.ahead_to = min(stream.ahead_to, ident.block)
                return

    def _into_next_segment(self, wanted: NextSegment) -> None:
        assert self.planner is not None
        bucket = wanted.after.bucket
        next_key = self.planner.next_key(
            wanted, self.catalogue.under(bucket, wanted.partition_prefix))
        if next_key is None:
            return
        next_info = self.catalogue.info(bucket, next_key)
        self._fetch_ahead(wanted.stream, next_info,
                          self.planner.continue_into(wanted, next_info))


def _fingerprint(ident: BlockIdent) -> int:
    """A 64-bit name of a block for the policy's ghost. The store uses its
    index's identity hash; any stable 64-bit hash remembers the same blocks
    (the executors need no xxhash for it)."""
    name = f"{ident.bucket}\0{ident.key}\0{ident.etag}\0{ident.block}".encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")


def replay(settings: Settings, cache_bytes: int, reads: Iterable[Read],
           sample_rate: float = 1.0, fetch_s: float | FetchTimes = 0.0,
           load: OriginLoad | None = None, costs: BlockCosts = EVEN) -> Outcome:
    """Replay `reads` in a cache of `cache_bytes`, read-ahead landing `fetch_s`
    after it starts (seconds, or as the log's fetches took at each moment),
    scaled by the origin's `load` against the log's own (`origin_load`), each
    read's time shared out over its blocks by `costs`."""
    return _run(settings, cache_bytes, reads, sample_rate, fetch_s, load=load,
                costs=costs).outcome()


def origin_load(settings: Settings, own_cache_bytes: int, reads: Iterable[Read],
                sample_rate: float = 1.0, fetch_s: FetchTimes | None = None,
                costs: BlockCosts = EVEN) -> OriginLoad:
    """The blocks on their way at each fetch's start, replaying `reads` at the
    cache size the log was written at: what the log's fetch times went with."""
    times = fetch_s or FetchTimes()
    tally = LoadTally(times.bin_s)
    _run(settings, own_cache_bytes, reads, sample_rate, times, tally=tally, costs=costs)
    return tally.load()


def _run(settings: Settings, cache_bytes: int, reads: Iterable[Read], sample_rate: float,
         fetch_s: float | FetchTimes, *, load: OriginLoad | None = None,
         tally: LoadTally | None = None, costs: BlockCosts = EVEN) -> Replay:
    reads = list(reads)
    keys = [(r.bucket, r.key, r.etag, r.object_size) for r in reads]
    simulation = Replay(settings, cache_bytes, sample_rate, keys, fetch_s, load, tally, costs)
    simulation.run(reads)
    return simulation
