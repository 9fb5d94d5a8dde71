"""`POST /api/v1/warm` on a real sidecar process, behind the recording proxy."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.loopback_http import admin_call, raw_request
from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy

MIB = 1024 * 1024
SIZE = 2 * MIB + 512 * 1024  # three 1 MiB blocks, the last one half full


def post(url: str, token: str | None, document: object = None, *,
         raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(document).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url + "/api/v1/warm", data=data, headers=headers,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.load(exc)


@pytest.fixture()
def objects(origin_s3: Any, bucket: str) -> dict[str, bytes]:
    contents = {f"warm/obj-{i}": os.urandom(SIZE) for i in range(2)}
    for key, data in contents.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
    return contents


@pytest.fixture()
def warm_sidecar(proxy: RecordingProxy, tmp_path: Path) -> Iterator[SidecarProcess]:
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(proxy.endpoint, cache, "--block-size", "1MiB", "--cache-size", "32MiB",
                        "--no-prefetch") as process:
        proxy.clear()
        yield process


def warm_bytes(sidecar: SidecarProcess) -> float:
    return sidecar.metric("sidecar_origin_bytes_total", lane="warm")


def test_warm_then_warm_again_then_read(
    warm_sidecar: SidecarProcess, proxy: RecordingProxy, bucket: str, objects: dict[str, bytes]
) -> None:
    body = {"objects": [{"bucket": bucket, "key": key, "start": 0, "end": None}
                        for key in objects], "ttl_s": 600}
    status, answer = post(warm_sidecar.admin_url, warm_sidecar.admin_token, body)
    assert status == 200, answer
    assert answer == {"requested_blocks": 6, "already_cached": 0, "fetched": 6, "failed": 0,
                      "bytes_fetched": 2 * SIZE}
    assert warm_bytes(warm_sidecar) == 2 * SIZE
    assert warm_sidecar.metric("sidecar_cache_blocks") == 6
    assert warm_sidecar.metric("sidecar_warm_blocks_total", outcome="fetched") == 6
    gets = len(proxy.gets())
    # Idempotent: the second call finds everything cached and fetches nothing.
    status, answer = post(warm_sidecar.admin_url, warm_sidecar.admin_token, body)
    assert status == 200
    assert answer == {"requested_blocks": 6, "already_cached": 6, "fetched": 0, "failed": 0,
                      "bytes_fetched": 0}
    assert len(proxy.gets()) == gets and warm_bytes(warm_sidecar) == 2 * SIZE
    # A reader then gets the bytes from the cache alone.
    key, data = next(iter(objects.items()))
    with urllib.request.urlopen(f"{warm_sidecar.data_url}/{bucket}/{key}", timeout=30) as response:
        assert response.read() == data
    assert len(proxy.gets()) == gets
    assert warm_sidecar.metric("sidecar_origin_bytes_total", lane="foreground") == 0


def test_ranges_are_inclusive_and_clamped(
    warm_sidecar: SidecarProcess, bucket: str, objects: dict[str, bytes]
) -> None:
    first, second = objects
    status, answer = post(warm_sidecar.admin_url, warm_sidecar.admin_token, {"objects": [
        {"bucket": bucket, "key": first, "start": MIB - 1, "end": MIB},  # blocks 0 and 1
        {"bucket": bucket, "key": second, "start": 2 * MIB, "end": 50 * MIB},  # block 2 only
        {"bucket": bucket, "key": second, "start": 10 * MIB},  # past the end: nothing
    ]})
    assert status == 200, answer
    assert answer == {"requested_blocks": 3, "already_cached": 0, "fetched": 3, "failed": 0,
                      "bytes_fetched": 2 * MIB + 512 * 1024}
    assert warm_sidecar.metric("sidecar_cache_blocks") == 3


def rejected_bodies(bucket: str, keys: list[str]) -> list[tuple[bytes, str]]:
    good = {"bucket": bucket, "key": keys[0]}

    def doc(document: object) -> bytes:
        return json.dumps(document).encode()

    return [
        (b"objects=1", "body: not JSON"),
        (doc({"objects": [good], "ttl_s": 60, "priority": "high"}), "unknown field 'priority'"),
        (doc({"objects": [good, {**good, "lenght": 5}]}), "objects[1]: unknown field 'lenght'"),
        (doc({"objects": [{"key": keys[0]}]}), "objects[0].bucket: missing"),
        (doc({"objects": [{"bucket": bucket}]}), "objects[0].key: missing"),
        (doc({"objects": [{**good, "start": -5}]}), "objects[0].start"),
        (doc({"objects": [{**good, "start": 10, "end": 5}]}), "objects[0].end: 5 is before"),
        (doc({"objects": [{**good, "end": "100"}]}), "objects[0].end"),
        (doc({"objects": [good], "ttl_s": 0}), "ttl_s"),
        (doc({"objects": [good], "ttl_s": 30 * 24 * 3600}), "ttl_s"),
        (doc({"objects": [good] * 1001}), "at most 1000"),
        (doc({"objects": [good, {"bucket": "no-such-bucket-here", "key": "k"}]}),
         "no such bucket: no-such-bucket-here"),
        (doc({"objects": [good, {"bucket": bucket, "key": "warm/missing"}]}),
         f"no such key: s3://{bucket}/warm/missing"),
        (doc({"objects": [good], "ttl_s": 60, "pad": "x" * (1024 * 1024)}), "larger than"),
        (b'{"objects": ' + b"[" * 100_000, "nested too deeply"),
        (b'{"objects": [{"bucket": "' + bucket.encode() + b'", "key": "a\\ud800b"}]}',
         "objects[0].key"),
    ]


def test_rejected_calls_fetch_nothing(
    warm_sidecar: SidecarProcess, proxy: RecordingProxy, bucket: str, objects: dict[str, bytes]
) -> None:
    for raw, message in rejected_bodies(bucket, list(objects)):
        status, answer = post(warm_sidecar.admin_url, warm_sidecar.admin_token, raw=raw)
        assert status == 400, (message, answer)
        assert set(answer) == {"error"} and message in answer["error"], answer
    assert proxy.gets() == []
    assert warm_bytes(warm_sidecar) == 0
    assert warm_sidecar.metric("sidecar_cache_blocks") == 0


def test_only_post_is_served(warm_sidecar: SidecarProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(warm_sidecar.admin_url + "/api/v1/warm", timeout=10)
    assert caught.value.code == 405
    caught.value.close()


def test_the_admin_token_is_required_when_set(
    proxy: RecordingProxy, tmp_path: Path, bucket: str, objects: dict[str, bytes]
) -> None:
    body = {"objects": [{"bucket": bucket, "key": next(iter(objects))}], "ttl_s": 60}
    with SidecarProcess(proxy.endpoint, tmp_path, "--block-size", "1MiB",
                        "--admin-token", "s3cret") as sidecar:
        for token in (None, "wrong"):
            status, answer = post(sidecar.admin_url, token, body)
            assert status == 401 and "admin token" in answer["error"]
        assert warm_bytes(sidecar) == 0
        status, answer = post(sidecar.admin_url, "s3cret", body)
        assert status == 200 and answer["fetched"] == 3


def test_warm_fetches_have_access_log_lines_adding_up_to_the_counter(
    proxy: RecordingProxy, bucket: str, objects: dict[str, bytes], tmp_path: Path
) -> None:
    """The warm lane's origin bytes are in the access log (a FETCH line each), as
    the capacity report reads them, and they add up to the sidecar's counter."""
    cache = tmp_path / "cache"
    cache.mkdir()
    log = tmp_path / "access.log"
    with SidecarProcess(proxy.endpoint, cache, "--block-size", "1MiB", "--cache-size", "32MiB",
                        "--no-prefetch", "--access-log", str(log)) as sidecar:
        body = {"objects": [{"bucket": bucket, "key": key, "start": 0, "end": None}
                            for key in objects], "ttl_s": 600}
        assert post(sidecar.admin_url, sidecar.admin_token, body)[0] == 200
        counted = warm_bytes(sidecar)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert {(line["method"], line["lane"], line["status"]) for line in lines} == \
        {("FETCH", "warm", 200)}
    assert len(lines) == 6 and sum(line["origin_bytes"] for line in lines) == counted == 2 * SIZE


