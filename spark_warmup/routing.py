"""Which node's sidecar warms a partition: the plan's assignment, else rendezvous hashing.

Rendezvous (highest-random-weight) hashing scores every node for a partition
and takes the highest: all planners agree without coordination, and adding or
removing a node moves only the partitions that go to or came from that node.
The score is SHA-256 of `node|topic-partition`, stable across processes and
Python versions (unlike `hash()`, which is salted per process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping


def partition_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def rendezvous_score(node: str, item: str) -> int:
    digest = hashlib.sha256(f"{node}|{item}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_node(item: str, nodes: Iterable[str]) -> str:
    """The node with the highest score for `item` (ties, vanishingly rare, by name)."""
    candidates = list(nodes)
    if not candidates:
        raise ValueError("no nodes to route to")
    return max(candidates, key=lambda node: (rendezvous_score(node, item), node))


def route(topic: str, partition: int, nodes: Iterable[str], assignment: Mapping[str, str]) -> str:
    name = partition_name(topic, partition)
    assigned = assignment.get(name)
    return assigned if assigned is not None else rendezvous_node(name, nodes)
