"""Read-ahead through a real sidecar process on moto, watched through the recording proxy."""

from __future__ import annotations

import http.client
import random
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sidecar.tools.kafka_segments import BatchScanner, generate_topic_segments
from tests.functional.conftest import PREFETCH_BLOCK as BLOCK
from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy

FETCH = BLOCK // 8  # as the broker's 1 MiB fetch is to an 8 MiB block


def broker_fetch(url: str, bucket: str, key: str, position: int, fetch: int) -> bytes:
    """`Range: bytes=position-`, read about one fetch, drop the connection."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("GET", f"/{bucket}/{key}", headers={"Range": f"bytes={position}-"})
        response = connection.getresponse()
        assert response.status == 206, response.read()
        return response.read(fetch)
    finally:
        connection.close()




def put_partition(
    origin_s3: Any, bucket: str, segments: int, segment_bytes: int
) -> list[tuple[str, bytes]]:
    objects = []
    for segment in generate_topic_segments(
        topic="orders", partitions=1, segments_per_partition=segments,
        segment_bytes=segment_bytes, value_size=1024, seed=3, records_per_batch=8,
    ):
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
        objects.append((segment.key, segment.data))
    return objects


def read_like_a_broker(url: str, bucket: str, key: str, data: bytes) -> None:
    position = 0
    while position < len(data):
        chunk = broker_fetch(url, bucket, key, position, FETCH)
        assert chunk == data[position:position + len(chunk)]
        scanner = BatchScanner()
        scanner.feed(chunk)  # whole batches only; the partial tail is read again
        consumed = len(chunk) - scanner.pending_bytes
        position += consumed if consumed else len(chunk)


def test_sequential_replay_hits_after_first_block_and_crosses_segments(
    prefetching_sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    objects = put_partition(origin_s3, bucket, segments=3, segment_bytes=6 * BLOCK)
    (first_key, first_data), (second_key, second_data), (third_key, third_data) = objects
    read_like_a_broker(prefetching_sidecar.data_url, bucket, first_key, first_data)
    prefetching_sidecar.wait_idle()
    # Before the reader asked for the next segment, its first block was fetched.
    assert f"bytes=0-{BLOCK - 1}" in [r.range for r in proxy.gets(second_key)]
    read_like_a_broker(prefetching_sidecar.data_url, bucket, second_key, second_data)
    read_like_a_broker(prefetching_sidecar.data_url, bucket, third_key, third_data)
    hits = prefetching_sidecar.metric("sidecar_cache_lookups_total", result="hit")
    misses = prefetching_sidecar.metric("sidecar_cache_lookups_total", result="miss")
    # After the first block of the stream (the partition), readers are anticipated:
    # the cross-segment hand-off keeps the next segments from missing.
    assert hits / (hits + misses) >= 0.99, (hits, misses)
    total = sum(len(data) for _, data in objects)
    origin_bytes = prefetching_sidecar.metric("sidecar_origin_bytes_total")
    assert total <= origin_bytes <= 1.05 * total + BLOCK
    issued = prefetching_sidecar.metric("sidecar_prefetch_blocks_total", outcome="issued")
    used = prefetching_sidecar.metric("sidecar_prefetch_blocks_total", outcome="used")
    assert issued >= 15 and used >= issued - 1
    stats = prefetching_sidecar.stats()
    prefetch = stats["prefetch"]
    assert isinstance(prefetch, dict) and prefetch["issued"] == issued


def test_the_next_segment_is_listed_after_the_one_being_read(
    prefetching_sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    # A partition's whole listing is a page per 1,000 keys and months of
    # tiered history: the next segment is looked up among the keys after the
    # current one only (ListObjectsV2 StartAfter), a few of them (MaxKeys).
    (first_key, first_data), (second_key, _) = put_partition(
        origin_s3, bucket, segments=2, segment_bytes=3 * BLOCK)
    read_like_a_broker(prefetching_sidecar.data_url, bucket, first_key, first_data)
    prefetching_sidecar.wait_idle()
    assert f"bytes=0-{BLOCK - 1}" in [r.range for r in proxy.gets(second_key)]
    listings = [parse_qs(urlsplit(r.path).query) for r in proxy.requests
                if r.method == "GET" and "list-type=2" in r.path]
    assert listings, "the next segment was found without a listing"
    assert all(query.get("start-after") == [first_key] and query.get("max-keys") == ["64"]
               for query in listings), listings


def test_random_reader_triggers_no_prefetch_storm(
    prefetching_sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    ((key, data),) = put_partition(origin_s3, bucket, segments=1, segment_bytes=24 * BLOCK)
    rng = random.Random(11)
    touched: set[int] = set()
    address = urlsplit(prefetching_sidecar.data_url)
    for _ in range(60):
        start = rng.randrange(len(data))
        end = min(len(data) - 1, start + rng.randrange(1, BLOCK))
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        connection.request("GET", f"/{bucket}/{key}", headers={"Range": f"bytes={start}-{end}"})
        assert connection.getresponse().read() == data[start:end + 1]
        connection.close()
        touched.update(range(start // BLOCK, end // BLOCK + 1))
    prefetching_sidecar.wait_idle()  # read-ahead started late would count too
    needed = sum(min(BLOCK, len(data) - block * BLOCK) for block in touched)
    origin_bytes = prefetching_sidecar.metric("sidecar_origin_bytes_total")
    # What a cache without read-ahead must fetch, plus at most 20%.
    assert origin_bytes <= 1.2 * needed, (origin_bytes, needed)


def replay_through(sidecar: SidecarProcess, origin: str, bucket: str) -> dict[str, Any]:
    from tests.support.replay_cli import replay_json

    return replay_json(
        "--endpoint", sidecar.data_url, "--list-endpoint", origin, "--admin", sidecar.admin_url,
        "--bucket", bucket, "--fetch-bytes", str(FETCH), "--concurrency", "2", "--json",
    )


def test_replay_of_two_partitions_reads_ahead(
    prefetching_sidecar: SidecarProcess, origin_s3: Any, bucket: str, local_s3: Any
) -> None:
    total = 0
    for segment in generate_topic_segments(
        topic="clicks", partitions=2, segments_per_partition=3, segment_bytes=5 * BLOCK,
        value_size=1024, seed=9,
    ):
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
        total += len(segment.data)
    report = replay_through(prefetching_sidecar, local_s3.endpoint, bucket)
    assert report["crc_errors"] == 0 and report["bytes"] == total
    # Each partition's first fetch misses; after that the reader is anticipated.
    assert report["block_hit_ratio"] >= 0.97, report
    assert report["fetch_hit_ratio"] >= 0.95, report
    assert report["origin_bytes"] <= 1.05 * total + 2 * BLOCK


def test_no_prefetch_flag_turns_read_ahead_off(
    proxy: RecordingProxy, origin_s3: Any, bucket: str, local_s3: Any, tmp_path: Any
) -> None:
    total = 0
    for segment in generate_topic_segments(
        topic="clicks", partitions=1, segments_per_partition=2, segment_bytes=4 * BLOCK,
        value_size=1024, seed=10,
    ):
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
        total += len(segment.data)
    with SidecarProcess(proxy.endpoint, tmp_path, "--block-size", "1MiB", "--no-prefetch",
                        "--cache-size", str(16 * (BLOCK + 4096))) as sidecar:
        report = replay_through(sidecar, local_s3.endpoint, bucket)
        assert report["crc_errors"] == 0
        assert sidecar.metric("sidecar_prefetch_blocks_total", outcome="issued") == 0
        # Without read-ahead every block is fetched by the read that first wants it:
        # all origin bytes are foreground bytes, each byte once.
        assert sidecar.metric("sidecar_origin_bytes_total", lane="prefetch") == 0
        assert sidecar.metric("sidecar_origin_bytes_total", lane="foreground") == total
