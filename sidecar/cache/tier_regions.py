"""The memory tier's regions as pure bookkeeping: which region holds which
chunk, which are free, being filled or sent from, and which leaves next.

The tier (``sidecar.cache.memory_tier``) is one fixed-size memory file cut
into regions of one chunk each. This table decides; the tier does the I/O it
is told to (fill a region, punch its pages out). A region is in one of five
states:

    free       no pages (never filled, or punched): claimable
    filling    claimed by one writer, which fills it and then publishes it
               (or abandons it); invisible to readers, never a victim
    live       holds a verified chunk under its key; in the eviction policy
    doomed     its chunk was forgotten (object purged) while a send still
               had it pinned: released once the last pin goes
    releasing  its chunk is gone (forgotten, or its last pin let go) and the
               caller is punching its pages out: not claimable until the
               caller says they are (``released``), for a writer filling it
               before the punch would see its chunk punched away after
               publishing it, and would write into pages a socket may hold

Eviction is S3-FIFO over region numbers, the disk's own policy
(``sidecar.cache.slot_fifo``, imported, not reimplemented): a replay read once
leaves from the small FIFO without pushing out the chunks that many readers
share. A read is reuse to it unless it is the chunk's first or its last
reader's again (readers named as for admission, below), as the disk does not
count a read that resumes in the block its stream's last one ended in. A
pinned region (a send from it under way) is never a victim.

Admission: while a region is free, every chunk offered gets one. Once the tier
is full, a chunk takes a victim's place only the second time it is read
within about the tier's size of refusals (or when the policy's ghost remembers
it; a chunk landing from the origin is no offer, its first read follows at
once): filling a region costs fresh pages (the old ones were released, see
below), measurably more than the copy itself, and a replay larger than the
tier would otherwise pay that for every chunk and keep none of them. The
second read must be another reader's (an offer names its reader when the
caller knows it: a read stream's number): one consumer reads most chunks
twice in a row, as each fetch resumes in the chunk where its previous one
ended (Kafka's reader starts again at the first record batch it did not get
whole) or takes a chunk that was read ahead of it, and admitting on that
refilled the tier through a whole replay larger than it, each refill pushing
out a chunk a later reader would have found. The
chunks a replay's next fetch starts in are the recent-chunk memory's job
(``sidecar.cache.recent``), not the tier's.

Warm-up reaches the tier as it reaches the disk: a chunk landing for a warm-up
(``warm``) is admitted even to a full tier, and its region is protected, never
a victim, until the chunk is first read (warmed for the replay that reads it).
Protected regions are at most PROTECTED_SHARE of the tier, as on the disk; past
that, the oldest protection lapses first, so a warm-up nobody read never holds
the tier for the next one. A warm-up of a block already cached protects the
chunks of it the tier holds (``protect``); the store reads the others from
the disk into it.

The one rule that keeps bytes on the wire from changing: a region that held a
chunk is never filled again before its pages were released (the caller
punches a hole over it, ``Claimed.evicted``). Pages a socket still holds keep
their content; the refill lands in fresh pages.

Pure: no I/O, no clock, no lock (the tier holds one around every call).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.cache.ident import BlockIdent
from sidecar.cache.slot_fifo import SlotFifo

Key = tuple[BlockIdent, int, int]  # block, generation (low 32 bits), chunk

FREE, FILLING, LIVE, DOOMED, RELEASING = 0, 1, 2, 3, 4
# The disk's own share for warm-up protection (the store's protected_share).
PROTECTED_SHARE = 0.5
_FINGERPRINT_MASK = (1 << 64) - 1
# A read by a reader not named: any read after it is another's (stream numbers
# start at 1).
_SOMEONE = -1


@dataclass(frozen=True)
class Claimed:
    """A region given to one writer. ``evicted``: the key it held until now
    (its pages must be released before the region is filled), or None."""

    region: int
    evicted: Key | None


@dataclass
class TierCounts:
    """What the table did, for the metrics (counters in the core)."""

    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0
    refused: int = 0  # no region to claim: every one filling, pinned or protected
    declined: int = 0  # full, and the chunk not offered before: not admitted


class RegionTable:
    def __init__(self, regions: int, region_size: int) -> None:
        if regions < 1:
            raise ValueError(f"a memory tier needs at least one region, got {regions}")
        self.regions = regions
        self.region_size = region_size
        self.counts = TierCounts()
        self._state = bytearray(regions)
        self._pins = array("i", [0]) * regions
        # Live regions a send has pinned: with no free region, the table can
        # tell that no victim exists without asking the policy (whose choice
        # evicts), for ``could_claim``.
        self._pinned_live = 0
        self._length = array("q", [0]) * regions
        # Who read the chunk last since it entered (0: no one yet; _SOMEONE: a
        # reader not named): its first read (often the reader it was fetched
        # for) is no sign of reuse to the policy, nor is the same reader's
        # next (a fetch resuming in the chunk its previous one ended in).
        self._read_by = array("q", [0]) * regions
        self._key_of: list[Key | None] = [None] * regions
        self._region_of: dict[Key, int] = {}
        # The keys held of each object (bucket, key): a purge finds its own
        # chunks without looking at every other one.
        self._of_object: dict[tuple[str, str], set[Key]] = {}
        # Lowest numbers last: the first claims take the file's front.
        self._free = list(range(regions - 1, -1, -1))
        # Keys declined lately, oldest first, at most one a region, with the
        # reader of their first offer (None: any reader's next offer admits).
        self._declined: dict[Key, int | None] = {}
        # Regions of warmed chunks not read yet, oldest first: never victims.
        self._protected: dict[int, None] = {}
        self._max_protected = int(regions * PROTECTED_SHARE)
        self._policy = SlotFifo(regions, self._fingerprint_of_region)

    def __contains__(self, key: Key) -> bool:
        return key in self._region_of

    def __len__(self) -> int:
        return len(self._region_of)

    def state(self, region: int) -> int:
        return self._state[region]

    def pins(self, region: int) -> int:
        return self._pins[region]

    @property
    def held_regions(self) -> int:
        """Regions whose pages may hold memory: every one but the free."""
        return self.regions - len(self._free)

    @property
    def protected_regions(self) -> int:
        return len(self._protected)

    @property
    def protectable_regions(self) -> int:
        """Regions a warm-up may still protect before the oldest protection lapses."""
        return self._max_protected - len(self._protected)

    @property
    def protected_bytes(self) -> int:
        """Bytes of the chunks a warm-up put here, kept until first read."""
        return sum(self._length[region] for region in self._protected)

    @property
    def live_bytes(self) -> int:
        return sum(self._length[region] for region in self._region_of.values())

    def claim(self, key: Key, *, read: bool = True, warm: bool = False,
              reader: int | None = None) -> Claimed | None:
        """A region for a writer to fill with ``key``'s chunk: a free one, else
        the policy's victim (not pinned, not protected, not being filled) if
        the chunk is admitted (above). None when there is none, or it is not
        admitted.

        ``read`` False: the chunk was just fetched, not read; a full table
        does not count that as an offer, for the reader it was fetched for is
        about to read it, and that first read is no sign of reuse either.
        ``warm``: it landed for a warm-up, admitted whatever was offered
        before (``publish`` protects it). ``reader``: who read it (None:
        unknown); its own earlier offer does not admit it (above)."""
        if self._free:
            region = self._free.pop()
            self._state[region] = FILLING
            return Claimed(region, None)
        if not warm and not self._admissible(key, reader):
            self._decline(key, read, reader)
            return None
        self._declined.pop(key, None)  # admitted: this offer is used up
        victims = self._policy.choose_victims(1, self._kept)
        if not victims:
            self._refuse(key)
            return None
        region = victims[0]
        evicted = self._key_of[region]
        if evicted is not None:
            del self._region_of[evicted]
            self._unlist(evicted)
        self._key_of[region] = None
        self._length[region] = 0
        self._state[region] = FILLING
        self.counts.evictions += 1
        return Claimed(region, evicted)

    def could_claim(self, key: Key, *, read: bool = True, reader: int | None = None) -> bool:
        """Whether ``claim`` may give ``key`` a region now, from the table
        alone (a caller skips the copy's trip to a thread when it cannot).
        False: it would be declined or refused, and the offer is counted and
        remembered here just as ``claim`` would, so the caller need not make
        it. True: nothing is changed; ``claim`` decides (and may still refuse
        if the table changed meanwhile)."""
        if self._free:
            return True
        if not self._admissible(key, reader):
            self._decline(key, read, reader)
            return False
        if len(self._region_of) == self._pinned_live:
            # Every live region pinned (and filling ones are never victims):
            # the policy would find no victim.
            self._refuse(key)
            return False
        return True

    def publish(self, region: int, key: Key, length: int, *, warm: bool = False) -> bool:
        """The filled region holds ``key``'s chunk (``length`` bytes) from now on,
        protected until its first read when ``warm``. False (the region stays
        the writer's, to abandon) when the key is already held: another writer
        published the same chunk first."""
        self._expect(region, FILLING)
        if not 0 < length <= self.region_size:
            raise ValueError(f"a chunk of {length} bytes in a region of {self.region_size}")
        if key in self._region_of:
            return False
        self._state[region] = LIVE
        self._key_of[region] = key
        self._length[region] = length
        self._region_of[key] = region
        self._of_object.setdefault((key[0].bucket, key[0].key), set()).add(key)
        self._read_by[region] = 0
        self._policy.insert(region, self._fingerprint(key))
        self.counts.inserts += 1
        if warm:
            self._protect(region)
        return True

    def protect(self, key: Key) -> bool:
        """Keep the live chunk held under ``key`` until its first read from now
        on, as a chunk landing for a warm-up is (``publish``): a warm-up of a
        block the tier holds already. False when it holds no such chunk, or
        the tier protects nothing."""
        region = self._region_of.get(key)
        if region is None or self._state[region] != LIVE:
            return False
        return self._protect(region)

    def _protect(self, region: int) -> bool:
        if not self._max_protected:
            return False
        self._protected.pop(region, None)  # protected again: the newest
        while len(self._protected) >= self._max_protected:
            del self._protected[next(iter(self._protected))]  # the oldest lapses
        self._protected[region] = None
        return True

    def abandon(self, region: int) -> None:
        """A claimed region given back unfilled, or filled but not published
        (its pages released by the caller first)."""
        self._expect(region, FILLING)
        self._state[region] = FREE
        self._free.append(region)

    def find(self, key: Key, reader: int | None = None) -> tuple[int, int] | None:
        """The live region holding ``key`` and the chunk's length, pinned (a
        send from it is about to start), or None. Counts a hit or a miss.
        ``reader``: who reads (None: unknown); a read is reuse to the policy
        unless it is the chunk's first, or its last reader's again."""
        region = self._region_of.get(key)
        if region is None:
            self.counts.misses += 1
            return None
        if not self._pins[region]:
            self._pinned_live += 1
        self._pins[region] += 1
        last = self._read_by[region]
        if last and (reader is None or last != reader):
            self._policy.touch(region)
        self._read_by[region] = _SOMEONE if reader is None else reader
        self._protected.pop(region, None)  # warmed until read: it is read
        self.counts.hits += 1
        return region, self._length[region]

    def unpin(self, region: int) -> bool:
        """A send from the region is over. True when that was the last pin of a
        doomed region: it is releasing, the caller punches its pages out and
        then calls ``released``."""
        if self._pins[region] <= 0:
            raise ValueError(f"region {region} is not pinned")
        self._pins[region] -= 1
        if self._pins[region]:
            return False
        if self._state[region] == DOOMED:
            self._state[region] = RELEASING
            return True
        self._pinned_live -= 1
        return False

    def forget(self, matches: Callable[[Key], bool]) -> list[int]:
        """Drop every chunk whose key ``matches``; the regions releasing now,
        whose pages the caller punches out before calling ``released``.
        Pinned ones follow when their sends end (``unpin``)."""
        return self._forget([key for key in self._region_of if matches(key)])

    def forget_object(self, bucket: str, key: str) -> list[int]:
        """``forget`` of every chunk of one object (any version), found
        through the object's own keys."""
        return self._forget(list(self._of_object.get((bucket, key), ())))

    def withhold(self, region: int) -> None:
        """A claimed region whose old pages could not be punched out: out of
        use for good (releasing, never released), a region less rather than
        a fill into pages a socket may hold."""
        self._expect(region, FILLING)
        self._state[region] = RELEASING

    def released(self, region: int) -> None:
        """The releasing region's pages are out: claimable again."""
        self._expect(region, RELEASING)
        self._state[region] = FREE
        self._free.append(region)

    def _forget(self, keys: list[Key]) -> list[int]:
        releasing: list[int] = []
        for key in keys:
            region = self._region_of.pop(key)
            self._unlist(key)
            self._policy.remove(region)
            self._protected.pop(region, None)
            self._key_of[region] = None
            self._length[region] = 0
            if self._pins[region]:
                self._pinned_live -= 1  # pinned still, but no longer live
                self._state[region] = DOOMED
            else:
                self._state[region] = RELEASING
                releasing.append(region)
        return releasing

    def _unlist(self, key: Key) -> None:
        name = (key[0].bucket, key[0].key)
        held = self._of_object[name]
        held.discard(key)
        if not held:
            del self._of_object[name]

    def _admissible(self, key: Key, reader: int | None) -> bool:
        """Whether a chunk offered to a full tier may take a victim's place:
        the second offer within about the tier's size of refusals (not its
        first reader's again), or one the policy's ghost remembers (it left
        the small FIFO lately). Changes nothing."""
        if key in self._declined:
            first = self._declined[key]
            if first is None or reader is None or first != reader:
                return True
        return self._policy.in_ghost(self._fingerprint(key))

    def _decline(self, key: Key, read: bool, reader: int | None) -> None:
        """A chunk not admitted. ``read`` False: a refusal that does not count
        as an offer."""
        if read:
            # Declined again only when this reader offered it first (else it
            # would have been admitted): the first reader stays on record.
            self._remember(key, reader)
        self.counts.declined += 1

    def _refuse(self, key: Key) -> None:
        """A chunk admitted while no region is free of sends."""
        self._remember(key, None)  # still admitted at its next offer, anyone's
        self.counts.refused += 1

    def _remember(self, key: Key, reader: int | None) -> None:
        """``key`` as the newest declined one, the oldest forgotten past one a
        region. Trimmed to the bound at every entry, whatever way it came in: a
        chunk the ghost admitted while every region was pinned enters here too,
        and one trim a decline would leave every such excess in memory for good."""
        self._declined.pop(key, None)
        self._declined[key] = reader
        while len(self._declined) > self.regions:
            del self._declined[next(iter(self._declined))]

    def _kept(self, region: int) -> bool:
        """Not a victim now: a send has it pinned, or a warm-up protects it."""
        return self._pins[region] > 0 or region in self._protected

    def _fingerprint_of_region(self, region: int) -> int:
        key = self._key_of[region]
        return 0 if key is None else self._fingerprint(key)

    @staticmethod
    def _fingerprint(key: Key) -> int:
        # The ghost lives in memory only: the process's own hash names a key.
        return hash(key) & _FINGERPRINT_MASK

    def _expect(self, region: int, state: int) -> None:
        if self._state[region] != state:
            raise ValueError(f"region {region} is in state {self._state[region]}, "
                             f"not {state}")
