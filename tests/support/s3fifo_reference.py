"""S3-FIFO eviction (Yang et al., SOSP'23) over any hashable keys: pure
bookkeeping, no I/O. The algorithm and the why of each rule are in
``sidecar.cache.slot_fifo``'s docstring.

This is the reference model of the algorithm, over any hashable keys, kept
plain for reading: the store runs it over slot numbers, in arrays
(``sidecar.cache.slot_fifo``), and the tests check that one against this one
(tests/unit/test_slot_index.py) and this one against S3-FIFO's properties
(tests/unit/test_eviction.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, Literal, TypeVar

from sidecar.cache.errors import CacheFullError

K = TypeVar("K", bound=Hashable)

_MAX_FREQ = 3  # a 2-bit counter: more hits than 3 carry no extra information


def _never_pinned(key: object) -> bool:
    return False


class EvictionPolicy(Generic[K]):
    """Which resident key to drop next. Keys must not be ``None``.

    The FIFOs are ``OrderedDict``s: the first item is the tail (next to be
    considered for eviction), the last item is the head (most recently queued).
    """

    def __init__(self, capacity: int, small_ratio: float = 0.1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 slot, got {capacity}")
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        self._capacity = capacity
        self._small_target = max(1, int(capacity * small_ratio))
        # The paper sizes the ghost like main: it then remembers ids for about
        # as long as main would have kept them.
        self._ghost_capacity = max(1, capacity - self._small_target)
        self._small: OrderedDict[K, None] = OrderedDict()
        self._main: OrderedDict[K, None] = OrderedDict()
        self._ghost: OrderedDict[K, None] = OrderedDict()
        self._freq: dict[K, int] = {}  # resident keys (small and main) -> hits

    @property
    def capacity(self) -> int:
        return self._capacity

    def __contains__(self, key: K) -> bool:
        return key in self._freq

    def __len__(self) -> int:
        return len(self._freq)

    def segment_of(self, key: K) -> Literal["small", "main", "ghost"] | None:
        """Where ``key`` is tracked (for tests and debugging)."""
        if key in self._small:
            return "small"
        if key in self._main:
            return "main"
        if key in self._ghost:
            return "ghost"
        return None

    def touch(self, key: K) -> None:
        """Record a hit; ignored for keys that are not resident."""
        freq = self._freq.get(key)
        if freq is not None and freq < _MAX_FREQ:
            self._freq[key] = freq + 1

    def insert(
        self, key: K, pinned: Callable[[K], bool] = _never_pinned, *, main: bool = False
    ) -> list[K]:
        """Admit ``key``; returns the keys evicted (in order) to make room.

        ``main`` admits it straight into the main FIFO, skipping probation: for
        entries known to be reused (a segment's manifest and indexes, read
        whole and often), which a scan must not push out of the small FIFO.

        Raises ``CacheFullError`` (admitting nothing) if the policy is full and
        every resident key is pinned.
        """
        if key in self._freq:
            raise KeyError(f"{key!r} is already resident")
        victims: list[K] = []
        if len(self._freq) >= self._capacity:
            victim = self._evict_one(pinned)
            if victim is None:
                raise CacheFullError(f"all {len(self._freq)} resident entries are pinned")
            victims.append(victim)
        if key in self._ghost or main:
            self._ghost.pop(key, None)
            self._main[key] = None
        else:
            self._small[key] = None
        self._freq[key] = 0
        return victims

    def adopt(self, keys: Iterable[K], main: Callable[[K], bool] = _never_pinned) -> None:
        """Admit ``keys``, oldest first, into this empty policy (a recovered index).

        They queue in the small FIFO as new entries would: a block hit again
        after the restart is promoted, the others leave in their old order.
        Keys for which ``main`` is true go to the main FIFO, as ``insert(main=True)``
        put them before the restart.
        """
        if self._freq:
            raise ValueError("adopt() needs an empty policy")
        small: OrderedDict[K, None] = OrderedDict()
        protected: OrderedDict[K, None] = OrderedDict()
        for key in keys:
            (protected if main(key) else small)[key] = None
        if len(small) + len(protected) > self._capacity:
            raise CacheFullError(
                f"{len(small) + len(protected)} keys do not fit {self._capacity} entries")
        self._small = small
        self._main = protected
        self._freq = dict.fromkeys(small, 0) | dict.fromkeys(protected, 0)

    def remove(self, key: K) -> None:
        """Forget ``key`` entirely (explicit invalidation); no-op if unknown."""
        self._small.pop(key, None)
        self._main.pop(key, None)
        self._ghost.pop(key, None)
        self._freq.pop(key, None)

    def choose_victims(
        self, count: int, pinned: Callable[[K], bool] = _never_pinned, *,
        probation_only: bool = False,
    ) -> list[K]:
        """Evict up to ``count`` unpinned keys now and return them in order.

        Fewer are returned when fewer unpinned keys are resident.
        ``probation_only``: take victims from the small FIFO only (none when it
        has none), for a caller that expects one there shortly.
        """
        victims: list[K] = []
        while len(victims) < count:
            victim = self._evict_small(pinned) if probation_only else self._evict_one(pinned)
            if victim is None:
                break
            victims.append(victim)
        return victims

    def _evict_one(self, pinned: Callable[[K], bool]) -> K | None:
        if len(self._small) >= self._small_target or not self._main:
            order = (self._evict_small, self._evict_main)
        else:
            order = (self._evict_main, self._evict_small)
        for evict in order:
            victim = evict(pinned)
            if victim is not None:
                return victim
        return None

    def _evict_small(self, pinned: Callable[[K], bool]) -> K | None:
        while self._small:
            key, _ = self._small.popitem(last=False)
            if self._freq[key] > 0 or pinned(key):
                # Reused while on probation (or in use right now): promote. The
                # hit count travels along, as in the paper.
                self._main[key] = None
                continue
            del self._freq[key]
            self._ghost[key] = None
            while len(self._ghost) > self._ghost_capacity:
                self._ghost.popitem(last=False)
            return key
        return None

    def _evict_main(self, pinned: Callable[[K], bool]) -> K | None:
        # Every unpinned pass decrements a counter, so the loop ends once all
        # counters are 0; `skipped` stops it when only pinned keys remain.
        skipped = 0
        while skipped < len(self._main):
            key = next(iter(self._main))
            if pinned(key):
                self._main.move_to_end(key)
                skipped += 1
                continue
            freq = self._freq[key]
            if freq > 0:
                self._freq[key] = freq - 1
                self._main.move_to_end(key)
                skipped = 0
                continue
            del self._main[key]
            del self._freq[key]
            return key
        return None
