"""The data port against a real S3 server, with the sidecar as a real process."""

from __future__ import annotations

import base64
import random
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from sidecar.engine import FOREGROUND_PARTS
from tests.functional.conftest import BLOCK
from tests.support.loopback_http import raw_request
from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy
from tests.support.s3_clients import s3_client
from tests.support.waiting import eventually

SLOT = BLOCK + 4096  # a slot is a 4 KiB header plus one block (sidecar/cache/slab.py)


def expected_answer(range_header: str | None, size: int) -> tuple[int, int, int]:
    """(status, first, last) as Amazon S3 answers a single-object GET; written
    independently of sidecar.s3.ranges so that the two can disagree."""
    if range_header is None:
        return 200, 0, size - 1
    unit, _, spec = range_header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return 200, 0, size - 1
    first_text, dash, last_text = spec.strip().partition("-")
    if not dash or not (first_text.isdigit() or first_text == "") \
            or not (last_text.isdigit() or last_text == "") or (not first_text and not last_text):
        return 200, 0, size - 1
    if first_text == "":
        suffix = int(last_text)
        if suffix == 0:
            return 416, 0, -1
        if size == 0:
            # RFC 9110 §14.1.1: satisfiable, and selects the whole empty object.
            return 200, 0, -1
        return 206, max(0, size - suffix), size - 1
    first = int(first_text)
    last = int(last_text) if last_text else size - 1
    if last_text and last < first:
        return 200, 0, size - 1
    if first >= size:
        return 416, 0, -1
    return 206, first, min(last, size - 1)


def random_range(rng: random.Random, size: int) -> str:
    kind = rng.random()
    edge = rng.choice([0, 1, BLOCK - 1, BLOCK, BLOCK + 1, size - 1, size, size + 1, 2 * size])
    a = rng.randrange(0, size + 2) if rng.random() < 0.7 else max(0, edge)
    b = a + rng.choice([0, 1, rng.randrange(0, 3 * BLOCK), rng.randrange(0, size + 2)])
    if kind < 0.45:
        return f"bytes={a}-{b}"
    if kind < 0.7:
        return f"bytes={a}-"
    if kind < 0.9:
        return f"bytes=-{rng.choice([0, 1, rng.randrange(0, size + 2), size, size + 5])}"
    return rng.choice([f"bytes={b}-{a}", "bytes=", "bytes=x-1", f"items={a}-{b}",
                       f"bytes={a}-{b},{b}-", f"bytes= {a}-{b}"])


def get(
    client: Any, bucket: str, key: str, range_header: str | None
) -> tuple[int, bytes, dict[str, str]]:
    kwargs = {"Range": range_header} if range_header is not None else {}
    try:
        response = client.get_object(Bucket=bucket, Key=key, **kwargs)
    except ClientError as exc:
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        return status, b"", {"code": exc.response["Error"]["Code"],
                             **exc.response["ResponseMetadata"]["HTTPHeaders"]}
    body = response["Body"].read()
    return response["ResponseMetadata"]["HTTPStatusCode"], body, \
        response["ResponseMetadata"]["HTTPHeaders"]


def put_objects(origin_s3: Any, bucket: str, sizes: list[int]) -> dict[str, bytes]:
    objects = {}
    for size in sizes:
        key = f"topic-{secrets.token_hex(4)}/0/{size:020d}-seg.log"
        data = random.Random(size).randbytes(size)
        origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
        objects[key] = data
    return objects