def test_warm_calls_for_the_same_blocks_at_once_fetch_once_and_fail_none(
    warm_sidecar: SidecarProcess, proxy: RecordingProxy, bucket: str, objects: dict[str, bytes]
) -> None:
    """The warm-up job retried, or two jobs over one node: the calls that find
    the blocks on their way wait for them to be cached and count them cached."""
    body = {"objects": [{"bucket": bucket, "key": key} for key in objects], "ttl_s": 600}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(
            lambda _: post(warm_sidecar.admin_url, warm_sidecar.admin_token, body), range(4)))
    assert [status for status, _ in answers] == [200] * 4, answers
    assert [answer["failed"] for _, answer in answers] == [0] * 4, answers
    assert sum(answer["fetched"] for _, answer in answers) == 6, answers
    assert all(answer["fetched"] + answer["already_cached"] == 6 for _, answer in answers)
    assert warm_bytes(warm_sidecar) == 2 * SIZE
    assert warm_sidecar.metric("sidecar_warm_blocks_total", outcome="failed") == 0


@pytest.mark.parametrize("mode", ["cache-only", "bypass"])
def test_a_warm_call_while_downloads_are_paused_is_a_503_that_says_so(
    warm_sidecar: SidecarProcess, proxy: RecordingProxy, bucket: str, objects: dict[str, bytes],
    mode: str
) -> None:
    status, _ = admin_call(warm_sidecar.admin_url, "PUT", "/api/v1/mode", {"mode": mode},
                           warm_sidecar.admin_token)
    assert status == 200
    body = {"objects": [{"bucket": bucket, "key": key} for key in objects]}
    status, answer = post(warm_sidecar.admin_url, warm_sidecar.admin_token, body)
    # The mode has a field of its own: a caller tells this 503 from an origin's.
    assert (status, answer) == (503, {"error": f"mode {mode}: warm-up is paused", "mode": mode})
    assert proxy.gets() == [] and warm_bytes(warm_sidecar) == 0


def test_a_bucket_name_the_origin_client_cannot_send_is_a_400_not_an_origin_failure(
    warm_sidecar: SidecarProcess, proxy: RecordingProxy, bucket: str, objects: dict[str, bytes]
) -> None:
    """Such a name is refused by S3's rules, as the data port refuses it, before
    anything is sent: the call's fault, so neither retried nor counted against
    the origin by the breaker, which would otherwise open and turn readers away."""
    for name in ("not a bucket", "two/parts", "ab", "tiered..logs"):
        body = {"objects": [{"bucket": name, "key": "k"}]}
        status, answer = post(warm_sidecar.admin_url, warm_sidecar.admin_token, body)
        assert status == 400, answer
        assert answer["error"].startswith("objects[0].bucket: not an S3 bucket name"), answer
        assert name in answer["error"], answer
    assert warm_sidecar.metric("sidecar_origin_breaker_state", state="closed") == 1
    key, data = next(iter(objects.items()))
    status, _, body_read = raw_request(warm_sidecar.data_url, "GET", f"/{bucket}/{key}")
    assert status == 200 and body_read == data
