"""Small objects (a segment's manifest and indexes) skip S3-FIFO's probation,
so segment scans many times the cache's size never evict them."""

from __future__ import annotations

from sidecar.cache.policy import EvictionPolicy
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


def test_an_entry_admitted_to_main_survives_scans_of_many_times_the_capacity() -> None:
    policy: EvictionPolicy[str] = EvictionPolicy(capacity=20)
    policy.insert("manifest", main=True)
    policy.insert("indexes", main=True)
    assert policy.segment_of("manifest") == "main"
    evicted: list[str] = []
    for block in range(50 * 20):  # a scan of one-hit blocks, 50x the capacity
        evicted += policy.insert(f"segment-block-{block}")
    assert len(evicted) == 50 * 20 - 18  # everything else left, many times over
    assert "manifest" in policy and "indexes" in policy
    # Without the hint the same entry is scanned out with everything else.
    plain: EvictionPolicy[str] = EvictionPolicy(capacity=20)
    plain.insert("manifest")
    for block in range(40):
        plain.insert(f"segment-block-{block}")
    assert "manifest" not in plain
