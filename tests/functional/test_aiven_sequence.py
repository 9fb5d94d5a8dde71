"""What Aiven's tiered-storage plugin does to its endpoint, replayed through the
sidecar with boto3: upload a segment (multipart, in 5 MiB+ parts), its indexes
and its manifest; read them back at once, whole and in ranges; delete them on
retention with DeleteObjects. Every byte and the cache state are checked after
each step, and every request the sidecar sends on is signature-checked."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sidecar.layout import format_aiven_key
from sidecar.tools.kafka_segments import build_segment, parse_batch_header
from tests.support.processes import SidecarProcess
from tests.support.s3_clients import s3_client
from tests.support.verifying_proxy import VerifyingProxy

MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part but the last
TOPIC_ID = "Zq3v0cB8Rl2cq7dXk0rN1w"
SEGMENT_ID = "uR8pD3f0Q5eYwW2mKc9aTg"


def segment_keys(offset: int) -> dict[str, str]:
    return {suffix: format_aiven_key("", "payments", TOPIC_ID, 0, offset, SEGMENT_ID, suffix)
            for suffix in ("log", "indexes", "rsm-manifest")}


def start(verifying: VerifyingProxy, tmp_path: Path, block: str, slots: int, block_bytes: int,
          prefetch: bool = False) -> SidecarProcess:
    cache = tmp_path / "cache"
    cache.mkdir()
    return SidecarProcess(
        verifying.endpoint, cache, "--block-size", block,
        "--cache-size", str(slots * (block_bytes + 4096)),
        env={"SIDECAR_PREFETCH": "true" if prefetch else "false"},
    )


class CacheState:
    """The sidecar's own account of its cache, from /api/v1/stats."""

    def __init__(self, sidecar: SidecarProcess) -> None:
        self._sidecar = sidecar

    def blocks(self, expect: int | None = None) -> int:
        # Blocks land in the cache just after their bytes went to the client.
        deadline = time.monotonic() + 10
        while True:
            cache = self._sidecar.stats()["cache"]
            assert isinstance(cache, dict)
            count = int(cache["blocks"])
            if expect is None or count == expect or time.monotonic() > deadline:
                return count
            time.sleep(0.02)

    def hits(self) -> int:
        return int(self._sidecar.stats()["hits"])  # type: ignore[arg-type]

    def misses(self) -> int:
        return int(self._sidecar.stats()["misses"])  # type: ignore[arg-type]


def read(client: Any, bucket: str, key: str, byte_range: str | None = None) -> tuple[bytes, str]:
    extra = {"Range": byte_range} if byte_range else {}
    answer = client.get_object(Bucket=bucket, Key=key, **extra)
    return answer["Body"].read(), answer["ResponseMetadata"]["HTTPHeaders"]["x-sidecar-cache"]


