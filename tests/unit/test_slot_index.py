"""The index in arrays (SlotIndex) and S3-FIFO over slots (SlotFifo), against
plain models: a dict, and the reference EvictionPolicy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.cache.ident import BlockIdent
from sidecar.cache.index import (
    HASH_BYTES,
    SlotBits,
    SlotIndex,
    block_hash,
    fingerprint,
    ident_hash,
    object_hash,
)
from sidecar.cache.slot_fifo import SlotFifo
from tests.support.s3fifo_reference import EvictionPolicy

# The identity key of every index here (sidecar.cache.index, "Identity hash").
KEY = bytes(range(16))


def ident(n: int, key: str = "obj", etag: str = "e1") -> BlockIdent:
    return BlockIdent("bkt", key, etag, n)


def test_the_identity_hash_covers_every_name_and_the_block() -> None:
    base = ident_hash(BlockIdent("b", "k", "e", 1), KEY)
    assert len(base) == HASH_BYTES
    others = [BlockIdent("b", "k", "e", 2), BlockIdent("b", "k", "f", 1),
              BlockIdent("b", "kk", "e", 1), BlockIdent("bb", "k", "e", 1),
              # the same bytes split differently between the names
              BlockIdent("b", "ke", "", 1), BlockIdent("bk", "", "e", 1)]
    assert base not in {ident_hash(other, KEY) for other in others}
    # What recovery computes from a header's bytes is what a lookup computes.
    assert block_hash(object_hash(b"b", b"k", KEY), b"e", 1, KEY) == base
    # The blocks of one object share its tag, whatever their version.
    assert ident_hash(BlockIdent("b", "k", "x", 9), KEY)[:4] == base[:4]
    # Keyed: another index's key gives other hashes of the same names.
    assert ident_hash(BlockIdent("b", "k", "e", 1), bytes(16)) != base


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200))
def test_the_index_agrees_with_a_dict(operations: list[tuple[bool, int]]) -> None:
    # 24 slots and a small table: probe runs wrap around and cross each other.
    index = SlotIndex(24, 4096 * 3, 4096, KEY)
    model: dict[BlockIdent, tuple[int, int]] = {}
    free = list(range(23, -1, -1))
    for adding, n in operations:
        block = ident(n, key=f"obj-{n % 5}")
        if adding and block not in model and free:
            slot = free.pop()
            length = 1 + n * 250
            checksums = tuple(range(n, n - (-length // 4096)))
            index.add(slot, ident_hash(block, KEY), length, 1000 + n, checksums)
            model[block] = (slot, length)
        elif not adding and block in model:
            slot, _ = model.pop(block)
            index.remove(slot)
            free.append(slot)
        for known, (slot, length) in model.items():
            assert index.find(ident_hash(known, KEY)) == slot
            assert index.length(slot) == length and index.holds(slot)
        assert index.find(ident_hash(ident(99), KEY)) == -1
        assert len(index) == len(model)
        assert index.used_bytes == sum(length for _, length in model.values())
    for key in {b.key for b in model}:
        expected = sorted(slot for b, (slot, _) in model.items() if b.key == key)
        assert sorted(index.slots_of_object(object_hash(b"bkt", key.encode(), KEY))) == expected
    for block, (slot, length) in model.items():
        assert index.checksums_of(slot) == tuple(range(block.block,
                                                       block.block - (-length // 4096)))
        assert index.generation(slot) == 1000 + block.block


def test_the_index_refuses_a_second_copy_and_a_busy_slot() -> None:
    index = SlotIndex(4, 4096, 4096, KEY)
    index.add(0, ident_hash(ident(1), KEY), 10, 1, (7,))
    for slot, block in ((1, ident(1)), (0, ident(2))):
        try:
            index.add(slot, ident_hash(block, KEY), 10, 1, (7,))
        except KeyError:
            continue
        raise AssertionError(f"slot {slot} took {block}")
    assert len(index) == 1


def test_slot_bits() -> None:
    bits = SlotBits(20)
    for slot in (0, 7, 8, 19, 7):
        bits.add(slot)
    bits.discard(8)
    bits.discard(9)
    assert [slot for slot in range(20) if slot in bits] == [0, 7, 19] and len(bits) == 3


class Pair:
    """EvictionPolicy over keys and SlotFifo over slots, driven alike."""

    def __init__(self, capacity: int) -> None:
        self.reference: EvictionPolicy[BlockIdent] = EvictionPolicy(capacity)
        self.slots: dict[BlockIdent, int] = {}
        self.names: dict[int, BlockIdent] = {}
        self.fifo = SlotFifo(capacity, lambda slot: fingerprint(ident_hash(self.names[slot], KEY)))
        self.free = list(range(capacity - 1, -1, -1))

    def evict(self, count: int, pinned: set[BlockIdent], probation_only: bool) -> None:
        expected = self.reference.choose_victims(count, lambda k: k in pinned,
                                                 probation_only=probation_only)
        got = self.fifo.choose_victims(count, lambda s: self.names[s] in pinned,
                                       probation_only=probation_only)
        assert [self.names[slot] for slot in got] == expected
        for slot in got:
            del self.slots[self.names.pop(slot)]
            self.free.append(slot)

    def insert(self, block: BlockIdent, main: bool) -> None:
        if not self.free:
            self.evict(1, set(), False)
        slot = self.free.pop()
        self.names[slot] = block
        self.slots[block] = slot
        assert self.reference.insert(block, main=main) == []
        assert self.fifo.insert(slot, fingerprint(ident_hash(block, KEY)), main=main) == []

    def check(self) -> None:
        assert len(self.fifo) == len(self.reference)
        for block, slot in self.slots.items():
            assert self.fifo.segment_of(slot) == self.reference.segment_of(block)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("itrvpm"), st.integers(0, 30)), max_size=300))
def test_slot_fifo_evicts_as_the_reference_policy(
    operations: list[tuple[str, int]]
) -> None:
    pair = Pair(12)
    fresh = 0
    for op, n in operations:
        resident = list(pair.slots)
        if op in "im":  # a block never seen before: no ghost involved
            fresh += 1
            pair.insert(ident(fresh, key="new"), main=op == "m")
        elif op == "t" and resident:
            block = resident[n % len(resident)]
            pair.reference.touch(block)
            pair.fifo.touch(pair.slots[block])
        elif op == "r" and resident:
            block = resident[n % len(resident)]
            slot = pair.slots.pop(block)
            pair.reference.remove(block)
            pair.fifo.remove(slot)
            del pair.names[slot]
            pair.free.append(slot)
        elif op in "vp":
            pinned = set(resident[: n % 4]) if op == "p" else set()
            pair.evict(1 + n % 3, pinned, probation_only=n % 2 == 1)
        pair.check()


def test_a_block_evicted_from_small_and_asked_again_goes_to_main() -> None:
    pair = Pair(10)
    for n in range(10):
        pair.insert(ident(n), main=False)
    pair.evict(1, set(), False)  # block 0 leaves small, into the ghost
    assert ident(0) not in pair.slots
    slot = pair.free.pop()
    pair.names[slot] = ident(0)
    assert pair.fifo.insert(slot, fingerprint(ident_hash(ident(0), KEY))) == []
    assert pair.fifo.segment_of(slot) == "main"
    assert pair.fifo.in_ghost(fingerprint(ident_hash(ident(0), KEY)))
    assert not pair.fifo.in_ghost(fingerprint(ident_hash(ident(1), KEY)))


def test_the_ghost_forgets_after_its_capacity() -> None:
    names: dict[int, int] = {}
    fifo = SlotFifo(10, names.__getitem__)
    ghost_capacity = 10 - 1  # the small FIFO's share is 1 slot

    def admit(slot: int, n: int) -> None:
        names[slot] = fingerprint(ident_hash(ident(n), KEY))
        fifo.insert(slot, names[slot])

    for n in range(10):
        admit(n, n)
    first = names[0]
    assert fifo.choose_victims(1) == [0] and fifo.in_ghost(first)
    # Each later id evicted from small pushes it further out: it is remembered
    # for at least half the ghost's capacity, and at most all of it.
    free = 0
    for n in range(10, 10 + ghost_capacity):
        admit(free, n)
        (free,) = fifo.choose_victims(1, probation_only=True)
        if n < 10 + ghost_capacity // 2:
            assert fifo.in_ghost(first)
    assert not fifo.in_ghost(first)


def test_replace_keeps_the_place_and_the_hits() -> None:
    fifo = SlotFifo(4, lambda slot: slot)
    for slot in (0, 1, 2):
        fifo.insert(slot, slot, main=True)
    fifo.touch(1)
    fifo.replace(1, 3)
    assert fifo.queue("main") == [0, 3, 2] and fifo.frequency(3) == 1 and 1 not in fifo
