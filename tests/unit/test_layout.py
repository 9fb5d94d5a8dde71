from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.layout import (
    Layout,
    SegmentKey,
    format_aiven_key,
    next_segment_key,
    parse_aiven_key,
    parse_layout,
)

TOPIC_ID = "Qx-9_aBcDeFgHiJkLmNoPw"  # contains '-' and '_' on purpose
SEGMENT_ID = "p0-_r7sTuVwXyZ01234567"
KEY = f"tiered/orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log"


def test_parse_aiven_key() -> None:
    assert parse_aiven_key(KEY, "tiered/") == SegmentKey(
        prefix="tiered/",
        topic="orders",
        topic_id=TOPIC_ID,
        partition=3,
        start_offset=1234,
        segment_id=SEGMENT_ID,
        suffix="log",
    )


def test_topic_with_dashes_dots_and_underscores() -> None:
    key = f"my-topic.v2_x-{TOPIC_ID}/0/{0:020d}-{SEGMENT_ID}.indexes"
    parsed = parse_aiven_key(key)
    assert parsed is not None
    assert parsed.topic == "my-topic.v2_x"
    assert parsed.topic_id == TOPIC_ID
    assert parsed.suffix == "indexes"
    assert parsed.key == key


def test_topic_id_starting_with_dash() -> None:
    topic_id = "-" + TOPIC_ID[1:]
    key = f"t-{topic_id}/0/{7:020d}-{SEGMENT_ID}.rsm-manifest"
    parsed = parse_aiven_key(key)
    assert parsed is not None
    assert (parsed.topic, parsed.topic_id) == ("t", topic_id)
    assert parsed.suffix == "rsm-manifest"


def test_segment_key_properties() -> None:
    parsed = parse_aiven_key(KEY, "tiered/")
    assert parsed is not None
    assert parsed.partition_prefix == f"tiered/orders-{TOPIC_ID}/3/"
    assert parsed.key == KEY
    sibling = parsed.with_suffix("indexes")
    assert sibling.key == KEY.removesuffix(".log") + ".indexes"
    assert sibling.start_offset == parsed.start_offset
    with pytest.raises(ValueError):
        parsed.with_suffix("index")


@pytest.mark.parametrize(
    "key",
    [
        "",
        "random/object.bin",
        f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.txt",
        f"orders-{TOPIC_ID}/3/1234-{SEGMENT_ID}.log",  # offset not padded
        f"orders-{TOPIC_ID}/3/000000000000000001234-{SEGMENT_ID}.log",  # 21 digits
        f"orders-{TOPIC_ID}/03/00000000000000001234-{SEGMENT_ID}.log",
        f"orders-{TOPIC_ID}/-3/00000000000000001234-{SEGMENT_ID}.log",
        f"orders-{TOPIC_ID}/x/00000000000000001234-{SEGMENT_ID}.log",
        f"orders-{TOPIC_ID[:-1]}/3/00000000000000001234-{SEGMENT_ID}.log",
        f"orders{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log",  # no '-'
        f"-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log",  # empty topic
        f"or/ders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log",
        f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID[:-1]}.log",
        f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID[:-1]}=.log",
        f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log\n",
        f"orders-{TOPIC_ID}/3/00000000000000001234_{SEGMENT_ID}.log",
        f"orders-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log/extra",
        f"{'t' * 250}-{TOPIC_ID}/3/00000000000000001234-{SEGMENT_ID}.log",
    ],
)
def test_parse_rejects_non_layout_keys(key: str) -> None:
    assert parse_aiven_key(key) is None


def test_parse_requires_prefix() -> None:
    assert parse_aiven_key(KEY) is None
    assert parse_aiven_key(KEY, "other/") is None
    assert parse_aiven_key(KEY.removeprefix("tiered/"), "tiered/") is None


def test_format_aiven_key() -> None:
    assert format_aiven_key("tiered/", "orders", TOPIC_ID, 3, 1234, SEGMENT_ID) == KEY
    assert format_aiven_key("", "t", TOPIC_ID, 0, 0, SEGMENT_ID, "indexes") == (
        f"t-{TOPIC_ID}/0/00000000000000000000-{SEGMENT_ID}.indexes"
    )


