"""Records of known content on a real broker, and a consumer that catches up on them.

`produce` writes `count` records to each partition of a topic; record `i` of
partition `p` has key `p:i` and a value that only (p, i) determines, so a
consumer can check every byte it gets without keeping a copy. `catch_up` reads
the partitions from offset 0 to their end with kafka-python, as a lagging
consumer group does, and checks that each partition's records arrive exactly
once, in order, each exact: a `CatchUp` says what it read, how fast, and the
latency of its fetches. The broker demo, the real-broker tests and the broker
benchmark share them.
"""

from __future__ import annotations

import math
import random
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_HEAD = struct.Struct(">IQ")  # partition, index: the value starts with what it is
#: The longest a catch-up waits for its first connection (kafka-python's default).
_BOOTSTRAP_S = 30.0
#: How long a topic or partition missing from the cluster's metadata is asked again for.
_METADATA_S = 2.0


def record_value(partition: int, index: int, size: int) -> bytes:
    """The value of record `index` of `partition`: its identity, then bytes seeded by it."""
    body = random.Random(partition * 1_000_000_007 + index).randbytes(max(0, size - _HEAD.size))
    return _HEAD.pack(partition, index) + body


def produce(bootstrap: str, topic: str, partitions: Iterable[int], count: int,
            size: int = 1000) -> int:
    """Write `count` records of `size` bytes to each partition; the bytes written.
    CatchUpError, before any record, when no broker answers or the topic or one of
    the partitions does not exist."""
    from kafka import KafkaProducer

    chosen = list(partitions)  # walked once per record index: an iterator would end after one
    # The topic first: for one that does not exist the producer would wait 60 s
    # (max_block_ms) and then say only "Failed to update metadata after 60.0 secs."
    checker = _consumer(bootstrap, _BOOTSTRAP_S)
    try:
        _check_partitions(checker, bootstrap, topic, dict.fromkeys(chosen, 0), _METADATA_S)
    finally:
        checker.close()
    # Idempotent (which needs acks=all): the client retries a batch that timed
    # out with four more in flight, and without the broker's sequence check the
    # retry lands after them, so record i is no longer at offset i (a loaded
    # machine did that: "record 0 has other bytes than were produced").
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                             batch_size=512 * 1024, max_request_size=8 * 1024 * 1024,
                             acks="all", enable_idempotence=True, compression_type=None)
    written = 0
    try:
        for index in range(count):
            for partition in chosen:
                value = record_value(partition, index, size)
                producer.send(topic, key=f"{partition}:{index}".encode(), value=value,
                              partition=partition)
                written += len(value)
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)
    return written


class CatchUpError(AssertionError):
    """A record missing, repeated, out of order or with other bytes than produced; or
    a catch-up (or a produce) that cannot start: no broker answering, no such topic
    or partition."""


@dataclass
class CatchUp:
    """What one catch-up read."""

    records: int = 0
    value_bytes: int = 0
    seconds: float = 0.0
    fetch_seconds: list[float] = field(default_factory=list)
    #: Fetches the broker answered with UNKNOWN_SERVER_ERROR (a remote read that
    #: failed), polled again as the Java consumer does.
    fetch_errors: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / 1e6 / self.seconds if self.seconds else 0.0

    def fetch_p99(self) -> float:
        if not self.fetch_seconds:
            return 0.0
        ordered = sorted(self.fetch_seconds)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def catch_up(bootstrap: str, topic: str, partitions: Sequence[int], count: int,
             size: int = 1000, group: str | None = None, timeout_s: float = 120.0,
             on_record: Any = None, start: Mapping[int, int] | None = None,
             on_error: Any = None) -> CatchUp:
    """Read each partition up to record `count`, from offset 0 or from `start`'s offset
    for it (a lagging group's committed offsets, say), checking each record.

    With `group`, offsets are committed to it as a consumer group's would be.
    `on_record(done)` is called with the records read so far after each poll (a
    test's hook to act in the middle of a catch-up); `on_error(errors)` with the
    fetch errors so far after each one. Raises CatchUpError on a
    wrong, repeated or missing record, or when `timeout_s` passes first.
    """
    from kafka import TopicPartition
    from kafka.errors import UnknownError

    expected = {partition: (start or {}).get(partition, 0) for partition in partitions}
    _check_arguments(expected, count, timeout_s)
    consumer = _consumer(
        bootstrap, timeout_s, group_id=group, enable_auto_commit=group is not None,
        auto_offset_reset="earliest", fetch_max_bytes=50 * 1024 * 1024,
        max_partition_fetch_bytes=1024 * 1024, request_timeout_ms=60_000)
    result = CatchUp()
    try:
        # Inside the try: the consumer's I/O thread and connections are closed
        # whatever fails from here on.
        _check_partitions(consumer, bootstrap, topic, expected, timeout_s)
        started = time.monotonic()
        assigned = [TopicPartition(topic, partition) for partition in partitions]
        consumer.assign(assigned)
        for tp in assigned:
            consumer.seek(tp, expected[tp.partition])
        while any(done < count for done in expected.values()):
            if time.monotonic() - started > timeout_s:
                raise CatchUpError(f"caught up {dict(expected)} of {count} a partition "
                                   f"in {timeout_s:g}s")
            polled = time.monotonic()
            try:
                batches = consumer.poll(timeout_ms=1000, max_records=100_000)
            except UnknownError:
                # The broker could not read the remote segment (its storage failed):
                # the Java consumer logs it and fetches again; kafka-python raises.
                result.fetch_errors += 1
                if on_error is not None:
                    on_error(result.fetch_errors)
                continue
            if batches:
                result.fetch_seconds.append(time.monotonic() - polled)
            for tp, records in batches.items():
                for record in records:
                    _check(record, tp.partition, expected[tp.partition], size)
                    expected[tp.partition] += 1
                    result.records += 1
                    result.value_bytes += len(record.value)
            if on_record is not None:
                on_record(result.records)
        result.seconds = time.monotonic() - started
        if group is not None:
            consumer.commit()
    finally:
        consumer.close()
    return result


