"""The capacity analysis's pure parts: log lines, splits, the replay, the curve, the page."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.cache.ident import BlockIdent
from sidecar.cache.slot_format import SLOT_HEADER_SIZE
from sidecar.layout import Layout
from sidecar.model import PREFETCH, WARM, FetchDone, ObjectInfo
from sidecar.tally import CACHED, FETCHED, JOINED, ReadTally
from sidecar.telemetry.access_log import (
    NodeFacts,
    ReadFacts,
    entry,
    fetch_entry,
    format_entry,
)
from spark_warmup.capacity.accuracy import load_cells, nearest, trust_text
from spark_warmup.capacity.curve import (
    Point,
    SizeError,
    best_size,
    default_sizes,
    parse_sizes,
    recommend,
    sample_rate,
    unit_hash,
)
from spark_warmup.capacity.landing import (
    MOMENT_EXPONENT,
    SIZE_EXPONENT,
    FetchTimes,
    LoadTally,
    OriginLoad,
    time_bin,
)
from spark_warmup.capacity.report import (
    finding_line,
    render_html,
    size_text,
    size_ticks,
    time_ticks,
    unreached_note,
)
from spark_warmup.capacity.simulate import SLOT_HEADER_SIZE as REPLAYED_HEADER
from spark_warmup.capacity.simulate import Read, Replay, Settings, replay
from spark_warmup.capacity.sources import (
    COMPRESSED,
    LONG_LINE,
    MAX_LINE_BYTES,
    Split,
    Unreadable,
    expand,
    matches_nothing,
    object_lines,
    read_split,
    split_lines,
)
from spark_warmup.capacity.trace import Fetch, Malformed, Other, Request, parse_line

MiB = 1024 * 1024
BLOCK = MiB
KEY = "orders-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"


def logged(**changes: object) -> str:
    """A line as the sidecar writes it (its own formatter)."""
    tally = ReadTally()
    for block, how in ((2, CACHED), (3, JOINED), (4, FETCHED)):
        tally.add(block, how, PREFETCH)
    tally.origin_bytes = BLOCK  # block 4, fetched by this request (as the engine counts)
    facts: dict[str, object] = dict(
        now=1_790_000_000.0, request_id="R", method="GET", raw_path=f"/tiered/{KEY}",
        range_header="bytes=2621440-", status=206, body_bytes=2 * MiB + MiB // 2,
        cache="partial", duration_s=0.01, node=NodeFacts("b1", BLOCK, 64 * MiB),
        read=ReadFacts('"e"', 8 * MiB, 2621440, 8 * MiB - 1, tally))
    facts.update(changes)
    return format_entry(entry(**facts))  # type: ignore[arg-type]


def test_a_line_the_sidecar_wrote_parses_into_its_facts() -> None:
    request = parse_line(logged())
    assert isinstance(request, Request)
    assert (request.node, request.topic, request.partition, request.lazy) == \
        ("b1", "orders", 0, True)
    assert (request.first_block, request.found, request.cache_bytes) == (2, "cjf", 64 * MiB)
    tally = request.tallies()
    # 2.5 MiB from 2.5 MiB: half of block 2 and all of block 3 were hits; block 4
    # (fetched, whole) and the joined block 3 (a prefetch) came from the origin.
    assert (tally.blocks, tally.hit_blocks, tally.hit_bytes) == (3, 2, MiB + MiB // 2)
    assert (tally.origin_foreground, tally.origin_prefetch) == (MiB, 0)


def test_an_answer_cut_off_is_replayed_for_the_bytes_it_delivered() -> None:
    """A line whose answer the sidecar cut off (`cut_off`, last in the line)
    parses as any read: its blocks were read and fetched all the same."""
    read = ReadFacts('"e"', 8 * MiB, 2621440, 8 * MiB - 1, ReadTally(), cut_off="client_timeout")
    line = logged(body_bytes=MiB, read=read)
    assert json.loads(line)["cut_off"] == "client_timeout"
    request = parse_line(line)
    assert isinstance(request, Request) and request.bytes == MiB


def test_a_log_from_before_origin_bytes_charges_joined_read_ahead_to_its_reader() -> None:
    older = json.loads(logged())
    del older["origin_bytes"]
    request = parse_line(json.dumps(older))
    assert isinstance(request, Request) and request.origin_bytes is None
    assert (request.tallies().origin_foreground, request.tallies().origin_prefetch) == \
        (MiB, 0)
    older["blocks"]["found"], older["lane"] = "ccj", "prefetch"
    joined = parse_line(json.dumps(older))
    assert isinstance(joined, Request)
    assert (joined.tallies().origin_foreground, joined.tallies().origin_prefetch) == (0, MiB)


def test_a_background_fetch_line_counts_its_origin_bytes_and_is_not_a_read() -> None:
    info = ObjectInfo("tiered", KEY, 8 * MiB, '"e"', datetime(2026, 9, 1, tzinfo=UTC))
    line = format_entry(fetch_entry(
        now=1_790_000_001.0, node=NodeFacts("b1", BLOCK, 64 * MiB),
        done=FetchDone(PREFETCH, info, 5, 6, 2 * MiB, 0.02, ok=True)))
    fetch = parse_line(line)
    assert isinstance(fetch, Fetch)
    assert (fetch.node, fetch.lane, fetch.origin_bytes, fetch.first_block, fetch.blocks,
            fetch.topic, fetch.partition) == ("b1", "prefetch", 2 * MiB, 5, 2, "orders", 0)
    negative = json.loads(line)
    negative["origin_bytes"] = -1
    assert parse_line(json.dumps(negative)) == Malformed("field 'origin_bytes' is negative")
    del negative["lane"]
    assert parse_line(json.dumps(negative)) == \
        Malformed("field 'lane' is missing or not str")


@pytest.mark.parametrize(("line", "reason"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"node": "b1", "status": 206, "bytes": 5}), "field 'time' is missing"),
    (json.dumps({"node": 3, "status": 206}), "field 'node' is missing or not str"),
])
def test_bad_lines_are_malformed_with_the_field_named(line: str, reason: str) -> None:
    parsed = parse_line(line)
    assert isinstance(parsed, Malformed) and parsed.reason.startswith(reason), parsed


def _fetch_line() -> str:
    info = ObjectInfo("tiered", KEY, 8 * MiB, '"e"', datetime(2026, 9, 1, tzinfo=UTC))
    return format_entry(fetch_entry(
        now=1_790_000_001.0, node=NodeFacts("b1", BLOCK, 64 * MiB),
        done=FetchDone(PREFETCH, info, 5, 6, 2 * MiB, 0.02, ok=True)))


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("object_size", 10 ** 30, "field 'object_size' is larger than 9007199254740991"),
    ("bytes", 2 ** 63, "field 'bytes' is larger than 9007199254740991"),
    ("first_byte", -1, "field 'first_byte' is negative"),
    ("object_size", -8, "field 'object_size' is negative"),
    ("block_size", 2 ** 64, "field 'block_size' is larger than 9007199254740991"),
    ("cache_bytes", 10 ** 20, "field 'cache_bytes' is larger than 9007199254740991"),
    ("origin_bytes", 10 ** 20, "field 'origin_bytes' is larger than 9007199254740991"),
    ("blocks", {"first": -2, "found": "c"}, "field 'blocks.first' is negative"),
    ("duration_s", -0.5, "field 'duration_s' is negative"),
    ("duration_s", float("nan"), "field 'duration_s' is not a finite number"),
    ("duration_s", float("inf"), "field 'duration_s' is not a finite number"),
    ("duration_s", 10 ** 400, "field 'duration_s' is not a finite number"),
], ids=lambda value: repr(value)[:24])
def test_numbers_a_sidecar_never_writes_are_malformed_not_a_crash(
        field: str, value: object, reason: str, tmp_path: Path) -> None:
    """Out of a 64-bit long (Spark's column type), negative or not finite: the
    line is counted with the field named, and never reaches Spark's rows."""
    from pyspark.sql.types import _make_type_verifier

    from spark_warmup.capacity.job import LINE_SCHEMA, line_rows

    read = json.loads(logged())
    read[field] = value
    # NaN and Infinity as Python's JSON writes them (and reads them back).
    assert parse_line(json.dumps(read)) == Malformed(reason)
    if field not in ("first_byte", "cache_bytes"):  # not read from a FETCH line
        fetch = json.loads(_fetch_line())
        fetch[field] = value
        assert parse_line(json.dumps(fetch)) == Malformed(reason)
    log = tmp_path / "access.log"
    log.write_text("\n".join([json.dumps(read), logged(), _fetch_line()]) + "\n")
    rows = list(line_rows(Split(str(log)), ""))
    assert [row[0] for row in rows] == ["malformed", "read", "fetch"]
    verify = _make_type_verifier(LINE_SCHEMA)
    for row in rows:
        verify(row)  # raises for a value Spark's createDataFrame would refuse


@pytest.mark.parametrize(("changes", "reason"), [
    ({"block_size": 4096}, "field 'block_size' is 4096, no block size the sidecar takes"),
    ({"block_size": 512 * MiB}, "field 'block_size' is 536870912, no block size"),
    ({"block_size": MiB + 1}, "field 'block_size' is 1048577, no block size"),
    ({"bytes": 2 ** 50}, "field 'bytes' runs past the object's end"),
    ({"first_byte": 8 * MiB}, "field 'bytes' runs past the object's end"),
])
def test_a_read_no_sidecar_could_have_served_is_malformed(
        changes: dict[str, object], reason: str) -> None:
    line = json.loads(logged())  # 2.5 MiB from 2.5 MiB of an 8 MiB object
    line.update(changes)
    parsed = parse_line(json.dumps(line))
    assert isinstance(parsed, Malformed) and parsed.reason.startswith(reason), parsed
    # The last byte of the object is a read like any other.
    line = json.loads(logged())
    line["first_byte"], line["bytes"] = 8 * MiB - 1, 1
    assert isinstance(parse_line(json.dumps(line)), Request)


def test_a_fetch_starting_past_the_largest_count_is_malformed() -> None:
    fetch = json.loads(_fetch_line())
    fetch["blocks"]["first"] = 2 ** 52
    assert parse_line(json.dumps(fetch)) == \
        Malformed("field 'blocks.first' starts past byte 9007199254740991")


def test_a_time_without_an_offset_is_utc_wherever_it_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from spark_warmup.capacity.trace import parse_time

    monkeypatch.setenv("TZ", "Asia/Tokyo")  # an executor's local time, 9 hours off
    time.tzset()
    try:
        assert parse_time("2026-11-01T06:00:00.5") == parse_time("2026-11-01T06:00:00.5Z") \
            == datetime(2026, 11, 1, 6, 0, 0, 500000, tzinfo=UTC).timestamp()
        assert parse_time("2026-11-01T15:00:00+09:00") == parse_time("2026-11-01T06:00:00Z")
    finally:
        monkeypatch.undo()
        time.tzset()


def test_lines_without_object_bytes_are_counted_not_replayed() -> None:
    head = logged(method="HEAD", body_bytes=0)
    assert parse_line(head) == Other("b1")
    bad_letters = json.loads(logged())
    bad_letters["blocks"]["found"] = "cx"
    assert isinstance(parse_line(json.dumps(bad_letters)), Malformed)


def test_splits_hand_every_line_to_exactly_one_reader(tmp_path: Path) -> None:
    lines = [f'{{"n": {n}, "pad": "{"x" * (n % 37)}"}}' for n in range(500)]
    log = tmp_path / "access.log"
    log.write_text("\n".join(lines) + "\n")
    splits, missing = expand([str(tmp_path), str(tmp_path / "nope*")], split_bytes=997)
    assert len(splits) > 10 and [m.source for m in missing] == [str(tmp_path / "nope*")]
    read = [line.rstrip("\n") for split in splits for line in read_split(split)]
    assert read == lines


def test_a_local_path_that_matches_nothing_is_known_before_reading(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("{}\n")
    assert not matches_nothing(str(tmp_path))
    assert not matches_nothing(str(tmp_path / "*.log"))
    assert matches_nothing(str(tmp_path / "nope*"))
    assert matches_nothing(str(tmp_path / "gone.log"))
    # An object store's prefix is listed on the executors, not here.
    assert not matches_nothing("s3://bucket/nothing-here/")


def test_a_glob_that_matches_directories_reads_every_file_under_them_once(
        tmp_path: Path) -> None:
    # One directory per node, as a fleet's logs are gathered: `logs/broker-*`.
    for node in ("broker-1", "broker-2"):
        (tmp_path / node / "old").mkdir(parents=True)
        (tmp_path / node / "access.log").write_text(f'{{"node": "{node}"}}\n')
        (tmp_path / node / "old" / "access.log.1").write_text(f'{{"node": "{node}"}}\n')
    (tmp_path / "notes.txt").write_text("not a node's\n")
    assert not matches_nothing(str(tmp_path / "broker-*"))
    splits, missing = expand([str(tmp_path / "broker-*")])
    assert missing == []
    assert sorted(Path(split.path).relative_to(tmp_path).as_posix() for split in splits) == [
        "broker-1/access.log", "broker-1/old/access.log.1",
        "broker-2/access.log", "broker-2/old/access.log.1"]
    # `**` matches the directories and the files in them: each file once.
    splits, _ = expand([str(tmp_path / "broker-1" / "**")])
    assert sorted(Path(split.path).name for split in splits) == ["access.log", "access.log.1"]


class _Listing:
    """list_objects_v2 as boto3's paginator pages it, over a fixed set of keys."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def get_paginator(self, operation: str) -> _Listing:
        assert operation == "list_objects_v2"
        return self

    def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, object]]:
        return [{"Contents": [{"Key": k} for k in self.keys if k.startswith(Prefix)]}]


def test_a_log_named_by_two_paths_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "b1").mkdir()
    (tmp_path / "b1" / "access.log").write_text("{}\n")
    (tmp_path / "b2.log").write_text("{}\n")
    (tmp_path / "again.log").symlink_to(tmp_path / "b2.log")
    splits, _ = expand([str(tmp_path), str(tmp_path / "b1" / "access.log"),
                        str(tmp_path / "*.log")])
    assert sorted(Path(split.path).resolve().name for split in splits) == \
        ["access.log", "b2.log"]
    # A prefix and a longer one: each object once.
    listing = _Listing(["logs/b1/1.jsonl", "logs/b1/2.jsonl", "logs/b2/1.jsonl"])
    splits, _ = expand(["s3://tiered/logs/", "s3://tiered/logs/b1/"], s3=listing)
    assert [split.name for split in splits] == [
        "s3://tiered/logs/b1/1.jsonl", "s3://tiered/logs/b1/2.jsonl",
        "s3://tiered/logs/b2/1.jsonl"]


def test_a_line_too_long_to_be_a_log_line_is_counted_never_held_whole(
        tmp_path: Path) -> None:
    import tracemalloc

    # A run of NULs where a crash cut the log, between two good lines.
    log = tmp_path / "access.log"
    with log.open("wb") as file:
        file.write(b'{"n": 1}\n' + b"\0" * (24 * MiB) + b'\n{"n": 2}\n' + b"\0" * (3 * MiB))
    splits, _ = expand([str(log)], split_bytes=5 * MiB)
    tracemalloc.start()
    try:
        lines = [line for split in splits for line in read_split(split)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == ['{"n": 1}\n', LONG_LINE, '{"n": 2}\n', LONG_LINE]
    assert LONG_LINE.reason == "line longer than 1048576 bytes"
    assert peak < 4 * MiB, peak  # one line's worth, not the run of NULs
    # Read from a stream in pieces (an object), the lines are the same.
    data = log.read_bytes()
    pieces = [data[at:at + 65536] for at in range(0, len(data), 65536)]
    assert [line if isinstance(line, Malformed) else line.decode()
            for line in split_lines(pieces)] == lines
    # A line of exactly the limit is a line, one byte more is not.
    exact = b"x" * MAX_LINE_BYTES
    assert list(split_lines([exact[:7], exact[7:] + b"\n", exact + b"y"])) == \
        [exact + b"\n", LONG_LINE]


def test_a_gzip_compressed_log_is_named_unreadable_once(tmp_path: Path) -> None:
    import gzip

    lines = "".join(f'{{"n": {n}}}\n' for n in range(20000)).encode()
    (tmp_path / "access.log.2.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "access.log").write_bytes(lines[:100])
    splits, _ = expand([str(tmp_path)], split_bytes=4096)
    read = [line for split in splits for line in read_split(split)]
    unreadable = [line for line in read if isinstance(line, Unreadable)]
    assert unreadable == [Unreadable(str(tmp_path / "access.log.2.gz"), COMPRESSED)]
    assert [line for line in read if not isinstance(line, Unreadable)] == \
        lines[:100].decode().splitlines(keepends=True)
    # An object: the same, from its first piece.
    compressed = gzip.compress(lines)
    assert list(object_lines("s3://logs/b1.gz", [compressed[:10], compressed[10:]])) == \
        [Unreadable("s3://logs/b1.gz", COMPRESSED)]
    assert list(object_lines("s3://logs/b1", [b'{"n": 1}\n{"n"', b': 2}\n'])) == \
        ['{"n": 1}\n', '{"n": 2}\n']


def test_logs_with_no_read_say_what_they_hold_instead() -> None:
    from spark_warmup.capacity.job import no_reads_message

    assert no_reads_message({"unreadable": 1}, [
        {"kind": "unreadable", "reason": f"/logs/a.gz: {COMPRESSED}", "lines": 1}]) == (
        "no object read in the logs (0 other lines, 0 malformed, 1 unreadable); "
        f"unreadable: /logs/a.gz: {COMPRESSED}")
    assert no_reads_message({"malformed": 7, "other": 2}, [
        {"kind": "malformed", "reason": "field 'time' is missing or not str", "lines": 7}]) == (
        "no object read in the logs (2 other lines, 7 malformed, 0 unreadable); "
        "malformed: field 'time' is missing or not str (7 lines)")
    assert no_reads_message({}, []) == \
        "no object read in the logs (0 other lines, 0 malformed, 0 unreadable)"


def test_a_named_pipe_in_a_log_directory_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "access.log").write_text("{}\n")
    os.mkfifo(tmp_path / "to-collector")  # opening it would wait for a writer
    (tmp_path / "old").mkdir()
    splits, missing = expand([str(tmp_path), str(tmp_path / "*")])
    assert [Path(split.path).name for split in splits] == ["access.log"] and missing == []


def test_an_unreadable_split_says_so_instead_of_failing(tmp_path: Path) -> None:
    (gone,) = read_split(Split(str(tmp_path / "gone.log"), 0, 10))
    assert isinstance(gone, Unreadable) and "gone.log" in gone.source


def test_the_replay_counts_the_slot_header_as_the_slab_does() -> None:
    assert REPLAYED_HEADER == SLOT_HEADER_SIZE


def reads_of(passes: list[tuple[float, int]], size: int = 16 * MiB, fetch: int = MiB,
             key: str = KEY) -> list[Read]:
    """Consumers reading `size` bytes front to back from each (time, start)."""
    out = []
    for when, start in passes:
        for number, first in enumerate(range(start, size, fetch)):
            out.append(Read(when + number * 0.01, "tiered", key, '"e"', size, first,
                            min(fetch, size - first), True))
    return out


SETTINGS = Settings(block_size=BLOCK, max_window_bytes=4 * MiB, layout=Layout.PLAIN)


def test_a_reread_within_the_cache_is_all_hits_and_a_cache_too_small_misses() -> None:
    reads = reads_of([(0.0, 0), (100.0, 0)])
    no_read_ahead = replace(SETTINGS, read_ahead=False)
    roomy = replay(no_read_ahead, 32 * (BLOCK + 4096), reads)
    assert roomy.served_bytes == 32 * MiB and roomy.byte_hit_ratio == 0.5
    assert roomy.origin_bytes == 16 * MiB
    tight = replay(no_read_ahead, 8 * (BLOCK + 4096), reads)
    assert tight.byte_hit_ratio == 0.0 and tight.origin_bytes == 32 * MiB


def test_read_ahead_turns_a_sequential_reader_s_misses_into_hits() -> None:
    reads = reads_of([(0.0, 0)])
    ahead = replay(SETTINGS, 32 * (BLOCK + 4096), reads)
    assert ahead.byte_hit_ratio > 0.8 and ahead.origin_prefetch > 0
    assert ahead.origin_bytes == 16 * MiB  # every block once, whichever lane


def test_the_curve_rises_with_the_cache_size() -> None:
    # Without read-ahead: with it, a point can dip (the read-ahead bound is a share
    # of the cache, and S3-FIFO is not a stack algorithm), as the sidecar's would.
    reads = reads_of([(0.0, 0), (50.0, 4 * MiB), (120.0, 0)], size=24 * MiB)
    settings = replace(SETTINGS, read_ahead=False)
    ratios = [replay(settings, blocks * (BLOCK + 4096), reads).byte_hit_ratio
              for blocks in (4, 12, 16, 24, 32)]
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0] + 0.5


def test_sampling_keeps_whole_partitions_and_stays_close() -> None:
    keys = [f"t-AAAAAAAAAAAAAAAAAAAAAA/{p}/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
            for p in range(200)]
    rate = 0.25
    kept = [k for k in keys if unit_hash(f"tiered/{k.rsplit('/', 1)[0]}/") < rate]
    assert 25 < len(kept) < 75
    assert sample_rate(1000, 250) == 0.25 and sample_rate(10, 250) == 1.0


def test_sizes_parse_and_bad_ones_name_the_option() -> None:
    assert parse_sizes("64GiB, 1.5MiB,64GiB,100") == [100, int(1.5 * MiB), 64 * 1024 ** 3]
    for bad in ("12 parsecs", "0", ""):
        with pytest.raises(SizeError, match="--sizes"):
            parse_sizes(bad)
    for huge in ("9" * 400 + "GiB", "9000000TiB", "9" * 20):
        with pytest.raises(SizeError, match=r"^--sizes: '[09.]+(GiB|TiB)?' is too large \(at "):
            parse_sizes(huge)
    assert default_sizes(64 * MiB, MiB, 3 * MiB)[:2] == [MiB, 2 * MiB]
    assert 3 * MiB in default_sizes(64 * MiB, MiB, 3 * MiB)


def test_the_recommendation_is_the_smallest_size_reaching_the_target() -> None:
    curve = [Point(100, 0.5, 0.5), Point(200, 0.9, 0.1), Point(400, 0.995, 0.01)]
    assert recommend(curve, 0.5) == 100
    assert recommend(curve, 0.99) == 200 + int(0.09 / 0.095 * 200)
    assert recommend(curve, 0.999) is None


def test_the_page_draws_what_it_is_given() -> None:
    summary = {
        "target_hit_ratio": 0.99, "lines": {"reads": 3, "malformed": 1, "unreadable": 0},
        "nodes": {"b<1>": {"requests": 3, "served_bytes": 10, "byte_hit_ratio": 0.5,
                           "origin_bytes": 5, "current_cache_bytes": 100,
                           "recommended_cache_bytes": None,
                           "best_predicted_byte_hit_ratio": 0.9,
                           "curve": [{"cache_bytes": 100, "byte_hit_ratio": 0.5,
                                      "origin_bytes_per_served_byte": 0.5},
                                     {"cache_bytes": 200, "byte_hit_ratio": 0.9,
                                      "origin_bytes_per_served_byte": 0.1}]}},
        "topics": {"orders": {"served_bytes": 10, "byte_hit_ratio": 0.5, "origin_bytes": 5}},
        "problems": [{"kind": "malformed", "reason": "not JSON", "lines": 1}],
    }
    page = render_html(summary, [{"node": "b<1>", "window_start": 0, "served_bytes": 10,
                                  "hit_bytes": 5}],
                       [{"topic": "orders", "served_bytes": 10, "hit_bytes": 5}], 60)
    # One quantity a chart: the hit ratio (0-1) apart from origin bytes per served byte.
    assert 'data-chart="curve:b&lt;1&gt;" data-points="2"' in page
    assert 'data-chart="origin:b&lt;1&gt;" data-points="4"' in page
    assert page.count('class="swatch"') == 4  # a legend of swatches under every line chart
    assert 'data-chart="top-missing-topics" data-points="1"' in page
    assert "<script" not in page and "b<1>" not in page  # escaped, nothing to run


def test_time_ticks_fall_on_round_steps_each_label_once() -> None:
    start = 1_790_000_003.0  # 14:13:23
    ticks = time_ticks(start, start + 170)
    assert 2 <= len(ticks) <= 8
    assert all(t % 30 == 0 for t, _ in ticks), ticks
    labels = [label for _, label in ticks]
    assert len(set(labels)) == len(labels) and labels[0] == "14:13:30"
    day = time_ticks(start, start + 3 * 86400)
    assert len({label for _, label in day}) == len(day) <= 8


def test_size_ticks_are_powers_of_two_within_the_curve() -> None:
    ticks = size_ticks(3 * MiB, 700 * MiB)
    assert [label for _, label in ticks][:2] == ["4 MiB", "8 MiB"]
    assert all(3 * MiB <= t <= 700 * MiB for t, _ in ticks) and len(ticks) <= 8


def test_an_unreached_target_names_the_first_read_bound_and_the_best_size() -> None:
    facts = {"recommended_cache_bytes": None, "hit_ratio_bound": 0.9712,
             "best_predicted_byte_hit_ratio": 0.9705, "best_predicted_cache_bytes": 12 * MiB}
    note = unreached_note("b1", facts, 0.99)
    assert note is not None
    assert "First reads bound the byte hit ratio at 97.12%" in note
    assert "97.05%, is reached at 12 MiB" in note
    assert unreached_note("b1", {**facts, "recommended_cache_bytes": MiB}, 0.99) is None
    curve = [Point(100, 0.5, 0.5), Point(200, 0.9702, 0.1), Point(400, 0.9705, 0.1)]
    assert best_size(curve) == curve[1]  # within SAME_RATIO of the best: the smaller size


def test_a_nodes_line_gives_the_size_for_the_target_or_why_none_reaches_it() -> None:
    facts = {"requests": 28, "byte_hit_ratio": 0.935289, "origin_bytes": 1,
             "recommended_cache_bytes": None, "hit_ratio_bound": 0.9353,
             "best_predicted_byte_hit_ratio": 0.9352, "best_predicted_cache_bytes": 256 * MiB}
    assert finding_line("demo", facts, 0.99) == (
        "demo: 28 requests, byte hit ratio 93.53%; 99.00% is not reached at any size tried "
        "(first reads bound it at 93.53%; the best, 93.52%, at 256 MiB)")
    assert finding_line("demo", {**facts, "recommended_cache_bytes": 128 * MiB}, 0.9) == (
        "demo: 28 requests, byte hit ratio 93.53%; for 90.00%: 128 MiB (134217728 bytes)")
    assert finding_line("demo", {**facts, "requests": 0}, 0.9) == (
        "demo: no object reads, only background fetches (1 origin bytes); no curve")


def test_read_ahead_lands_when_its_fetch_completes_and_readers_join_it_meanwhile() -> None:
    reads = reads_of([(0.0, 0)], size=8 * MiB)
    simulation = Replay(SETTINGS, 64 * (BLOCK + 4096), keys=[
        (r.bucket, r.key, r.etag, r.object_size) for r in reads], fetch_s=1.0)
    for read in reads[:3]:  # a stream by then: read-ahead goes out
        simulation.read(read)
    ahead = set(simulation._reading_ahead)
    assert ahead and all(ident in simulation._writing for ident in ahead)
    simulation.advance(reads[2].time_s + 0.5)
    assert ahead <= set(simulation._writing)  # not yet: a second after it went out
    simulation.advance(reads[2].time_s + 1.0)
    assert all(ident in simulation._slot_of for ident in ahead)
    # Landing later costs no hit: a reader that comes first joins the fetch.
    late = replay(SETTINGS, 64 * (BLOCK + 4096), reads, fetch_s=0.5)
    early = replay(SETTINGS, 64 * (BLOCK + 4096), reads, fetch_s=0.0)
    assert late.hit_bytes == early.hit_bytes and late.origin_bytes == early.origin_bytes


def test_fetch_times_are_the_mean_of_the_fetches_started_in_each_bin() -> None:
    times = FetchTimes.of([(10.02, 0.3), (10.07, 0.5), (10.31, 0.1)], bin_s=0.1)
    assert times.at(10.05) == pytest.approx(0.4)  # the two started in [10.0, 10.1)
    assert times.at(10.35) == pytest.approx(0.1)
    assert FetchTimes.of([]).at(5.0) == 0.0  # a log without FETCH lines: at once


def test_a_fetch_started_between_the_log_s_lands_between_their_landings() -> None:
    """A moment with no fetch of its own: between the bins before and after it,
    by how far it is from each (the origin's workers take read-ahead first come
    first served); before the first fetch and after the last, the nearest's."""
    times = FetchTimes.of([(10.02, 0.4), (10.31, 0.1)], bin_s=0.1)
    assert times.at(10.15) == pytest.approx(0.3)  # a third of the way from 0.4 to 0.1
    assert times.at(10.25) == pytest.approx(0.2)
    assert times.at(9.5) == pytest.approx(0.4)
    assert times.at(11.0) == pytest.approx(0.1)
    # A busy origin: fetches started at 0 took 4 s, the next started at 3 s and
    # took 1 s; one started at 1.5 s lands about when they do, not after the
    # mean of the log (2.5 s).
    busy = FetchTimes.of([(0.0, 4.0), (3.0, 1.0)], bin_s=0.1)
    assert busy.mean_s == pytest.approx(2.5)
    assert 1.5 + busy.at(1.5) == pytest.approx(4.0, abs=0.1)


def test_fetch_times_from_the_spark_job_s_bin_sums_are_those_of_the_fetches() -> None:
    fetches = [(10.02, 0.3), (10.07, 0.5), (10.31, 0.1)]
    # The job aggregates (sum, count) per bin; a bin of no fetch (null durations) is left out.
    sums = {time_bin(10.02, 0.1): (0.8, 2), time_bin(10.31, 0.1): (0.1, 1),
            time_bin(10.5, 0.1): (0.0, 0)}
    assert FetchTimes.of_bins(sums, bin_s=0.1) == FetchTimes.of(fetches, bin_s=0.1)


def test_read_ahead_lands_as_late_as_the_log_s_fetches_took_when_it_went_out() -> None:
    """The origin is slower while it is busy: a read-ahead fetch lands as long
    after it starts as the log's fetches started about then took, not after
    the mean of the whole log."""
    reads = reads_of([(0.0, 0)], size=8 * MiB)
    keys = [(r.bucket, r.key, r.etag, r.object_size) for r in reads]
    issued = reads[2].time_s

    def in_flight_after(landing: FetchTimes) -> tuple[set[BlockIdent], Replay]:
        simulation = Replay(SETTINGS, 64 * (BLOCK + 4096), keys=keys, fetch_s=landing)
        for read in reads[:3]:
            simulation.read(read)
        ahead = set(simulation._reading_ahead)
        assert ahead
        simulation.advance(issued + 0.5)
        return ahead, simulation

    busy = FetchTimes(0.1, {time_bin(issued): 1.0})
    ahead, simulation = in_flight_after(busy)
    assert ahead <= set(simulation._writing)  # the busy moment's second is not over
    simulation.advance(issued + 1.0)
    assert all(ident in simulation._slot_of for ident in ahead)
    ahead, simulation = in_flight_after(FetchTimes(1.0, {time_bin(issued): 0.1}))
    assert all(ident in simulation._slot_of for ident in ahead)  # a quiet moment: landed


def test_the_origin_s_load_is_the_mean_of_blocks_on_their_way_at_each_fetch_s_start() -> None:
    tally = LoadTally(bin_s=0.1)
    # Each count answers the mean of its bin so far, its own included.
    assert [tally.add(when, on_their_way)
            for when, on_their_way in ((10.02, 2), (10.07, 6), (10.31, 1))] == [2.0, 4.0, 1.0]
    load = tally.load()
    assert load.by_bin == {time_bin(10.02, 0.1): 4.0, time_bin(10.31, 0.1): 1.0}
    # As many on their way as the log's own size had: the log's time.
    assert load.scaled(0.3, 10.05, 4, 4.0) == pytest.approx(0.3)
    # A moment the replay at the log's own size started no fetch: as logged.
    assert load.scaled(0.3, 10.2, 16, 16.0) == 0.3
    assert OriginLoad().scaled(0.3, 10.05, 16, 16.0) == 0.3


def test_a_replay_s_own_load_keeps_only_its_recent_moments() -> None:
    """A day's log has hundreds of thousands of moments: a replay keeps the
    last keep_s seconds of its own, and each moment's mean is as a full
    tally's."""
    recent, full = LoadTally(bin_s=0.1, keep_s=1.0), LoadTally(bin_s=0.1)
    for step in range(10_000):
        when = step * 0.05
        assert recent.add(when, step % 7) == full.add(when, step % 7)
        assert len(recent) <= 11
    # A slot's wait counted late, within what is kept: its moment goes on.
    assert recent.add(9_999 * 0.05 - 0.5, 3) == full.add(9_999 * 0.05 - 0.5, 3)
    assert len(full) == 5_000


def test_a_fetch_s_time_follows_its_moment_s_load_more_than_its_size_s() -> None:
    """Against the fetches started in the same bin, a fetch with more blocks
    on their way takes longer (MOMENT_EXPONENT); a bin four times as busy as
    at the log's own size, by less (SIZE_EXPONENT): the readers the replay
    keeps at the log's pace speed up and slow down with the origin too."""
    load = OriginLoad({time_bin(10.02, 0.1): 4.0}, bin_s=0.1)
    # The whole bin four times as busy, this fetch as busy as the bin.
    assert load.scaled(0.3, 10.05, 16, 16.0) == pytest.approx(0.3 * 4 ** SIZE_EXPONENT)
    assert load.scaled(0.3, 10.05, 1, 1.0) == pytest.approx(0.3 * 0.25 ** SIZE_EXPONENT)
    # The bin as busy as the log's, this fetch four times the bin's mean.
    assert load.scaled(0.3, 10.05, 16, 4.0) == pytest.approx(0.3 * 4 ** MOMENT_EXPONENT)
    assert 0 < SIZE_EXPONENT < MOMENT_EXPONENT <= 1
    assert 0.3 < load.scaled(0.3, 10.05, 16, 16.0) < load.scaled(0.3, 10.05, 16, 4.0) < 1.2


def test_read_ahead_lands_sooner_where_fewer_blocks_are_on_their_way_than_in_the_log() -> None:
    """A log written while the origin answered many fetches at once (another
    group missing beside this reader) predicts a size where this reader's
    read-ahead is all the origin does: its fetches land sooner than the log's."""
    reads = reads_of([(0.0, 0)], size=8 * MiB)
    keys = [(r.bucket, r.key, r.etag, r.object_size) for r in reads]
    issued = reads[2].time_s

    def in_flight_after(load: OriginLoad | None) -> tuple[set[BlockIdent], Replay]:
        simulation = Replay(SETTINGS, 64 * (BLOCK + 4096), keys=keys, fetch_s=1.0, load=load)
        for read in reads[:3]:
            simulation.read(read)
        ahead = set(simulation._reading_ahead)
        assert ahead and len(simulation._writing) < 16
        simulation.advance(issued + 0.8)
        return ahead, simulation

    ahead, simulation = in_flight_after(None)
    assert ahead <= set(simulation._writing)  # the log's second is not over
    busy_log = OriginLoad({time_bin(issued): 256.0})
    ahead, simulation = in_flight_after(busy_log)
    assert all(ident in simulation._slot_of for ident in ahead)  # landed
    # And where the log had as few on their way, as the log's fetches took.
    ahead, simulation = in_flight_after(OriginLoad({time_bin(issued): 1.0}))
    assert ahead <= set(simulation._writing)


def test_readers_at_the_same_time_share_one_fetch() -> None:
    """Two readers of one block, the second arriving while the first one's fetch
    is on its way (the log's time is each answer's end, duration_s before it
    the arrival): one origin read, the second reader's bytes a hit."""
    first = Read(1.0, "tiered", KEY, '"e"', 4 * MiB, 0, MiB, False, duration_s=1.0)
    second = Read(0.8, "tiered", KEY, '"e"', 4 * MiB, 0, MiB, False, duration_s=0.3)
    outcome = replay(replace(SETTINGS, read_ahead=False), 8 * (BLOCK + 4096), [second, first])
    assert (outcome.origin_bytes, outcome.hit_bytes, outcome.served_bytes) == \
        (MiB, MiB, 2 * MiB)


def test_the_trust_line_is_the_nearest_cell_of_the_benchmark(tmp_path: Path) -> None:
    table = tmp_path / "accuracy.json"
    table.write_text(json.dumps({"cells": [
        {"streams": 1, "pattern": "one-group", "share": 0.1, "hit_error": 0.01,
         "origin_error": -0.02},
        {"streams": 16, "pattern": "groups", "share": 0.25, "hit_error": -0.015,
         "origin_error": 0.08},
        {"streams": 48, "pattern": "lagging", "share": 1.0, "hit_error": 0.0,
         "origin_error": 0.0}]}))
    cells = load_cells(table)
    cell = nearest(cells, streams=12, share=0.3)
    assert cell is not None and (cell["streams"], cell["share"]) == (16, 0.25)
    assert "-1.5 points of byte hit ratio and +8.0% of origin bytes" in trust_text(cell)
    assert load_cells(tmp_path / "missing.json") == [] and nearest([], 4, 0.5) is None
    measured_twice = {**cell, "measured_hit_spread": 0.045, "predicted_hit_spread": 0.03}
    assert "runs of that cell differed by up to 4.5 points, the curves of their logs by 3.0" \
        in trust_text(measured_twice)


def test_warmed_blocks_stay_until_read_within_their_share() -> None:
    """A warm-up's fetch (a FETCH line on the warm lane) is replayed as one: its
    blocks are kept from eviction until read, as the store protects them, so a
    scan between the warm-up and the replay does not push them out."""
    other = "orders-AAAAAAAAAAAAAAAAAAAAAA/1/00000000000000000000-CCCCCCCCCCCCCCCCCCCCCC.log"
    warm = Read(0.5, "tiered", KEY, '"e"', 4 * MiB, 0, 4 * MiB, False, 0.5, warm=True)
    scan = reads_of([(1.0, 0)], size=16 * MiB, key=other)
    replayed = reads_of([(10.0, 0)], size=4 * MiB)
    settings = replace(SETTINGS, read_ahead=False)
    kept = replay(settings, 10 * (BLOCK + 4096), [warm, *scan, *replayed])
    assert kept.origin_warm == 4 * MiB
    assert kept.hit_bytes == 4 * MiB  # the replayed blocks, all of them
    unprotected = replay(replace(settings, protected_share=0.0), 10 * (BLOCK + 4096),
                         [warm, *scan, *replayed])
    assert unprotected.hit_bytes < 4 * MiB
    assert kept.origin_bytes == 4 * MiB + 16 * MiB  # the warm-up's and the scan's


def test_a_warm_fetch_line_parses_into_what_the_replay_warms() -> None:
    info = ObjectInfo("tiered", KEY, 8 * MiB + 5, '"e"', datetime(2026, 9, 1, tzinfo=UTC))
    line = format_entry(fetch_entry(
        now=1_790_000_001.0, node=NodeFacts("b1", BLOCK, 64 * MiB),
        done=FetchDone(WARM, info, 7, 8, MiB + 5, 0.02, ok=True)))
    fetch = parse_line(line)
    assert isinstance(fetch, Fetch)
    assert (fetch.first_byte, fetch.length, fetch.etag, fetch.object_size) == \
        (7 * MiB, MiB + 5, '"e"', 8 * MiB + 5)


def test_a_reader_s_fetches_straddling_blocks_are_not_reuse() -> None:
    """Fetches of 2.5 blocks end inside a block the next one starts in: read
    twice by the same reader, which is no reuse (the engine looks it up
    without a touch), so the scan stays in S3-FIFO's probation."""
    reads = reads_of([(0.0, 0)], size=32 * MiB, fetch=5 * MiB // 2)
    simulation = Replay(SETTINGS, 16 * (BLOCK + 4096), keys=[
        (r.bucket, r.key, r.etag, r.object_size) for r in reads])
    simulation.run(reads)
    assert simulation.policy.queue("main") == []
    # Without a stream (no read-ahead) the same reads count as hits for eviction.
    plain = Replay(replace(SETTINGS, read_ahead=False), 16 * (BLOCK + 4096), keys=[
        (r.bucket, r.key, r.etag, r.object_size) for r in reads])
    plain.run(reads)
    assert plain.policy.queue("main") != []


def test_a_read_resuming_its_stream_s_block_goes_on_to_the_next_one_at_once() -> None:
    """A consumer's next fetch starts in the block its last one ended in, whose
    bytes are in hand or on their way: the sidecar goes on to the next block at
    once, so the read's duration is shared over its other blocks. A first read
    shares it over all of them."""
    first, then = (Read(1.0 + number, "tiered", KEY, '"e"', 8 * MiB, start, 5 * MiB // 2,
                        False, duration_s=0.3) for number, start in enumerate((0, 5 * MiB // 2)))
    simulation = Replay(SETTINGS, 64 * (BLOCK + 4096), keys=[(first.bucket, KEY, '"e"', 8 * MiB)])
    reached = list(simulation.steps(first))  # blocks 0, 1, 2: reached, then out, each
    assert reached == pytest.approx([0.7, 0.8, 0.8, 0.9, 0.9, 1.0])
    reached = list(simulation.steps(then))  # blocks 2 (resumed), 3, 4
    assert reached == pytest.approx([1.7, 1.7, 1.7, 1.85, 1.85, 2.0])


def test_a_block_a_read_ends_inside_lands_after_the_read_and_its_next_read_joins_it() -> None:
    """The engine streams a fetched block's chunks as they land and the answer
    ends before the block does: the rest is still on its way (a write, no
    victim) when the reader's next fetch starts in it."""
    settings = replace(SETTINGS, read_ahead=False)
    first = Read(1.0, "tiered", KEY, '"e"', 4 * MiB, 0, 3 * MiB // 2, False, duration_s=0.1)
    then = Read(1.2, "tiered", KEY, '"e"', 4 * MiB, 3 * MiB // 2, MiB // 2, False,
                duration_s=0.1)
    simulation = Replay(settings, 8 * (BLOCK + 4096), keys=[(first.bucket, KEY, '"e"', 4 * MiB)],
                        fetch_s=0.5)
    simulation.read(first)
    rest = next(ident for ident in simulation._writing if ident.block == 1)
    assert rest not in simulation._slot_of  # on its way, not yet a victim
    simulation.read(then)
    outcome = simulation.outcome()
    assert (outcome.origin_bytes, outcome.hit_bytes) == (2 * MiB, MiB // 2)
    assert rest in simulation._slot_of


def test_a_reader_that_joined_read_ahead_on_its_way_pins_it_once_it_lands() -> None:
    """The engine's reader of a block on its way pins its slot until done with
    it (RangeServer._attach), through its landing: a fetch that needs a victim
    meanwhile does not take the block from under the reader."""
    reads = reads_of([(0.0, 0)], size=8 * MiB)
    simulation = Replay(SETTINGS, 64 * (BLOCK + 4096), keys=[
        (r.bucket, r.key, r.etag, r.object_size) for r in reads], fetch_s=1.0)
    for read in reads[:3]:  # a stream by then: read-ahead goes out
        simulation.read(read)
    ahead = min(simulation._reading_ahead, key=lambda ident: ident.block)
    arrival = reads[2].time_s + 0.1
    slow = Read(arrival + 3.0, "tiered", KEY, '"e"', 8 * MiB, ahead.block * BLOCK, BLOCK,
                True, duration_s=3.0)
    hits = simulation.hit_bytes
    steps = simulation.steps(slow)
    simulation.advance(next(steps))  # the reader comes to the block
    done = next(steps)  # joined on its way: a hit, its bytes out by `done`
    assert ahead in simulation._writing and ahead not in simulation._slot_of
    simulation.advance(arrival + 1.5)  # the read-ahead lands, the reader still on it
    slot = simulation._slot_of[ahead]
    assert simulation._pinned(slot)
    simulation.advance(done)
    for when in steps:  # the read's end: the reader lets go of the block
        simulation.advance(when)
    assert not simulation._pinned(slot)
    assert simulation.hit_bytes - hits == BLOCK


def test_read_ahead_that_lands_before_its_reader_is_held_for_it_a_fetch_s_time() -> None:
    """The sidecar's readers, paced by the read-ahead they wait for, have joined
    it by the time it lands; the log's readers keep the log's pace. A block
    that lands unread is no victim for a fetch's time, and its reader's read
    lets go of it."""
    reads = reads_of([(0.0, 0)], size=8 * MiB)
    simulation = Replay(SETTINGS, 64 * (BLOCK + 4096), keys=[
        (r.bucket, r.key, r.etag, r.object_size) for r in reads], fetch_s=1.0)
    for read in reads[:3]:  # a stream by then: read-ahead goes out
        simulation.read(read)
    first, second = sorted(simulation._reading_ahead, key=lambda ident: ident.block)[:2]
    due = {ident: when for when, _, ident in simulation._due}
    landed = max(due[first], due[second])
    simulation.advance(landed)
    held = [simulation._slot_of[first], simulation._slot_of[second]]
    assert all(simulation._pinned(slot) for slot in held)
    simulation.read(Read(landed + 0.5, "tiered", KEY, '"e"', 8 * MiB, first.block * BLOCK,
                         BLOCK, True))
    assert not simulation._pinned(held[0])  # read: no longer waiting for its reader
    assert simulation._pinned(held[1])
    simulation.advance(due[second] + 1.0 + 1e-6)  # a fetch's time since it landed
    assert not simulation._pinned(held[1])


def test_a_report_spark_could_not_write_is_said_in_one_short_line(tmp_path: Path) -> None:
    from spark_warmup.capacity.job import _why, spark_reason

    # What py4j prints of a Java exception: its message, then its stack trace.
    printed = ("org.apache.spark.SparkException: Job aborted: java.io.IOException: "
               "No space left on device" + "x" * 400 + "\n\tat org.apache.Foo(Foo.java:1)")
    reason = spark_reason(printed)
    assert reason.startswith("Spark: org.apache.spark.SparkException: Job aborted: "
                             "java.io.IOException: No space left on device")
    assert "\n" not in reason and len(reason) < 320
    assert spark_reason("") == "Spark: failed"
    assert _why(IsADirectoryError(21, "Is a directory", str(tmp_path / "summary.json")),
                tmp_path) == f"{tmp_path / 'summary.json'}: Is a directory"


@pytest.mark.parametrize(("size", "text"), [
    (1000 * 1024 ** 3, "1000 GiB"), (1020 * 1024 ** 2, "1020 MiB"),
    (int(999.7 * 1024 ** 3), "1000 GiB"), (2000 * 1024 ** 4, "2000 TiB"),
    (int(1.5 * 1024 ** 3), "1.5 GiB"), (int(999.4 * 1024 ** 3), "999 GiB"), (1000, "1000 B"),
])
def test_sizes_are_written_without_an_exponent(size: int, text: str) -> None:
    assert size_text(size) == text


def test_a_point_written_as_reaching_the_target_is_recommended() -> None:
    """summary.json writes ratios to six places: the recommendation is read off
    the same figures, not off the unrounded ones behind them."""
    from spark_warmup.capacity.job import Options, _summary

    row = {"requests": 10, "served_bytes": 100, "hit_bytes": 50, "hit_blocks": 1,
           "blocks": 2, "origin_bytes": 50, "origin_foreground_bytes": 50,
           "origin_prefetch_bytes": 0, "origin_warm_bytes": 0, "current_cache_bytes": None,
           "block_size": BLOCK}
    curve = [Point(100 * BLOCK, 0.5, 0.5), Point(200 * BLOCK, 0.98999996, 0.01)]
    summary = _summary(Options(logs=[], report_dir=Path("r"), target_hit_ratio=0.99),
                       {"b1": row}, [], {"b1": curve}, [], {"read": 10}, [], 60)
    node = summary["nodes"]["b1"]
    assert [p["byte_hit_ratio"] for p in node["curve"]] == [0.5, 0.99]
    assert node["recommended_cache_bytes"] == 200 * BLOCK
    assert node["best_predicted_byte_hit_ratio"] == 0.99


def test_of_the_patterns_measured_as_near_the_trust_line_quotes_the_worst() -> None:
    """The grid measures three access patterns at each (streams, share): all as
    near any node, whose pattern the log does not say."""
    cells = [{"streams": 4, "pattern": pattern, "share": 0.25, "hit_error": error,
              "origin_error": 0.0}
             for pattern, error in (("one-group", 0.0), ("groups", -0.04), ("lagging", 0.01))]
    cells.append({"streams": 48, "pattern": "groups", "share": 1.0, "hit_error": 0.2,
                  "origin_error": 0.0})
    cell = nearest(cells, streams=4, share=0.25)
    assert cell is not None and (cell["pattern"], cell["hit_error"]) == ("groups", -0.04)
    text = trust_text(cell)
    assert "groups, the worst of the patterns measured there (groups, lagging, one-group)" \
        in text
    assert "-4.0 points of byte hit ratio" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--target-hit-ratio", "abc"], "argument --target-hit-ratio: invalid float value: 'abc'"),
    (["--max-trace", "1e6"], "argument --max-trace: invalid int value: '1e6'"),
    (["--report", "r"], "the following arguments are required: --logs"),
])
def test_a_bad_flag_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    from spark_warmup.capacity.__main__ import parse_args

    with pytest.raises(SystemExit) as exited:
        parse_args(["--logs", "x", "--report", "r", *args] if args[0] != "--report" else args)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"spark_warmup.capacity: error: {message}\n"