def test_random_ranges_equal_origin_bytes(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    # 51 blocks of data in a cache of 48 slots: reads also cross evictions.
    sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 123, 40 * BLOCK + 7]
    objects = put_objects(origin_s3, bucket, sizes)
    client = s3_client(sidecar.data_url)
    rng = random.Random(20261122)
    cases = []
    for _ in range(2400):
        key = rng.choice(list(objects))
        size = len(objects[key])
        cases.append((key, None if rng.random() < 0.03 else random_range(rng, max(size, 1))))

    def check(case: tuple[str, str | None]) -> None:
        key, range_header = case
        data = objects[key]
        status, body, headers = get(client, bucket, key, range_header)
        want_status, first, last = expected_answer(range_header, len(data))
        assert status == want_status, (key, len(data), range_header, headers)
        if status == 416:
            assert headers["code"] == "InvalidRange"
            assert headers["content-range"] == f"bytes */{len(data)}"
            return
        assert body == data[first:last + 1], (key, len(data), range_header)
        assert headers["accept-ranges"] == "bytes"
        assert int(headers["content-length"]) == last - first + 1
        if status == 206:
            assert headers["content-range"] == f"bytes {first}-{last}/{len(data)}"

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(check, cases))
    assert sidecar.metric("sidecar_cache_lookups_total", result="hit") > 0
    assert sidecar.metric("sidecar_cache_evictions_total", reason="capacity") > 0
    for request in proxy.gets():
        first, last = request.byte_range()
        size = len(objects[request.key])
        assert first % BLOCK == 0, request
        assert (last + 1) % BLOCK == 0 or last == size - 1, request


