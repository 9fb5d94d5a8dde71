"""Routing partitions to nodes: assignment first, else stable rendezvous hashing."""

from __future__ import annotations

import hashlib
from collections import Counter

from spark_warmup.routing import rendezvous_node, rendezvous_score, route

NODES = ["broker-1", "broker-2", "broker-3", "broker-4"]
ITEMS = [f"topic{t}-{p}" for t in range(20) for p in range(50)]


def test_scores_are_sha256_not_the_salted_hash() -> None:
    # Pinned: a change here re-routes every deployed plan's partitions.
    digest = hashlib.sha256(b"broker-1|orders-0").digest()
    assert rendezvous_score("broker-1", "orders-0") == int.from_bytes(digest[:8], "big")


def test_the_choice_does_not_depend_on_node_order() -> None:
    for item in ITEMS[:100]:
        assert rendezvous_node(item, NODES) == rendezvous_node(item, reversed(NODES))


def test_the_assignment_wins() -> None:
    free = rendezvous_node("orders-0", NODES)
    other = next(node for node in NODES if node != free)
    assert route("orders", 0, NODES, {"orders-0": other}) == other
    assert route("orders", 0, NODES, {"orders-1": other}) == free


def test_partitions_spread_evenly() -> None:
    counts = Counter(rendezvous_node(item, NODES) for item in ITEMS)
    assert set(counts) == set(NODES)
    expected = len(ITEMS) / len(NODES)
    assert all(abs(count - expected) < 0.15 * expected for count in counts.values()), counts


def test_adding_a_node_moves_only_partitions_to_it() -> None:
    before = {item: rendezvous_node(item, NODES) for item in ITEMS}
    after = {item: rendezvous_node(item, [*NODES, "broker-5"]) for item in ITEMS}
    moved = [item for item in ITEMS if before[item] != after[item]]
    assert all(after[item] == "broker-5" for item in moved)
    assert 0.1 * len(ITEMS) < len(moved) < 0.3 * len(ITEMS)  # about a fifth


def test_removing_a_node_moves_only_its_partitions() -> None:
    before = {item: rendezvous_node(item, NODES) for item in ITEMS}
    after = {item: rendezvous_node(item, NODES[:-1]) for item in ITEMS}
    assert all(before[item] == after[item] for item in ITEMS if before[item] != NODES[-1])


def test_routes_agree_across_processes() -> None:
    import json
    import subprocess
    import sys

    script = ("import json; from spark_warmup.routing import rendezvous_node; "
              f"print(json.dumps([rendezvous_node(i, {NODES!r}) for i in {ITEMS[:200]!r}]))")
    outputs = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert json.loads(outputs.pop()) == [rendezvous_node(item, NODES) for item in ITEMS[:200]]
