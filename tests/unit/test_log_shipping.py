"""Shipping rotated access logs: where each file goes, which configurations can
ship, and the shipper's queue (order, bound, retries, the drain at stop), with a
recording upload in place of the origin (the functional tests use moto's S3)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.config import S3Location, load_config
from sidecar.config.parsing import parse_s3_location
from sidecar.errors import ConfigError, OriginUnavailable
from sidecar.telemetry.access_log import RotatingFile
from sidecar.telemetry.log_shipping import LogShipper, object_key
from tests.support.waiting import eventually_async

LOGS = S3Location("kafka-logs", "fleet/access/")


def test_an_object_per_rotated_file_under_the_nodes_folder_sorting_by_time() -> None:
    early = object_key(LOGS, "broker-1", 1_795_795_200.5)
    assert early == "fleet/access/broker-1/20261127T160000.500000Z.jsonl"
    later = object_key(LOGS, "broker-1", 1_795_795_200.500001)
    assert early < later
    assert object_key(S3Location("b", ""), "pod/x", 0.0).startswith("pod%2Fx/19700101T")


def test_each_node_name_has_a_folder_of_its_own() -> None:
    """Names that a folder of one segment must change are escaped, never
    collapsed: a/b, a_b, a%2Fb and a%b ship to four folders."""
    names = ["a/b", "a_b", "a%2Fb", "a%b", "a%252Fb", "a//b"]
    folders = [object_key(LOGS, name, 0.0).split("/")[-2] for name in names]
    assert len(set(folders)) == len(names)
    assert all(object_key(LOGS, name, 0.0).count("/") == LOGS.prefix.count("/") + 1
               for name in names)


@pytest.mark.parametrize(("text", "location"), [
    ("s3://kafka-logs/fleet/access/", LOGS), ("s3://kafka-logs/fleet/access", LOGS),
    ("s3://kafka-logs", S3Location("kafka-logs", "")), ("s3://kafka-logs/", S3Location(
        "kafka-logs", "")), ("", None),
])
def test_the_location_is_a_bucket_and_a_folder(text: str, location: S3Location | None) -> None:
    assert parse_s3_location(text) == location


@pytest.mark.parametrize("text", ["kafka-logs/x", "s3://", "s3://Kafka!Logs/x", "http://b/x",
                                  "s3://-b/x"])
def test_a_location_that_is_not_one_says_what_is_expected(text: str) -> None:
    with pytest.raises(ConfigError, match=r"s3://BUCKET/PREFIX.*e\.g\. s3://"):
        parse_s3_location(text)


@pytest.mark.parametrize("log", [
    {}, {"access_log": "-"},
    {"access_log": "/var/log/a.jsonl", "access_log_backups": 0},
    {"access_log": "/var/log/a.jsonl", "access_log_max_size": 0},
])
def test_only_a_log_that_rotates_into_files_can_be_shipped(log: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="access_log_upload ships rotated access log files"):
        load_config({"cache_dir": "/x"}, {}, {**log, "access_log_upload": "s3://kafka-logs/p"})
    config = load_config({"cache_dir": "/x"}, {}, {
        "access_log": "/var/log/a.jsonl", "access_log_upload": "s3://kafka-logs/p"})
    assert config.server.access_log_upload == S3Location("kafka-logs", "p/")


# --- the shipper ----------------------------------------------------------------


class Origin:
    """Takes uploads as Origin.upload does, or refuses them while `refusing`."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.refusing = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def upload(self, bucket: str, key: str, parts: AsyncIterator[bytes],
                     content_type: str) -> int:
        assert (bucket, content_type) == ("kafka-logs", "application/x-ndjson")
        await self.gate.wait()
        body = b"".join([part async for part in parts])
        if self.refusing:
            self.refusing -= 1
            raise OriginUnavailable("the origin is failing")
        self.objects[key] = body
        return len(body)


@pytest.fixture()
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


def log_for(shipper: LogShipper, directory: Path, backups: int,
            executor: ThreadPoolExecutor) -> RotatingFile:
    """An access log in `directory` that hands each rotated file to `shipper`
    from a thread, as the log's writer thread does."""
    return RotatingFile(str(directory / "access.jsonl"), 0, backups,
                        lambda path: executor.submit(shipper.rotated, path).result())