def test_concurrent_readers_fetch_each_block_once(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    (key, data), = put_objects(origin_s3, bucket, [12 * BLOCK + 500]).items()
    clients = [s3_client(sidecar.data_url) for _ in range(12)]
    ranges = [f"bytes={2 * BLOCK + 10}-{2 * BLOCK + 5000}"] * 6 + [f"bytes=0-{len(data) - 1}"] * 6

    def read(index: int) -> bytes:
        return get(clients[index], bucket, key, ranges[index])[1]

    with ThreadPoolExecutor(max_workers=12) as pool:
        bodies = list(pool.map(read, range(12)))
    assert bodies[:6] == [data[2 * BLOCK + 10:2 * BLOCK + 5001]] * 6
    assert bodies[6:] == [data] * 6
    fetched = [block for request in proxy.gets(key)
               for block in range(request.byte_range()[0] // BLOCK,
                                  request.byte_range()[1] // BLOCK + 1)]
    assert sorted(fetched) == list(range(13)), proxy.gets(key)
    origin_bytes = sidecar.metric("sidecar_origin_bytes_total")
    assert origin_bytes == len(data)


def test_origin_reads_are_block_aligned_and_coalesced(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    (key, data), = put_objects(origin_s3, bucket, [10 * BLOCK + 100]).items()
    client = s3_client(sidecar.data_url)
    assert get(client, bucket, key, f"bytes={2 * BLOCK + 5}-{6 * BLOCK + 7}")[1] \
        == data[2 * BLOCK + 5:6 * BLOCK + 8]
    # One coalesced fetch of blocks 2-6, in at most FOREGROUND_PARTS GETs read
    # at once: block-aligned, each byte once.
    assert covered(proxy.gets(key)) == [(2 * BLOCK, 7 * BLOCK - 1)]
    assert len(proxy.gets(key)) <= FOREGROUND_PARTS
    proxy.clear()
    assert get(client, bucket, key, f"bytes=0-{len(data) - 1}")[1] == data
    # Only the missing runs around the cached middle.
    assert covered(proxy.gets(key)) == [(0, 2 * BLOCK - 1), (7 * BLOCK, len(data) - 1)]
    assert len(proxy.gets(key)) <= 2 * FOREGROUND_PARTS
    assert sidecar.metric("sidecar_origin_bytes_total") == len(data)


def covered(requests: list[Any]) -> list[tuple[int, int]]:
    """The byte spans the origin GETs asked for, merged; each starts on a block
    boundary and none overlaps another."""
    spans = sorted(request.byte_range() for request in requests)
    assert all(first % BLOCK == 0 for first, _ in spans), spans
    merged: list[tuple[int, int]] = []
    for first, last in spans:
        if merged and first == merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], last)
        else:
            assert not merged or first > merged[-1][1], spans  # never the same byte twice
            merged.append((first, last))
    return merged


def test_open_ended_read_closed_early_fetches_one_block(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    """Kafka's remote reader asks `bytes=pos-`, reads about a fetch and closes."""
    (key, data), = put_objects(origin_s3, bucket, [30 * BLOCK]).items()
    address = urlsplit(sidecar.data_url)
    with socket.create_connection((address.hostname, address.port)) as connection:
        connection.sendall(
            f"GET /{bucket}/{key} HTTP/1.1\r\nHost: x\r\n"
            f"Range: bytes={BLOCK // 2}-\r\n\r\n".encode()
        )
        received = b""
        while len(received) < 20_000:
            received += connection.recv(65536)
    assert b" 206 " in received.split(b"\r\n")[0]
    body = received.partition(b"\r\n\r\n")[2]
    assert data[BLOCK // 2:].startswith(body)
    sidecar.wait_idle()  # a late over-fetch would show in what the proxy saw
    fetched = sum(r.byte_range()[1] - r.byte_range()[0] + 1 for r in proxy.gets(key))
    assert fetched <= 2 * BLOCK, proxy.gets(key)
    assert sidecar.alive()


def test_corrupted_slab_bytes_are_detected_and_refetched(
    proxy: RecordingProxy, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    (key, data), = put_objects(origin_s3, bucket, [6 * BLOCK + 99]).items()
    # recent_chunks and memory_tier 0: the second read must come from the slab
    # to be checked, not from the verified copies kept in memory after the first.
    with SidecarProcess(proxy.endpoint, tmp_path, "--block-size", "64KiB",
                        "--cache-size", str(16 * SLOT),
                        env={"SIDECAR_RECENT_CHUNKS": "0",
                             "SIDECAR_MEMORY_TIER": "0"}) as process:
        client = s3_client(process.data_url)
        assert get(client, bucket, key, None)[1] == data
        # The last blocks may still be on their way into the slab after the
        # response ended; a late write would overwrite the flipped byte.
        process.wait_idle()
        assert process.metric("sidecar_cache_blocks") == 7
        slab = tmp_path / "slab.dat"
        with slab.open("r+b") as handle:  # flip a byte in the data of every slot in use
            for slot in range(7):
                handle.seek(4096 + slot * SLOT + 4096 + 50)  # the last block holds 99 bytes
                byte = handle.read(1)
                handle.seek(-1, 1)
                handle.write(bytes([byte[0] ^ 0xFF]))
        assert get(client, bucket, key, None)[1] == data
        assert process.metric("sidecar_cache_checksum_failures_total") == 7
        assert process.metric("sidecar_cache_evictions_total", reason="checksum") == 7
        # The refetched blocks are good again: served from cache without failures.
        assert get(client, bucket, key, f"bytes=0-{len(data) - 1}")[1] == data
        assert process.metric("sidecar_cache_checksum_failures_total") == 7


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "code"),
    [
        ("GET", "/{bucket}/{key}", {"Range": "bytes=99999999999999-"}, 416, "InvalidRange"),
        ("GET", "/{bucket}/{key}", {"Range": "bytes=99999999999999999999999-"}, 200, None),
        ("GET", "/{bucket}/{key}", {"Range": "bytes=--5"}, 200, None),
        ("GET", "/{bucket}/{key}", {"Range": "bytes=-0"}, 416, "InvalidRange"),
        ("GET", "/{bucket}/a/../{key}", {}, 400, "InvalidArgument"),
        ("GET", "/{bucket}/a/%2E%2E/b", {}, 400, "InvalidArgument"),
        ("GET", "/{bucket}/bad%00key", {}, 400, "InvalidArgument"),
        ("GET", "/{bucket}/" + "k" * 1025, {}, 400, "KeyTooLongError"),
        ("GET", "/{bucket}/%FF%FE", {}, 400, "InvalidURI"),
        ("GET", "/no-such-bucket-here/{key}", {}, 404, "NoSuchBucket"),
        ("GET", "/{bucket}/missing-key", {}, 404, "NoSuchKey"),
        ("GET", "/bad!bucket/{key}", {}, 400, "InvalidBucketName"),
        ("GET", "/x..y/{key}", {}, 400, "InvalidBucketName"),
        # PUT, DELETE, multipart, sub-resources and bucket requests are passed
        # through to the origin: tests/functional/test_passthrough.py.
        # Unsigned: refused before the payload is looked at (tests of the
        # pass-through send it signed).
        ("PUT", "/{bucket}/{key}", {"x-amz-content-sha256": "nonsense"}, 403, "AccessDenied"),
        # Not S3 operations: refused here, never forwarded.
        ("PATCH", "/{bucket}/{key}", {}, 405, "MethodNotAllowed"),
        ("POST", "/{bucket}/{key}", {}, 405, "MethodNotAllowed"),
        ("GET", "/{bucket}/{key}", {"If-Match": '"nope"'}, 412, "PreconditionFailed"),
    ],
)
def test_bad_input_gets_s3_errors_and_serving_goes_on(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str,
    method: str, path: str, headers: dict[str, str], status: int, code: str | None,
) -> None:
    (key, data), = put_objects(origin_s3, bucket, [2 * BLOCK + 3]).items()
    got_status, got_headers, body = raw_request(
        sidecar.data_url, method, path.format(bucket=bucket, key=key), headers
    )
    assert got_status == status, body
    if code is None:
        assert body == data
    else:
        assert got_headers["content-type"].startswith("application/xml")
        assert f"<Code>{code}</Code>".encode() in body
        assert b"Traceback" not in body
    # The process keeps serving.
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                       {"Range": "bytes=0-9"})[2] == data[:10]


@pytest.mark.parametrize("range_header", ["bytes=-1", "bytes=-5000", "bytes=0-0", "bytes=-0"])
def test_ranges_of_an_empty_object_are_answered_as_the_origin_answers(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, range_header: str,
) -> None:
    # RFC 9110 §14.1.1: a suffix-range of non-zero length is satisfiable, so
    # `bytes=-1` of a 0-byte object is a 200 with no body (S3's answer), while
    # an int-range of it is not (416). Compared with the origin's own answer.
    origin_s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    want_status, want_body, want = get(origin_s3, bucket, "empty", range_header)
    status, body, got = get(s3_client(sidecar.data_url), bucket, "empty", range_header)
    assert (status, body, got.get("code")) == (want_status, want_body, want.get("code")), \
        range_header
    if status == 200:
        assert got["content-length"] == "0"


@pytest.mark.parametrize("range_header", ["bytes=99999-", "bytes=-0"])
def test_invalid_range_tells_the_client_the_objects_size(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, range_header: str,
) -> None:
    """S3's InvalidRange body carries RangeRequested and ActualObjectSize
    (S3 API Reference, GetObject / error responses); botocore hands them to
    the caller in the error, where a reader of a segment that shrank looks
    for the size to retry with."""
    (key, data), = put_objects(origin_s3, bucket, [BLOCK + 5]).items()
    client = s3_client(sidecar.data_url)
    with pytest.raises(ClientError) as caught:
        client.get_object(Bucket=bucket, Key=key, Range=range_header)
    error = caught.value.response["Error"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    assert error["Code"] == "InvalidRange"
    assert error["RangeRequested"] == range_header
    assert error["ActualObjectSize"] == str(len(data))
    assert caught.value.response["ResponseMetadata"]["HTTPHeaders"]["content-range"] == \
        f"bytes */{len(data)}"


def test_precondition_failed_names_the_condition(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str,
) -> None:
    """S3's 412 PreconditionFailed names the failed header in <Condition>
    (S3 API Reference, error responses); botocore hands it to the caller."""
    (key, _), = put_objects(origin_s3, bucket, [BLOCK]).items()
    client = s3_client(sidecar.data_url)
    for kwargs, condition in [
        ({"IfMatch": '"nope"'}, "If-Match"),
        ({"IfUnmodifiedSince": datetime(2000, 1, 1, tzinfo=UTC)}, "If-Unmodified-Since"),
    ]:
        with pytest.raises(ClientError) as caught:
            client.get_object(Bucket=bucket, Key=key, **kwargs)
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert caught.value.response["Error"]["Code"] == "PreconditionFailed"
        assert caught.value.response["Error"]["Condition"] == condition


def test_not_found_errors_name_the_bucket_or_key(
    sidecar: SidecarProcess, bucket: str,
) -> None:
    """S3's NoSuchKey body names the <Key> and NoSuchBucket the <BucketName>
    (S3 API Reference, error responses); botocore hands them to the caller."""
    client = s3_client(sidecar.data_url)
    key = "topic-x/0/00000000000000000000-missing seg+~é.log"
    with pytest.raises(ClientError) as caught:
        client.get_object(Bucket=bucket, Key=key)
    assert caught.value.response["Error"]["Code"] == "NoSuchKey"
    assert caught.value.response["Error"]["Key"] == key
    with pytest.raises(ClientError) as caught:
        client.get_object(Bucket="no-such-bucket-here", Key=key)
    assert caught.value.response["Error"]["Code"] == "NoSuchBucket"
    assert caught.value.response["Error"]["BucketName"] == "no-such-bucket-here"


def test_answers_carry_x_amz_id_2_next_to_the_request_id(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str,
) -> None:
    """S3 answers carry x-amz-id-2, an opaque id, next to x-amz-request-id, and an
    error body repeats both (RequestId, HostId): SDKs log and hand them over."""
    (key, data), = put_objects(origin_s3, bucket, [BLOCK + 3]).items()
    host_ids = []
    for headers in ({}, {"Range": "bytes=0-9"}, {"If-None-Match": "*"}):
        status, answered, _ = raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}", headers)
        assert status in (200, 206, 304)
        assert answered["x-amz-request-id"]
        host_ids.append(base64.b64decode(answered["x-amz-id-2"], validate=True))
    status, answered, body = raw_request(sidecar.data_url, "GET", f"/{bucket}/missing-key")
    assert status == 404
    host_ids.append(base64.b64decode(answered["x-amz-id-2"], validate=True))
    assert (f"<RequestId>{answered['x-amz-request-id']}</RequestId>"
            f"<HostId>{answered['x-amz-id-2']}</HostId></Error>").encode() in body
    assert all(host_ids) and len(set(host_ids)) == len(host_ids)
    status, answered, _ = raw_request(sidecar.data_url, "HEAD", f"/{bucket}/missing-key")
    assert status == 404 and answered["x-amz-id-2"]
    # botocore reads the header as every SDK does.
    client = s3_client(sidecar.data_url)
    got = client.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == data
    assert got["ResponseMetadata"]["HostId"]
    with pytest.raises(ClientError) as caught:
        client.get_object(Bucket=bucket, Key="missing-key")
    assert caught.value.response["ResponseMetadata"]["HostId"]


def test_a_legacy_us_east_1_bucket_is_served(
    sidecar: SidecarProcess, origin_s3: Any,
) -> None:
    """Buckets created in us-east-1 before March 2018 may be named with upper
    case and '_' (S3 User Guide, legacy bucket naming rules): they are read
    through the sidecar, not refused as names that are not valid."""
    # Upper case here; '_' is taken too (tests/unit/test_bucket_names.py), but
    # moto's server reads a first path segment holding one as a service name
    # when the request is presigned, as the sidecar's ranged reads are.
    legacy = "Kafka-Tiered-" + secrets.token_hex(4)
    origin_s3.create_bucket(Bucket=legacy)
    (key, data), = put_objects(origin_s3, legacy, [2 * BLOCK + 3]).items()
    assert raw_request(sidecar.data_url, "GET", f"/{legacy}/{key}")[::2] == (200, data)
    status, _, body = raw_request(sidecar.data_url, "GET", f"/{legacy}/{key}",
                                  {"Range": "bytes=5-9"})
    assert (status, body) == (206, data[5:10])
    assert s3_client(sidecar.data_url).get_object(Bucket=legacy, Key=key)["Body"].read() == data
    # A legacy name longer than a cache slot records: refused as that, by name.
    status, _, body = raw_request(sidecar.data_url, "GET", f"/{'K' * 64}/{key}")
    assert status == 400 and b"<Code>InvalidBucketName</Code>" in body
    assert b"a bucket name of 64 characters" in body


def test_conditional_requests(sidecar: SidecarProcess, origin_s3: Any, bucket: str) -> None:
    (key, data), = put_objects(origin_s3, bucket, [3 * BLOCK]).items()
    status, headers, _ = raw_request(sidecar.data_url, "HEAD", f"/{bucket}/{key}")
    assert status == 200 and int(headers["content-length"]) == len(data)
    etag, modified = headers["etag"], headers["last-modified"]
    assert etag == origin_s3.head_object(Bucket=bucket, Key=key)["ETag"]
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                       {"If-None-Match": etag})[0] == 304
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                       {"If-Modified-Since": modified})[0] == 304
    # A date ahead of the server's clock is ignored, as S3 ignores it: 200, the object.
    ahead = format_datetime(datetime.now(UTC) + timedelta(days=1), usegmt=True)
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                       {"If-Modified-Since": ahead})[::2] == (200, data)
    # A 304 repeats the freshness the object's metadata gives a 200 (RFC 9110 15.4.5).
    fresh = "fresh/" + key
    origin_s3.put_object(Bucket=bucket, Key=fresh, Body=data[:10], CacheControl="max-age=60",
                         Expires=datetime(2030, 1, 1, tzinfo=UTC))
    status, answered, _ = raw_request(sidecar.data_url, "GET", f"/{bucket}/{fresh}", {
        "If-None-Match": origin_s3.head_object(Bucket=bucket, Key=fresh)["ETag"]})
    assert status == 304 and answered["cache-control"] == "max-age=60"
    assert answered["expires"] == "Tue, 01 Jan 2030 00:00:00 GMT"
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                       {"If-Match": etag, "Range": "bytes=0-3"})[2] == data[:4]
    # If-Range that does not match: the whole object, 200.
    status, _, body = raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                                  {"If-Range": '"other"', "Range": "bytes=0-3"})
    assert (status, body) == (200, data)
    status, _, body = raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                                  {"If-Range": etag, "Range": "bytes=5-8"})
    assert (status, body) == (206, data[5:9])
    status, headers, body = raw_request(sidecar.data_url, "HEAD", f"/{bucket}/nope")
    assert (status, body) == (404, b"")


