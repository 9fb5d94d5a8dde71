"""Small objects (a segment's manifest and indexes) skip S3-FIFO's probation,
so segment scans many times the cache's size never evict them."""

from __future__ import annotations

from sidecar.cache.slot_fifo import SlotFifo
from sidecar.layout import format_aiven_key, is_small_object

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
SEGMENT_ID = "BBBBBBBBBBBBBBBBBBBBBB"


def test_small_objects_are_the_manifest_and_indexes_of_a_segment() -> None:
    keys = {suffix: format_aiven_key("", "orders", TOPIC_ID, 3, 1200, SEGMENT_ID, suffix)
            for suffix in ("log", "indexes", "rsm-manifest")}
    assert not is_small_object(keys["log"])
    assert is_small_object(keys["indexes"]) and is_small_object(keys["rsm-manifest"])
    assert is_small_object("tiered/" + keys["rsm-manifest"], prefix="tiered/")
    assert not is_small_object("tiered/" + keys["rsm-manifest"])  # wrong prefix
    assert not is_small_object("some/other.rsm-manifest")


class SlotCache:
    """The store's policy (SlotFifo) over slots taken and freed as the store
    does, named by key for the test."""

    def __init__(self, capacity: int) -> None:
        self.policy = SlotFifo(capacity, lambda slot: hash(self.keys[slot]))
        self.free = list(range(capacity - 1, -1, -1))
        self.keys: dict[int, str] = {}

    def insert(self, key: str, main: bool = False) -> list[str]:
        slot = self.free.pop() if self.free else self.evict()
        self.keys[slot] = key
        return [self.forget(victim)
                for victim in self.policy.insert(slot, hash(key), main=main)]

    def evict(self) -> int:
        victim, = self.policy.choose_victims(1)
        self.forget(victim)
        return self.free.pop()

    def forget(self, slot: int) -> str:
        self.free.append(slot)
        return self.keys.pop(slot)

    def __contains__(self, key: str) -> bool:
        return key in self.keys.values()


def test_an_entry_admitted_to_main_survives_scans_of_many_times_the_capacity() -> None:
    cache = SlotCache(capacity=20)
    cache.insert("manifest", main=True)
    cache.insert("indexes", main=True)
    for block in range(50 * 20):  # a scan of one-hit blocks, 50x the capacity
        cache.insert(f"segment-block-{block}")
    assert "manifest" in cache and "indexes" in cache
    # Without the hint the same entry is scanned out with everything else.
    plain = SlotCache(capacity=20)
    plain.insert("manifest")
    for block in range(40):
        plain.insert(f"segment-block-{block}")
    assert "manifest" not in plain