def _consumer(bootstrap: str, timeout_s: float, **settings: Any) -> Any:
    """A KafkaConsumer connected within `timeout_s` (30 s at most): kafka-python
    alone waits its 30 s whatever the caller's time, then raises its own
    KafkaTimeoutError; here a CatchUpError names the address."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaTimeoutError

    wait = min(timeout_s, _BOOTSTRAP_S)
    try:
        return KafkaConsumer(bootstrap_servers=bootstrap,
                             bootstrap_timeout_ms=int(wait * 1000), **settings)
    except KafkaTimeoutError as exc:
        raise CatchUpError(f"no Kafka broker answered at {bootstrap} within {wait:g}s") \
            from exc


def _check_partitions(consumer: Any, bootstrap: str, topic: str,
                      expected: Mapping[int, int], timeout_s: float) -> None:
    """CatchUpError for a topic or partition the cluster does not have: a consumer
    assigned one would poll nothing until timeout_s and say only that it lagged.
    Metadata is asked again for two seconds first: a topic just created may
    have no leader yet, and kafka-python then lists no partition of it."""
    deadline = time.monotonic() + min(timeout_s, _METADATA_S)
    while True:
        known = consumer.partitions_for_topic(topic)
        missing = sorted(set(expected) - set(known))
        if not missing:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not known:
        raise CatchUpError(f"topic {topic!r} does not exist on {bootstrap}")
    raise CatchUpError(f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
                       f"(it has {len(known)})")


def _check_arguments(expected: Mapping[int, int], count: int, timeout_s: float) -> None:
    """ValueError, before any connection, for a catch-up that could not end or
    would check nothing: a NaN timeout is never passed, so it would wait forever."""
    if not expected:
        raise ValueError("catch_up: no partition to read")
    if count < 0:
        raise ValueError(f"catch_up: count must be 0 or more, got {count}")
    if not 0 < timeout_s < math.inf:
        raise ValueError(f"catch_up: timeout_s must be a number of seconds above 0, "
                         f"got {timeout_s}")
    below = {partition: offset for partition, offset in expected.items() if offset < 0}
    if below:
        raise ValueError(f"catch_up: start offsets must be 0 or more, got {below}")


def _check(record: Any, partition: int, index: int, size: int) -> None:
    if record.offset != index:
        raise CatchUpError(f"partition {partition}: offset {record.offset} where {index} "
                           "was next (a record missing or repeated)")
    if record.value != record_value(partition, index, size):
        raise CatchUpError(f"partition {partition}: record {index} has other bytes than "
                           "were produced")


def commit_group(bootstrap: str, group: str, topic: str, offsets: Mapping[int, int]) -> None:
    """Commit `offsets` (partition -> next offset to read) for `group` without reading
    a record: a consumer group that stopped there and lags since."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, partition) for partition in offsets])
        consumer.commit({TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                         for partition, offset in offsets.items()})
    finally:
        consumer.close()