def test_admin_endpoints_report_hits(sidecar: SidecarProcess, origin_s3: Any, bucket: str) -> None:
    (key, data), = put_objects(origin_s3, bucket, [4 * BLOCK]).items()
    client = s3_client(sidecar.data_url)
    get(client, bucket, key, None)
    get(client, bucket, key, None)
    stats = sidecar.stats()
    assert stats["hits"] == 4 and stats["misses"] == 4
    assert stats["byte_hit_ratio"] == pytest.approx(0.5)
    assert stats["served_bytes"] == {"cache": len(data), "origin": len(data)}
    cache = stats["cache"]
    assert isinstance(cache, dict) and cache["blocks"] == 4 and cache["used_bytes"] == len(data)
    assert cache["capacity_bytes"] == 48 * BLOCK
    assert raw_request(sidecar.admin_url, "GET", "/healthz")[0] == 200
    assert raw_request(sidecar.admin_url, "GET", "/readyz")[0] == 200
    assert sidecar.metric("sidecar_requests_total", op="GetObject", code="200") == 2


def test_block_fetches_of_an_object_share_one_presigned_url_until_it_changes(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, proxy: RecordingProxy
) -> None:
    """Presigning is paid once per object (a minute at most), not once per GET;
    a write through the sidecar makes the next fetch sign afresh.

    A signature names its second (X-Amz-Date), so each read waits for the next
    second: URLs signed anew would differ."""
    (key, data), = put_objects(origin_s3, bucket, [6 * BLOCK]).items()
    client = s3_client(sidecar.data_url)
    for block in (0, 2, 4):
        next_second()
        first = block * BLOCK
        assert get(client, bucket, key, f"bytes={first}-{first + 10}")[1] \
            == data[first:first + 11]
    signatures = {signature_of(request.path) for request in proxy.gets(key)}
    assert len(proxy.gets(key)) == 3 and len(signatures) == 1, proxy.gets(key)

    rewritten = random.Random(7).randbytes(6 * BLOCK)
    client.put_object(Bucket=bucket, Key=key, Body=rewritten)
    proxy.clear()
    next_second()
    assert get(client, bucket, key, f"bytes={BLOCK}-{BLOCK + 10}")[1] \
        == rewritten[BLOCK:BLOCK + 11]
    fresh = {signature_of(request.path) for request in proxy.gets(key)}
    assert len(fresh) == 1 and not fresh & signatures, proxy.gets(key)


def next_second() -> None:
    now = int(time.time())
    eventually(lambda: int(time.time()) > now, "the next second", timeout=3)


def signature_of(path: str) -> str:
    query = dict(part.partition("=")[::2] for part in urlsplit(path).query.split("&"))
    return query["X-Amz-Signature"]
