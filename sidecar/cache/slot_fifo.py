"""S3-FIFO eviction (Yang et al., "FIFO queues are all you need for cache
eviction", SOSP'23): the store's eviction policy, over slot numbers, in arrays.

Why not LRU: Kafka consumers catching up from tiered storage read whole
segments once, front to back. Under LRU one such scan larger than the cache
flushes everything, including the blocks that many consumers share (recent
segments, index files). S3-FIFO is scan resistant because a new block first
lands in a *small* FIFO (~10% of the capacity) and only blocks that are hit
again while there are promoted into the *main* FIFO; one-hit wonders leave
from the small FIFO without ever displacing the main one.

    small FIFO   new ids (not seen recently). Evicting from it: an entry that
                 was hit while in small (freq > 0) moves to main, otherwise it
                 leaves the cache and its id goes to the ghost FIFO.
    main FIFO    ids that proved reuse. Each carries a 2-bit hit counter
                 (capped at 3). Evicting from it: freq > 0 -> decrement and
                 reinsert at the head (a "second chance"), else evict.
    ghost FIFO   ids only (no data) of entries recently evicted from small,
                 as many as the main FIFO holds. An id inserted again while in
                 ghost was reused just too late for small: it goes to main.

Capacity counts slots: every entry takes one. Eviction takes from small while
small holds at least its share (or main is empty), otherwise from main.

Pinned entries (being read right now) are never returned as victims: one that
reaches the eviction point is moved to the head of main and skipped.

Entries known to be reused (a segment's manifest and indexes) are admitted
straight to main. The resident entries are named by their slot number, so
that the queues need no object per entry:

    array     bytes a slot  content
    prev      4             previous slot in its FIFO (towards the tail), i32
    next      4             next slot in its FIFO (towards the head), i32
    state     1             bits 0-1 hit counter (0..3), bits 2-3 FIFO
                            (0 none, 1 small, 2 main)

Each FIFO is a doubly linked list threaded through ``prev``/``next`` (-1 ends
it), so moving an entry to the head or removing it is O(1).

The ghost holds ids, not slots: 64-bit fingerprints of the identity hash
(``sidecar.cache.index``). It is two Bloom filters (3 probes, 10 bits an
entry) instead of a FIFO with a hash table: an id goes into the newer
filter; once that one has taken half the ghost's capacity, the older is
cleared and the two swap. An id is in the ghost if either filter has it, so
it is remembered for between half and all of the ghost capacity's later
evictions from small (the FIFO remembers it for exactly that many), for
about 1.1 bytes a slot (10 bits an id) instead of an id and a table entry. A
false positive (below 1%) admits a new block straight to main, which costs
only placement; an id admitted again from the ghost is not taken out of it
(a Bloom filter cannot forget), so it may be readmitted to main once more
within the same window. ``remove`` leaves the ghost alone for the same reason.

Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import Literal

from sidecar.cache.errors import CacheFullError

_MAX_FREQ = 3
_FREQ = 0x03
_SEGMENT = 0x0C
_SMALL = 0x04
_MAIN = 0x08
_NIL = -1
# The largest state byte a slot can hold (main, at the highest frequency): the
# index snapshot checks what it reads against it.
MAX_STATE = _MAIN | _MAX_FREQ
_BLOOM_PROBES = 3
_BLOOM_BITS_PER_ID = 10


def _never_pinned(slot: int) -> bool:
    return False


class _Queue:
    """Head/tail/length of one FIFO threaded through the shared link arrays."""

    __slots__ = ("head", "length", "tail")

    def __init__(self) -> None:
        self.tail = _NIL  # the next to be considered for eviction
        self.head = _NIL  # the most recently queued
        self.length = 0


class _Ghost:
    """Ids recently evicted from small, as two rotating Bloom filters."""

    def __init__(self, capacity: int) -> None:
        self._per_filter = max(1, capacity // 2)
        self._bits = max(1024, self._per_filter * _BLOOM_BITS_PER_ID)
        self._newer = bytearray(-(-self._bits // 8))
        self._older = bytearray(len(self._newer))
        self._taken = 0

    def nbytes(self) -> int:
        return len(self._newer) + len(self._older)

    def _positions(self, fingerprint: int) -> list[int]:
        first, step = fingerprint & 0xFFFFFFFF, (fingerprint >> 32) | 1
        return [(first + i * step) % self._bits for i in range(_BLOOM_PROBES)]

    def add(self, fingerprint: int) -> None:
        if self._taken >= self._per_filter:
            self._older, self._newer = self._newer, self._older
            self._newer[:] = bytes(len(self._newer))
            self._taken = 0
        for bit in self._positions(fingerprint):
            self._newer[bit >> 3] |= 1 << (bit & 7)
        self._taken += 1

    def __contains__(self, fingerprint: int) -> bool:
        positions = self._positions(fingerprint)
        return any(all(bits[b >> 3] >> (b & 7) & 1 for b in positions)
                   for bits in (self._newer, self._older))


class SlotFifo:
    """Which resident slot to free next. ``fingerprint_of`` names the block a
    slot holds (for the ghost); it is asked when a slot leaves from small."""

    def __init__(self, capacity: int, fingerprint_of: Callable[[int], int],
                 small_ratio: float = 0.1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 slot, got {capacity}")
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        self._capacity = capacity
        self._small_target = max(1, int(capacity * small_ratio))
        self._fingerprint_of = fingerprint_of
        self._prev = array("i", [_NIL]) * capacity
        self._next = array("i", [_NIL]) * capacity
        self._state = bytearray(capacity)
        self._small = _Queue()
        self._main = _Queue()
        self._ghost = _Ghost(max(1, capacity - self._small_target))

    @property
    def capacity(self) -> int:
        return self._capacity

    def nbytes(self) -> int:
        return (self._prev.itemsize * len(self._prev) + self._next.itemsize * len(self._next)
                + len(self._state) + self._ghost.nbytes())

    def __contains__(self, slot: int) -> bool:
        return bool(self._state[slot] & _SEGMENT)

    def __len__(self) -> int:
        return self._small.length + self._main.length

    def segment_of(self, slot: int) -> Literal["small", "main"] | None:
        segment = self._state[slot] & _SEGMENT
        return "small" if segment == _SMALL else "main" if segment == _MAIN else None

    def in_ghost(self, fingerprint: int) -> bool:
        return fingerprint in self._ghost

    def touch(self, slot: int) -> None:
        """Record a hit; ignored for slots that are not resident."""
        state = self._state[slot]
        if state & _SEGMENT and state & _FREQ < _MAX_FREQ:
            self._state[slot] = state + 1

    def insert(self, slot: int, fingerprint: int,
               pinned: Callable[[int], bool] = _never_pinned, *,
               main: bool = False) -> list[int]:
        """Admit the block in ``slot`` (named by ``fingerprint``); returns the
        slots evicted (in order) to make room. Raises ``CacheFullError``
        (admitting nothing) if full and every resident slot is pinned."""
        if self._state[slot] & _SEGMENT:
            raise KeyError(f"slot {slot} is already resident")
        victims: list[int] = []
        if len(self) >= self._capacity:
            victim = self._evict_one(pinned)
            if victim is None:
                raise CacheFullError(f"all {len(self)} resident entries are pinned")
            victims.append(victim)
        if main or fingerprint in self._ghost:
            self._push(self._main, _MAIN, slot, 0)
        else:
            self._push(self._small, _SMALL, slot, 0)
        return victims

    def adopt_older(self, slots: Iterable[int],
                    main: Callable[[int], bool] = _never_pinned) -> None:
        """Admit ``slots`` behind every resident entry of their FIFO, each one
        next out: given newest first, the last one given leaves first. For
        blocks a scan finds on disk while the store already caches new ones:
        they are older than anything written since the start."""
        for slot in slots:
            if self._state[slot] & _SEGMENT:
                raise KeyError(f"slot {slot} is already resident")
            if len(self) >= self._capacity:
                raise CacheFullError(f"more slots than the {self._capacity} entries")
            if main(slot):
                self._push_tail(self._main, _MAIN, slot)
            else:
                self._push_tail(self._small, _SMALL, slot)

    def _push_tail(self, queue: _Queue, tag: int, slot: int) -> None:
        self._state[slot] = tag
        self._next[slot] = queue.tail
        self._prev[slot] = _NIL
        if queue.tail == _NIL:
            queue.head = slot
        else:
            self._prev[queue.tail] = slot
        queue.tail = slot
        queue.length += 1

    def adopt(self, slots: Iterable[int], main: Callable[[int], bool] = _never_pinned) -> None:
        """Admit ``slots``, oldest first, into this empty policy (a recovered index)."""
        if len(self):
            raise ValueError("adopt() needs an empty policy")
        for slot in slots:
            if len(self) >= self._capacity:
                raise CacheFullError(f"more slots than the {self._capacity} entries")
            if main(slot):
                self._push(self._main, _MAIN, slot, 0)
            else:
                self._push(self._small, _SMALL, slot, 0)

    def remove(self, slot: int) -> None:
        """Forget ``slot``'s entry (explicit invalidation); no-op if not resident."""
        segment = self._state[slot] & _SEGMENT
        if segment:
            self._unlink(self._small if segment == _SMALL else self._main, slot)

    def replace(self, old: int, new: int) -> None:
        """``new`` takes ``old``'s place in its FIFO, hit count included (a block
        rewritten into another slot keeps its standing)."""
        segment = self._state[old] & _SEGMENT
        if not segment or self._state[new] & _SEGMENT:
            raise KeyError(f"slot {old} is not resident or slot {new} is")
        queue = self._small if segment == _SMALL else self._main
        before, after = self._prev[old], self._next[old]
        self._prev[new], self._next[new] = before, after
        if before == _NIL:
            queue.tail = new
        else:
            self._next[before] = new
        if after == _NIL:
            queue.head = new
        else:
            self._prev[after] = new
        self._state[new] = self._state[old]
        self._state[old] = 0

    def choose_victims(self, count: int, pinned: Callable[[int], bool] = _never_pinned, *,
                       probation_only: bool = False) -> list[int]:
        """Evict up to ``count`` unpinned slots now and return them in order."""
        victims: list[int] = []
        while len(victims) < count:
            victim = self._evict_small(pinned) if probation_only else self._evict_one(pinned)
            if victim is None:
                break
            victims.append(victim)
        return victims

    def queue(self, segment: Literal["small", "main"]) -> list[int]:
        """The slots of one FIFO, tail (next out) first (snapshots, tests)."""
        slots: list[int] = []
        slot = (self._small if segment == "small" else self._main).tail
        while slot != _NIL:
            slots.append(slot)
            slot = self._next[slot]
        return slots

    def frequency(self, slot: int) -> int:
        return self._state[slot] & _FREQ

    def buffers(self) -> list[array[int] | bytearray]:
        """The arrays of the policy, in the index snapshot's order; a snapshot is
        read straight into them (then ``restored``)."""
        return [self._prev, self._next, self._state]

    def queues(self) -> tuple[int, int, int, int, int, int]:
        """(tail, head, length) of small, then of main."""
        return (self._small.tail, self._small.head, self._small.length,
                self._main.tail, self._main.head, self._main.length)

    def restored(self, queues: tuple[int, ...]) -> None:
        """The buffers were filled from a snapshot: take its ``queues`` (the ghost
        starts empty)."""
        if len(queues) != 6:
            raise ValueError("six queue values expected")
        (self._small.tail, self._small.head, self._small.length,
         self._main.tail, self._main.head, self._main.length) = queues

    def _push(self, queue: _Queue, tag: int, slot: int, freq: int) -> None:
        self._state[slot] = tag | freq
        self._prev[slot] = queue.head
        self._next[slot] = _NIL
        if queue.head == _NIL:
            queue.tail = slot
        else:
            self._next[queue.head] = slot
        queue.head = slot
        queue.length += 1

    def _unlink(self, queue: _Queue, slot: int) -> None:
        before, after = self._prev[slot], self._next[slot]
        if before == _NIL:
            queue.tail = after
        else:
            self._next[before] = after
        if after == _NIL:
            queue.head = before
        else:
            self._prev[after] = before
        self._state[slot] = 0
        queue.length -= 1

    def _evict_one(self, pinned: Callable[[int], bool]) -> int | None:
        if self._small.length >= self._small_target or not self._main.length:
            order = (self._evict_small, self._evict_main)
        else:
            order = (self._evict_main, self._evict_small)
        for evict in order:
            victim = evict(pinned)
            if victim is not None:
                return victim
        return None

    def _evict_small(self, pinned: Callable[[int], bool]) -> int | None:
        small = self._small
        while small.length:
            slot = small.tail
            freq = self._state[slot] & _FREQ
            self._unlink(small, slot)
            if freq > 0 or pinned(slot):
                # Reused while on probation (or in use right now): promote,
                # the hit count along with it, as in the paper.
                self._push(self._main, _MAIN, slot, freq)
                continue
            self._ghost.add(self._fingerprint_of(slot))
            return slot
        return None

    def _evict_main(self, pinned: Callable[[int], bool]) -> int | None:
        main = self._main
        skipped = 0
        while skipped < main.length:
            slot = main.tail
            freq = self._state[slot] & _FREQ
            self._unlink(main, slot)
            if pinned(slot):
                self._push(main, _MAIN, slot, freq)
                skipped += 1
                continue
            if freq > 0:
                self._push(main, _MAIN, slot, freq - 1)
                skipped = 0
                continue
            return slot
        return None