@pytest.mark.parametrize(
    ("topic", "topic_id", "partition", "offset", "segment_id", "suffix"),
    [
        ("or/ders", TOPIC_ID, 0, 0, SEGMENT_ID, "log"),
        ("", TOPIC_ID, 0, 0, SEGMENT_ID, "log"),
        ("orders", "short", 0, 0, SEGMENT_ID, "log"),
        ("orders", TOPIC_ID, -1, 0, SEGMENT_ID, "log"),
        ("orders", TOPIC_ID, 0, -1, SEGMENT_ID, "log"),
        ("orders", TOPIC_ID, 0, 10**20, SEGMENT_ID, "log"),
        ("orders", TOPIC_ID, 0, 0, SEGMENT_ID + "=", "log"),
        ("orders", TOPIC_ID, 0, 0, SEGMENT_ID, "timeindex"),
    ],
)
def test_format_rejects_invalid_parts(
    topic: str, topic_id: str, partition: int, offset: int, segment_id: str, suffix: str
) -> None:
    with pytest.raises(ValueError):
        format_aiven_key("", topic, topic_id, partition, offset, segment_id, suffix)


def key_at(
    offset: int, partition: int = 3, suffix: str = "log", topic: str = "orders"
) -> str:
    return format_aiven_key(
        "tiered/", topic, TOPIC_ID, partition, offset, SEGMENT_ID, suffix
    )


def test_next_segment_key() -> None:
    listing = [
        key_at(0),
        key_at(500),
        key_at(500, suffix="indexes"),
        key_at(1000, suffix="indexes"),  # only .log keys are candidates
        key_at(2000),
        key_at(700, partition=4),  # other partition
        key_at(600, topic="orders-x"),  # other topic
        "tiered/garbage",
    ]
    assert next_segment_key(listing, key_at(0), "tiered/") == key_at(500)
    assert next_segment_key(reversed(listing), key_at(0), "tiered/") == key_at(500)
    assert next_segment_key(listing, key_at(500), "tiered/") == key_at(2000)
    indexes = key_at(500, suffix="indexes")
    assert next_segment_key(listing, indexes, "tiered/") == key_at(2000)
    assert next_segment_key(listing, key_at(600), "tiered/") == key_at(2000)
    assert next_segment_key(listing, key_at(2000), "tiered/") is None
    assert next_segment_key(listing, "tiered/garbage", "tiered/") is None
    assert next_segment_key([], key_at(0), "tiered/") is None
    assert next_segment_key(listing, key_at(0), "") is None  # prefix mismatch


def test_layout_enum() -> None:
    assert parse_layout("aiven") is Layout.AIVEN
    assert parse_layout("PLAIN") is Layout.PLAIN
    expected = "unknown key layout 'confluent'.*aiven, plain"
    with pytest.raises(ValueError, match=expected):
        parse_layout("confluent")
    listing = [key_at(0), key_at(500)]
    assert Layout.AIVEN.next_segment_key(listing, key_at(0), "tiered/") == key_at(500)
    assert Layout.PLAIN.next_segment_key(listing, key_at(0), "tiered/") is None


# --- properties ----------------------------------------------------------

uuids = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
    min_size=22,
    max_size=22,
)
topics = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-",
    min_size=1,
    max_size=249,
)
segments = st.builds(
    SegmentKey,
    prefix=st.sampled_from(["", "tiered/", "a/b-c/"]),
    topic=topics,
    topic_id=uuids,
    partition=st.integers(min_value=0, max_value=2**31 - 1),
    start_offset=st.integers(min_value=0, max_value=2**63 - 1),
    segment_id=uuids,
    suffix=st.sampled_from(["log", "indexes", "rsm-manifest"]),
)


@given(segments)
def test_key_round_trip(segment: SegmentKey) -> None:
    assert parse_aiven_key(segment.key, segment.prefix) == segment
    assert (
        format_aiven_key(
            segment.prefix,
            segment.topic,
            segment.topic_id,
            segment.partition,
            segment.start_offset,
            segment.segment_id,
            segment.suffix,
        )
        == segment.key
    )


offsets = st.integers(min_value=0, max_value=10**6)


@given(segments, offsets, st.lists(offsets, max_size=10))
def test_next_segment_is_smallest_later_offset(
    segment: SegmentKey, current: int, listed: list[int]
) -> None:
    segment = replace(segment, start_offset=current)
    listing = [replace(segment, start_offset=o, suffix="log").key for o in listed]
    found = next_segment_key(listing, segment.key, segment.prefix)
    later = sorted(o for o in listed if o > current)
    if not later:
        assert found is None
        return
    assert found is not None
    parsed = parse_aiven_key(found, segment.prefix)
    assert parsed is not None
    assert parsed.start_offset == later[0]
    # Zero-padding makes key order agree with offset order: '.' sorts after
    # the '-' that follows an equal offset, and before any larger offset.
    boundary = f"{segment.partition_prefix}{current:020d}."
    assert found == min(k for k in listing if k > boundary)
