"""Which blocks stay cached: the index, the eviction policy, pins and warm-up
protection, and the slots given back to the disk (shrink and grow).

The index is flat arrays (``sidecar.cache.index``) and the eviction policy
S3-FIFO over slot numbers (``sidecar.cache.slot_fifo``): no object per block.
A ``SlotRecord`` is made when a lookup asks for one. Only live, unpinned and
unprotected slots are ever chosen as victims (``sidecar.cache.slot_states``).
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from collections.abc import Callable

from sidecar.cache.disk_work import DiskWork
from sidecar.cache.errors import CacheFullError
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.index import SlotBits, fingerprint, ident_hash, object_hash
from sidecar.cache.outcomes import (
    GENERATION_IN_INDEX,
    REASON_CAPACITY,
    REASON_INVALIDATED,
    REASON_SHRINK,
    CacheMetrics,
    Purged,
    Shrunk,
    Written,
)
from sidecar.cache.recent import RecentChunks
from sidecar.cache.recovery import RecoveredIndex, ScanMerge
from sidecar.cache.slab import Slab
from sidecar.cache.slot_format import SLOT_HEADER_SIZE
from sidecar.cache.slot_states import SlotStates

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")

# The name of a block the scrub verifies: recovered blocks are known by slot
# and identity hash only (their names are in their slot headers).
NAMELESS = BlockIdent("", "", "", -1)


class Residency:
    def __init__(
        self, *, recovered: RecoveredIndex, slots: SlotStates, slab: Slab, work: DiskWork,
        metrics: CacheMetrics, clock: Callable[[], float], protected_share: float,
        drop_written_pages: bool, admit_to_main: Callable[[BlockIdent], bool],
        recent: RecentChunks, scan: ScanMerge | None,
    ) -> None:
        # Which slot holds which block, as flat arrays: no object per block, so
        # that millions of slots cost ~100 bytes each. A recovered index is
        # taken over as it is: never two of them in memory.
        self.index = recovered.index
        self.policy = recovered.policy
        self.slots = slots
        self._slab = slab
        self._work = work
        self._metrics = metrics
        self._recent = recent
        # The background scan of the slot headers after a crash
        # (sidecar.cache.scan): its merge while it runs, and its end.
        self.scan_merge = scan
        self.scanned = asyncio.Event()
        if scan is None:
            self.scanned.set()
        # Warmed blocks: never evicted until read or until their deadline, and
        # never more than a share of the slots, so a warm-up cannot evict
        # itself or flush the live hot set.
        self._clock = clock
        self._protected: dict[int, float] = {}  # slot -> until
        self._max_protected = int(slab.slot_count * protected_share)
        # Slots of cached blocks no reader has had yet (see lookup), and the
        # names of at most _max_names of them: the engine is told when such a
        # block leaves unread (read ahead in vain), and the index has no names.
        self._unread = SlotBits(slab.slot_count)
        self._names: dict[int, BlockIdent] = {}
        self._max_names = max(1024, slab.slot_count // 64)
        # Slots the scrub has yet to verify (cleared when a slot's block leaves
        # the cache).
        self.unscrubbed = SlotBits(slab.slot_count)
        self._drop_written_pages = drop_written_pages
        self._disabled: set[int] = set()  # slots whose space was given back to the disk
        # Slots whose pages were dropped from the page cache: read in the executor
        # straight away. A read that only may not wait (RWF_NOWAIT) still starts
        # the kernel's read-ahead for what it misses, on the event loop.
        self.paged_out = SlotBits(slab.slot_count)
        # Blocks that skip the policy's probation (small objects read whole and
        # often: a segment's manifest and indexes), so scans cannot evict them.
        self.admit_to_main = admit_to_main

    def lookup(self, ident: BlockIdent, *, touch: bool = True) -> SlotRecord | None:
        """The record of a cached block, or None. ``touch`` counts it as a hit
        for eviction (the engine's look-ahead probes pass False).

        The first read of a block cached before any reader had its bytes (a
        coalesced fetch running ahead of its reader, read-ahead, warm-up) is its
        first use, not a reuse: counted as a hit, a segment scan would promote
        every block it reads into S3-FIFO's main queue and push out the blocks
        that are really shared (manifests, indexes).
        """
        if self.slots.closed:
            return None
        slot = self.index.find(ident_hash(ident, self.index.identity_key))
        if slot < 0:
            return None
        if touch:
            if slot in self._unread:
                self._unread.discard(slot)
                self._names.pop(slot, None)
            else:
                self.policy.touch(slot)
            self._protected.pop(slot, None)  # warmed "until read": it was read
        return self.record(ident, slot)

    def record(self, ident: BlockIdent, slot: int) -> SlotRecord:
        # Made on demand: the index holds no object per block (the generation
        # is its low 32 bits, see sidecar.cache.index).
        return SlotRecord(ident, slot, self.index.length(slot), self.index.generation(slot),
                          self.index.checksums_of(slot))

    def current(self, record: SlotRecord) -> bool:
        """Whether ``record``'s slot still holds that block with those checksums."""
        slot, index = record.slot, self.index
        if not index.holds(slot) or index.length(slot) != record.length \
                or index.generation(slot) != record.generation & GENERATION_IN_INDEX \
                or index.checksums_of(slot) != record.checksums:
            return False
        return record.ident is NAMELESS or \
            index.hash_of(slot) == ident_hash(record.ident, index.identity_key)

    def protect(self, ident: BlockIdent, ttl_s: float) -> bool:
        """Keep a cached block from eviction until it is read or ttl_s passes.

        False when the block is not cached or the protected share is full.
        """
        slot = self.index.find(ident_hash(ident, self.index.identity_key))
        if slot < 0:
            return False
        if slot not in self._protected and len(self._protected) >= self._max_protected:
            self._drop_expired()
            if len(self._protected) >= self._max_protected:
                return False
        self._protected[slot] = max(self._protected.get(slot, 0.0), self._clock() + ttl_s)
        return True

    def protected_blocks(self) -> int:
        """Warmed blocks protected now: not read yet, their TTL not passed."""
        self._drop_expired()
        return len(self._protected)

    def _drop_expired(self) -> None:
        """Forget the protections whose TTL passed (they no longer hold: see
        ``is_pinned``); done when counted and when the share is full."""
        now = self._clock()
        for expired in [slot for slot, until in self._protected.items() if until <= now]:
            del self._protected[expired]

    def is_pinned(self, slot: int) -> bool:
        """Whether the slot may not be evicted: a reader pins it, or a warm-up."""
        if slot in self.slots.pins:
            return True
        until = self._protected.get(slot)
        if until is None:
            return False
        if until > self._clock():
            return True
        del self._protected[slot]
        return False

    async def reserve_slot(self, may_wait: bool = True) -> tuple[int | None, BlockIdent | None]:
        """A slot for a write, and the block evicted to free it (if one was).

        S3-FIFO takes victims from the small FIFO while it holds its share,
        else from main. Blocks being written now will join the small FIFO, but
        are not in it yet: with a small FIFO of a few slots, writes that overlap
        would find it empty and evict blocks that proved reuse (a segment's
        manifest, say) from main. A write then waits for the block written
        before it to land in probation, and evicts that one instead.
        """
        slots = self.slots
        while True:
            if slots.free:
                return slots.free.pop(), None
            if not self.scanned.is_set():
                # Unscanned slots may be empty: evicting a recovered block to
                # make room would throw it away for nothing. The block is
                # served uncached instead, until the scan frees or finds one.
                return None, None
            joining_probation = may_wait and any(
                not self.admit_to_main(ident) for ident in slots.writing.values()
            )
            victims = self.policy.choose_victims(1, self.is_pinned,
                                                 probation_only=joining_probation)
            if victims:
                break
            if not joining_probation or slots.closed:
                return None, None
            await slots.landed.wait()
        victim = victims[0]
        name = self._forget(victim)
        self._evicted(victim, REASON_CAPACITY)
        # Unpinned by construction, so the writer may take the slot at once;
        # the write itself clears the old header's valid flag first.
        return victim, name

    def admit(self, slot: int, ident: BlockIdent, record: SlotRecord, read: bool) -> Written:
        """A block written and sealed in its slot joins the index and the policy."""
        cancelled = self.slots.end_write(slot)
        if self.slots.closed:
            return Written(None)
        if cancelled:
            self.slots.retire(slot, clear_on_disk=True)
            return Written(None)
        digest = ident_hash(ident, self.index.identity_key)
        previous = self.index.find(digest)
        if previous >= 0:
            # Replaced while we wrote (or before): the new slot takes the old
            # one's place in the policy.
            self._forget(previous)
            self.policy.replace(previous, slot)
            self.slots.retire(previous, clear_on_disk=True)
            evicted: tuple[BlockIdent, ...] = ()
        else:
            try:
                evicted = self._make_room(slot, digest, ident)
            except CacheFullError:
                # Cannot happen while the reserved slot is outside the policy
                # (it has fewer entries than slots); kept correct regardless.
                self.slots.retire(slot, clear_on_disk=True)
                return Written(None)
        self.index.add(slot, digest, record.length, record.generation, record.checksums)
        if self.scan_merge is not None:
            self.scan_merge.written(slot, record.generation)
        # As a lookup would make it: the index keeps the low 32 bits.
        record = record._replace(generation=record.generation & GENERATION_IN_INDEX)
        if not read:
            self._unread.add(slot)
            if len(self._names) < self._max_names:
                self._names[slot] = ident
        return Written(record, evicted)

    def _make_room(self, slot: int, digest: bytes, ident: BlockIdent) -> tuple[BlockIdent, ...]:
        """Insert ``slot`` into the policy; the unread blocks it evicted."""
        evicted: list[BlockIdent] = []
        victims = self.policy.insert(slot, fingerprint(digest), self.is_pinned,
                                     main=self.admit_to_main(ident))
        for victim in victims:
            name = self._forget(victim)
            self._evicted(victim, REASON_CAPACITY)
            self.slots.retire(victim, clear_on_disk=False)
            if name is not None:
                evicted.append(name)
        return tuple(evicted)

    def drop(self, slot: int, reason: str) -> None:
        self._forget(slot)
        self.policy.remove(slot)
        self._evicted(slot, reason)
        # Cleared on disk so that a future recovery of the index cannot bring
        # back an invalidated or corrupt block.
        self.slots.retire(slot, clear_on_disk=True)

    def _forget(self, slot: int) -> BlockIdent | None:
        """Remove the slot's block from the index (not from the policy); its name
        if it was unread and named."""
        self.index.remove(slot)
        self._protected.pop(slot, None)
        self._unread.discard(slot)
        self.unscrubbed.discard(slot)
        return self._names.pop(slot, None)

    def _evicted(self, slot: int, reason: str) -> None:
        self._metrics.on_eviction(reason)
        # Evicted data is of no use in the page cache: say so now rather than
        # let it push out the broker's pages.
        self.drop_pages(slot)

    def drop_pages(self, slot: int) -> None:
        self._work.start(self._drop_pages(slot))

    async def _drop_pages(self, slot: int) -> None:
        try:
            await self._work.run(self._slab.drop_pages, slot)
        except (OSError, ValueError) as exc:  # advice only; a closed slab ends it
            log.debug("could not advise the kernel about slot %d: %s", slot, exc)
        else:
            self.paged_out.add(slot)

    def release_pages(self, ident: BlockIdent) -> None:
        """A reader went past this block: write its pages back and drop them from
        the page cache, unless someone is reading it now (with drop_written_pages).
        Nothing to do for a slot whose pages are out already: one written and
        read past the page cache (direct I/O) or dropped before. That is every
        block's end on a warm replay, and each would cost a disk thread's wake."""
        slot = self.index.find(ident_hash(ident, self.index.identity_key))
        if slot < 0 or slot in self.slots.pins or slot in self.paged_out:
            return
        self.write_back(slot)

    def write_back(self, slot: int) -> None:
        """The slot's pages written back and dropped from the page cache, in
        the background (with drop_written_pages)."""
        if self._drop_written_pages:
            self._work.start(self._write_back(slot))

    async def _write_back(self, slot: int) -> None:
        try:
            await self._work.run(self._slab.write_back, slot)
        except (OSError, ValueError) as exc:  # advice only; a closed slab ends it
            log.debug("could not write back cache slot %d: %s", slot, exc)
        else:
            self.paged_out.add(slot)

    def invalidate_object(self, bucket: str, key: str) -> Purged:
        """Drop every cached block of the object, whatever its ETag."""
        digest = object_hash(bucket.encode(), key.encode(), self.index.identity_key)
        slots = self.index.slots_of_object(digest)
        if self.scan_merge is not None:
            # Its blocks in slots not scanned yet must not come back.
            self.scan_merge.purge(digest)
        self._recent.forget_object(bucket, key)
        unread = [name for slot in slots if (name := self._names.get(slot)) is not None]
        for slot in slots:
            self.drop(slot, REASON_INVALIDATED)
        self.slots.cancel_writes_of(bucket, key)
        return Purged(len(slots), tuple(unread))

    def shrink(self, nbytes: int) -> Shrunk:
        """Give about `nbytes` of disk space back (free slots first, then evicting
        the policy's victims). Never touches pinned, protected or in-flight slots."""
        free = self.slots.free
        slot_bytes = SLOT_HEADER_SIZE + self._slab.block_size
        want = -(-nbytes // slot_bytes)
        evicted: list[BlockIdent] = []
        if want > len(free):
            for victim in self.policy.choose_victims(want - len(free), self.is_pinned):
                name = self._forget(victim)
                self._evicted(victim, REASON_SHRINK)
                self.slots.retire(victim, clear_on_disk=False)
                if name is not None:
                    evicted.append(name)
        slots = [free.pop() for _ in range(min(want, len(free)))]
        self._disabled.update(slots)
        for slot in slots:
            self._work.start(self._release_space(slot))
        return Shrunk(len(slots) * slot_bytes, tuple(evicted))

    def grow(self) -> int:
        """Take back every slot given to the disk; returns how many."""
        slots = sorted(self._disabled, reverse=True)
        self._disabled.clear()
        self.slots.free.extend(array("i", slots))
        return len(slots)

    async def _release_space(self, slot: int) -> None:
        try:
            await self._work.run(self._slab.release_space, slot)
        except OSError as exc:
            log.warning("could not give back the space of cache slot %d: %s", slot, exc)

    def capacity_bytes(self) -> int:
        """Bytes of block data the usable slots can hold (slot headers not included)."""
        return (self._slab.slot_count - len(self._disabled)) * self._slab.block_size

    def index_bytes(self) -> int:
        """Memory the index of the slots takes (arrays of the index, the policy,
        the free stack and the per-slot bits), for the benchmark."""
        free = self.slots.free
        return (self.index.nbytes() + self.policy.nbytes()
                + free.itemsize * free.buffer_info()[1]
                + self._unread.nbytes() + self.unscrubbed.nbytes() + self.paged_out.nbytes()
                + (0 if self.scan_merge is None else self.scan_merge.nbytes()))