def rotate(log: RotatingFile, text: str) -> None:
    """One file's worth of lines, then the rotation that hands it over."""
    log.write([text.encode()])
    log.rotate_out()


async def test_files_go_up_in_order_even_after_the_name_was_rotated_away(
    tmp_path: Path, executor: ThreadPoolExecutor,
) -> None:
    origin, outcomes = Origin(), []
    clock = iter(float(n) for n in range(100))
    shipper = LogShipper(LOGS, "broker-1", origin.upload, executor, outcomes.append, 4,
                         clock=lambda: next(clock))
    shipper.start()
    origin.gate.clear()  # nothing goes up until every rotation is done
    log = log_for(shipper, tmp_path, 1, executor)
    for n in range(3):
        rotate(log, f"file {n}\n")  # one backup: file 0 and 1 are gone from disk
    assert sorted(os.listdir(tmp_path)) == ["access.jsonl", "access.jsonl.1"]
    origin.gate.set()
    await eventually_async(lambda: len(origin.objects) == 3, "three uploads")
    assert [origin.objects[key] for key in sorted(origin.objects)] == [
        b"file 0\n", b"file 1\n", b"file 2\n"]
    assert outcomes == ["ok"] * 3
    await shipper.stop()
    log.close()


async def test_past_the_bound_the_oldest_waiting_file_is_given_up_and_counted(
    tmp_path: Path, executor: ThreadPoolExecutor,
) -> None:
    origin, outcomes = Origin(), []
    shipper = LogShipper(LOGS, "broker-1", origin.upload, executor, outcomes.append, 2)
    shipper.start()
    origin.gate.clear()
    log = log_for(shipper, tmp_path, 8, executor)
    rotate(log, "in flight\n")
    await asyncio.sleep(0)  # the shipper takes it, and waits at the gate
    for text in ("oldest waiting\n", "second\n", "third\n"):
        rotate(log, text)
    await eventually_async(lambda: outcomes == ["dropped"], "the oldest waiting given up")
    origin.gate.set()
    await eventually_async(lambda: len(origin.objects) == 3, "the rest uploaded")
    assert sorted(origin.objects.values()) == sorted([b"in flight\n", b"second\n", b"third\n"])
    await shipper.stop()
    log.close()


async def test_a_refused_upload_is_tried_again_and_what_waits_goes_at_stop(
    tmp_path: Path, executor: ThreadPoolExecutor,
) -> None:
    origin, outcomes = Origin(), []
    origin.refusing = 2
    shipper = LogShipper(LOGS, "broker-1", origin.upload, executor, outcomes.append, 4,
                         retry_s=(0.01, 0.02))
    shipper.start()
    log = log_for(shipper, tmp_path, 4, executor)
    rotate(log, "a\n")
    rotate(log, "b\n")
    await shipper.stop(drain_s=5)
    log.close()
    assert sorted(origin.objects.values()) == [b"a\n", b"b\n"]
    assert outcomes == ["failed", "failed", "ok", "ok"]


async def test_stop_gives_up_after_its_drain_and_leaves_the_files_on_disk(
    tmp_path: Path, executor: ThreadPoolExecutor,
) -> None:
    origin, outcomes = Origin(), []
    origin.gate.clear()  # an origin that never answers
    shipper = LogShipper(LOGS, "broker-1", origin.upload, executor, outcomes.append, 4)
    shipper.start()
    log = log_for(shipper, tmp_path, 4, executor)
    rotate(log, "a\n")
    await shipper.stop(drain_s=0.05)
    log.close()
    assert origin.objects == {} and outcomes == []
    assert (tmp_path / "access.jsonl.1").read_text() == "a\n"


async def test_stop_counts_the_file_whose_upload_it_gave_up_on(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture,
) -> None:
    origin, outcomes = Origin(), list[str]()
    origin.refusing = 1_000_000  # refuses through the stop: the file stays in its retries
    shipper = LogShipper(LOGS, "broker-1", origin.upload, executor, outcomes.append, 4,
                         retry_s=(0.01, 0.02))
    shipper.start()
    log = log_for(shipper, tmp_path, 4, executor)
    rotate(log, "a\n")
    rotate(log, "b\n")
    await eventually_async(lambda: "failed" in outcomes, "an upload refused")
    await shipper.stop(drain_s=0.05)
    log.close()
    assert origin.objects == {}
    assert "2 rotated files not shipped at stop" in caplog.text
