"""The S3-FIFO policy: scan resistance, ghost re-admission, pins, invariants."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.cache.errors import CacheFullError
from tests.support.s3fifo_reference import EvictionPolicy

CAPACITY = 1000
HOT = [f"hot-{i}" for i in range(CAPACITY // 5)]  # 20% of the capacity
SCAN = [f"scan-{i}" for i in range(2 * CAPACITY)]  # one pass, never reused
# One hot access per this many scanned keys: a hot key then comes back only after
# len(HOT) * (1 + SCANS_PER_HOT) = 1800 other keys, more than the capacity, so
# recency alone (LRU) cannot keep it.
SCANS_PER_HOT = 8


class TinyLRU:
    """The baseline the test must beat."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def access(self, key: str) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        if len(self.entries) >= self.capacity:
            self.entries.popitem(last=False)
        self.entries[key] = None


class S3FIFOCache:
    """The policy driven the way the store drives it: hit = touch, miss = insert."""

    def __init__(self, capacity: int) -> None:
        self.policy: EvictionPolicy[str] = EvictionPolicy(capacity)

    def __contains__(self, key: str) -> bool:
        return key in self.policy

    def access(self, key: str) -> None:
        if key in self.policy:
            self.policy.touch(key)
        else:
            self.policy.insert(key)


def run_hot_set_with_one_scan(cache: TinyLRU | S3FIFOCache) -> float:
    """Fraction of the hot set resident after a scan of 2x the capacity."""
    for _ in range(3):  # the hot set is established and reused
        for key in HOT:
            cache.access(key)
    hot_round = 0
    for i, key in enumerate(SCAN):
        cache.access(key)
        if i % SCANS_PER_HOT == 0:
            cache.access(HOT[hot_round % len(HOT)])
            hot_round += 1
    return sum(key in cache for key in HOT) / len(HOT)


def test_hot_set_survives_a_sequential_scan() -> None:
    assert run_hot_set_with_one_scan(S3FIFOCache(CAPACITY)) >= 0.9


def test_lru_loses_the_hot_set_in_the_same_scan() -> None:
    # Makes the test above meaningful: the workload does defeat plain recency.
    assert run_hot_set_with_one_scan(TinyLRU(CAPACITY)) < 0.9


def test_new_keys_go_to_small_and_one_hit_wonders_leave_via_ghost() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(10)  # small holds 1
    for key in "abcdefghij":
        assert policy.insert(key) == []
    assert policy.segment_of("a") == "small"
    assert policy.insert("k") == ["a"]
    assert "a" not in policy
    assert policy.segment_of("a") == "ghost"


def test_ghost_readmission_goes_to_main() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(10)
    for key in "abcdefghijk":
        policy.insert(key)
    assert policy.segment_of("a") == "ghost"
    assert policy.insert("a") == ["b"]
    assert policy.segment_of("a") == "main"


def test_hit_in_small_promotes_to_main_instead_of_evicting() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(4)
    for key in "abcd":
        policy.insert(key)
    policy.touch("a")
    assert policy.insert("e") == ["b"]
    assert policy.segment_of("a") == "main"


def test_main_gives_touched_entries_a_second_chance() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(10)
    for key in "abcdefghij":
        policy.insert(key)
        policy.touch(key)
    # Everything was hit once, so all moved to main on the way out of small;
    # "c" is hit again and outlives its neighbours.
    policy.choose_victims(1)
    policy.touch("c")
    policy.touch("c")
    evicted = policy.choose_victims(len(policy) - 1)
    assert evicted == list("bdefghij")
    assert policy.segment_of("c") == "main"


def test_pinned_entries_are_never_victims() -> None:
    policy: EvictionPolicy[int] = EvictionPolicy(5)
    for key in range(5):
        policy.insert(key)
    pinned = {0, 1, 2}
    for key in range(5, 50):
        victims = policy.insert(key, lambda k: k in pinned)
        assert not pinned & set(victims)
        assert len(policy) <= 5
    assert all(key in policy for key in pinned)
    assert not pinned & set(policy.choose_victims(5, lambda k: k in pinned))
    assert all(key in policy for key in pinned)


def test_insert_when_everything_is_pinned_raises_and_changes_nothing() -> None:
    policy: EvictionPolicy[int] = EvictionPolicy(3)
    for key in range(3):
        policy.insert(key)
    with pytest.raises(CacheFullError):
        policy.insert(99, lambda k: True)
    assert len(policy) == 3 and 99 not in policy
    assert policy.choose_victims(2, lambda k: True) == []
    assert policy.insert(99) != []


def test_probation_only_victims_never_come_from_main() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(4)
    for key in ("m1", "m2", "m3"):
        policy.insert(key, main=True)
    policy.insert("s1")
    assert policy.choose_victims(1, probation_only=True) == ["s1"]
    assert policy.choose_victims(1, probation_only=True) == []  # small is empty: none
    assert [policy.segment_of(key) for key in ("m1", "m2", "m3")] == ["main"] * 3
    assert policy.choose_victims(1) == ["m1"]  # without the restriction, main goes


def test_remove_and_touch_of_unknown_keys_are_no_ops() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(2)
    policy.insert("a")
    policy.remove("zz")
    policy.touch("zz")
    policy.remove("a")
    assert "a" not in policy and len(policy) == 0 and policy.segment_of("a") is None
    policy.insert("b")
    with pytest.raises(KeyError):
        policy.insert("b")


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_must_be_positive(capacity: int) -> None:
    with pytest.raises(ValueError):
        EvictionPolicy(capacity)


KEYS = st.integers(min_value=0, max_value=40)
OPS = st.one_of(
    st.tuples(st.just("insert"), KEYS),
    st.tuples(st.just("touch"), KEYS),
    st.tuples(st.just("remove"), KEYS),
    st.tuples(st.just("choose"), st.integers(min_value=0, max_value=5)),
    st.tuples(st.just("pin"), KEYS),
    st.tuples(st.just("unpin"), KEYS),
)


@settings(max_examples=300, deadline=None, database=None)
@given(capacity=st.integers(min_value=1, max_value=12), ops=st.lists(OPS, max_size=200))
def test_random_operations_keep_the_invariants(
    capacity: int, ops: list[tuple[str, int]]
) -> None:
    policy: EvictionPolicy[int] = EvictionPolicy(capacity)
    resident: set[int] = set()  # the model
    pinned: set[int] = set()

    def is_pinned(key: int) -> bool:
        return key in pinned

    for op, arg in ops:
        if op == "insert" and arg not in resident:
            try:
                victims = policy.insert(arg, is_pinned)
            except CacheFullError:
                assert len(resident) == capacity and resident <= pinned
                continue
            assert set(victims) <= resident and not set(victims) & pinned
            assert len(victims) == len(set(victims))
            resident -= set(victims)
            resident.add(arg)
        elif op == "choose":
            victims = policy.choose_victims(arg, is_pinned)
            assert set(victims) <= resident and not set(victims) & pinned
            assert len(victims) == min(arg, len(resident - pinned))
            resident -= set(victims)
        elif op == "touch":
            policy.touch(arg)
        elif op == "remove":
            policy.remove(arg)
            resident.discard(arg)
        elif op == "pin":
            pinned.add(arg)
        elif op == "unpin":
            pinned.discard(arg)
        assert len(policy) == len(resident) <= capacity
        assert all(key in policy for key in resident)
        assert not any(key in policy for key in range(41) if key not in resident)