def test_upload_read_delete_sequence(
    verifying: VerifyingProxy, tmp_path: Path, origin_s3: Any, bucket: str
) -> None:
    segment, _ = build_segment(4200, target_bytes=12 * MiB + 12345, records_per_batch=50,
                               value_size=1000, base_timestamp_ms=1_790_000_000_000, seed=8)
    indexes = random.Random(1).randbytes(40_000)
    manifest = b'{"version":"1","chunkIndex":{"type":"fixed"},"segmentIndexes":{}}' * 20
    keys = segment_keys(4200)
    with start(verifying, tmp_path, "1MiB", 32, MiB) as sidecar:
        client = s3_client(sidecar.data_url)
        cache = CacheState(sidecar)

        # 1. The segment, as a multipart upload in 5 MiB parts.
        upload = client.create_multipart_upload(Bucket=bucket, Key=keys["log"])["UploadId"]
        parts = []
        for number, start_at in enumerate(range(0, len(segment), PART), start=1):
            etag = client.upload_part(Bucket=bucket, Key=keys["log"], UploadId=upload,
                                      PartNumber=number,
                                      Body=segment[start_at:start_at + PART])["ETag"]
            parts.append({"ETag": etag, "PartNumber": number})
        assert len(parts) == 3
        client.complete_multipart_upload(Bucket=bucket, Key=keys["log"], UploadId=upload,
                                         MultipartUpload={"Parts": parts})
        assert origin_s3.get_object(Bucket=bucket, Key=keys["log"])["Body"].read() == segment
        assert cache.blocks() == 0  # writes pass through; nothing is cached by them

        # 2. Indexes and manifest, single PUTs.
        client.put_object(Bucket=bucket, Key=keys["indexes"], Body=indexes)
        client.put_object(Bucket=bucket, Key=keys["rsm-manifest"], Body=manifest)

        # 3. The manifest, read whole, immediately: a miss, then a hit.
        assert read(client, bucket, keys["rsm-manifest"]) == (manifest, "miss")
        assert cache.blocks(1) == 1
        hits = cache.hits()
        assert read(client, bucket, keys["rsm-manifest"]) == (manifest, "hit")
        assert cache.hits() == hits + 1

        # 4. The indexes, whole and in ranges.
        assert read(client, bucket, keys["indexes"]) == (indexes, "miss")
        assert cache.blocks(2) == 2
        assert read(client, bucket, keys["indexes"], "bytes=100-199") == (indexes[100:200], "hit")
        assert read(client, bucket, keys["indexes"], "bytes=-10")[0] == indexes[-10:]

        # 5. Ranged reads of the segment, as the broker's remote reader makes them.
        header, state = read(client, bucket, keys["log"], "bytes=0-60")
        assert header == segment[:61] and state == "miss"
        assert parse_batch_header(header).base_offset == 4200
        assert cache.blocks(3) == 3
        middle = 5 * MiB + 777
        assert read(client, bucket, keys["log"], f"bytes={middle}-{middle + MiB - 1}")[0] == \
            segment[middle:middle + MiB]
        assert cache.blocks(5) == 5  # the range spans blocks 5 and 6
        tail = read(client, bucket, keys["log"], f"bytes={len(segment) - 3000}-")
        assert tail[0] == segment[-3000:]
        assert cache.blocks(6) == 6
        misses = cache.misses()
        assert read(client, bucket, keys["log"], "bytes=10-20") == (segment[10:21], "hit")
        assert cache.misses() == misses

        # 6. Retention: one DeleteObjects for the three files.
        answer = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": key} for key in keys.values()]})
        assert sorted(d["Key"] for d in answer["Deleted"]) == sorted(keys.values())
        assert "Contents" not in origin_s3.list_objects_v2(Bucket=bucket)
        assert cache.blocks() == 0
        assert sidecar.metric("sidecar_cache_evictions_total", reason="invalidated") == 6
        for key in keys.values():
            with pytest.raises(ClientError) as caught:
                client.get_object(Bucket=bucket, Key=key)
            assert caught.value.response["Error"]["Code"] == "NoSuchKey"
        assert sidecar.metric("sidecar_requests_total", op="DeleteObjects", code="200") == 1
        assert sidecar.metric("sidecar_requests_total", op="UploadPart", code="200") == 3
    assert verifying.failures == []
    methods = {method for method, _, _ in verifying.verified}
    assert {"POST", "PUT", "GET", "HEAD"} <= methods


@pytest.mark.parametrize("prefetch", [False, True], ids=["no-read-ahead", "read-ahead"])
def test_manifest_and_indexes_survive_a_scan_many_times_the_cache(
    verifying: VerifyingProxy, tmp_path: Path, origin_s3: Any, bucket: str, prefetch: bool
) -> None:
    # Read once, a scanned block is used once, however it reached the cache:
    # fetched ahead of the reader by read-ahead, or by its own coalesced GET.
    block = 64 * 1024
    keys = segment_keys(0)
    manifest, indexes = b"m" * 900, random.Random(2).randbytes(3000)
    big = random.Random(3).randbytes(160 * block)  # ten times the 16-slot cache
    origin_s3.put_object(Bucket=bucket, Key=keys["rsm-manifest"], Body=manifest)
    origin_s3.put_object(Bucket=bucket, Key=keys["indexes"], Body=indexes)
    origin_s3.put_object(Bucket=bucket, Key=keys["log"], Body=big)
    with start(verifying, tmp_path, "64KiB", 16, block, prefetch) as sidecar:
        client = s3_client(sidecar.data_url)
        assert read(client, bucket, keys["rsm-manifest"]) == (manifest, "miss")
        assert read(client, bucket, keys["indexes"]) == (indexes, "miss")
        for _ in range(2):  # two full scans: 320 blocks through 16 slots
            assert client.get_object(Bucket=bucket, Key=keys["log"])["Body"].read() == big
        assert sidecar.metric("sidecar_cache_evictions_total", reason="capacity") >= 300
        assert read(client, bucket, keys["rsm-manifest"]) == (manifest, "hit")
        assert read(client, bucket, keys["indexes"]) == (indexes, "hit")
        # The segment's own first block went the way of every scanned block.
        assert read(client, bucket, keys["log"], "bytes=0-9") == (big[:10], "miss")
