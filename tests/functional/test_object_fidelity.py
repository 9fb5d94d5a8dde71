"""What the origin stores and says about an object comes through the sidecar unchanged.

An upload reaches the origin byte for byte as the client encoded it (a gzip
`Content-Encoding` is not undone on the way); cached answers carry the object's
own headers (user metadata, encodings, cache directives) as S3 does; and an
object written through the sidecar while one of its HEADs is out is never
described by that HEAD's older answer afterwards.
"""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.functional.conftest import s3_client
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

BLOCK = 64 * 1024


@pytest.fixture(scope="module")
def sidecar(fault_proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[SidecarProcess]:
    """Behind the fault proxy; HEAD answers are remembered for 30 s (the default)."""
    cache = tmp_path_factory.mktemp("fidelity-cache")
    with SidecarProcess(fault_proxy.endpoint, cache, "--block-size", "64KiB",
                        "--cache-size", str(64 * (BLOCK + 4096)),
                        env={"SIDECAR_PREFETCH": "false", "SIDECAR_HEAD_TTL": "30s"}) as process:
        yield process


@pytest.fixture(autouse=True)
def _healed(fault_proxy: FaultProxy) -> Iterator[None]:
    yield
    fault_proxy.clear()


def test_a_gzip_encoded_upload_is_stored_and_served_as_sent(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    body = gzip.compress(os.urandom(50_000) + b"kafka" * 20_000)
    client = s3_client(sidecar.data_url)
    client.put_object(Bucket=bucket, Key="m/0.rsm-manifest.gz", Body=body,
                      ContentEncoding="gzip", ContentType="application/gzip")
    stored = origin_s3.get_object(Bucket=bucket, Key="m/0.rsm-manifest.gz")
    assert stored["Body"].read() == body
    for attempt in ("miss", "hit"):
        got = client.get_object(Bucket=bucket, Key="m/0.rsm-manifest.gz", Range="bytes=10-70009")
        assert got["Body"].read() == body[10:70010], attempt
        assert got["ContentEncoding"] == "gzip", attempt
        assert got["ResponseMetadata"]["HTTPHeaders"]["x-sidecar-cache"] == attempt


def test_cached_answers_carry_the_objects_own_headers(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    key = "orders-x/0/00000000000000000000-seg.log"
    origin_s3.put_object(
        Bucket=bucket, Key=key, Body=os.urandom(3 * BLOCK),
        Metadata={"mtime": "1763900000.5", "owner": "broker-1"},
        CacheControl="max-age=60", ContentDisposition='attachment; filename="seg.log"',
        ContentLanguage="en", ContentType="application/octet-stream",
    )
    fields = ("Metadata", "CacheControl", "ContentDisposition", "ContentLanguage",
              "ContentType", "ETag", "LastModified")
    at_origin = origin_s3.head_object(Bucket=bucket, Key=key)
    expected = {name: at_origin[name] for name in fields}
    assert expected["Metadata"] == {"mtime": "1763900000.5", "owner": "broker-1"}
    client = s3_client(sidecar.data_url)
    answers = [client.head_object(Bucket=bucket, Key=key),
               client.get_object(Bucket=bucket, Key=key, Range="bytes=0-99"),
               client.get_object(Bucket=bucket, Key=key, Range="bytes=0-99"),
               client.get_object(Bucket=bucket, Key=key)]
    # x-sidecar-cache: whether the first byte was cached (the last GET's rest was not).
    assert [a["ResponseMetadata"]["HTTPHeaders"]["x-sidecar-cache"] for a in answers] == \
        ["miss", "miss", "hit", "hit"]
    for answer in answers:
        assert {name: answer.get(name) for name in fields} == expected
        if "Body" in answer:
            answer["Body"].read()
    # Checksums describe the whole object: never repeated on a ranged answer.
    assert not any(name.startswith("x-amz-checksum")
                   for name in answers[1]["ResponseMetadata"]["HTTPHeaders"])


def test_a_head_in_flight_during_a_write_is_not_remembered(
    sidecar: SidecarProcess, fault_proxy: FaultProxy, origin_s3: Any, bucket: str
) -> None:
    key = "orders-y/0/00000000000000000000-seg.log"
    old, new = os.urandom(300), os.urandom(4000)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=old)
    # The sidecar's next HEAD of the key is answered by the origin at once (old
    # object), but the answer reaches the sidecar 1.5 s later.
    fault_proxy.add(Fault("late_answer", seconds=1.5), method="HEAD", key=key)
    client = s3_client(sidecar.data_url)
    first: dict[str, Any] = {}
    reader = threading.Thread(
        target=lambda: first.update(client.head_object(Bucket=bucket, Key=key)))
    reader.start()
    eventually(lambda: fault_proxy.requests("HEAD", key) or None, "the HEAD to reach the origin",
               timeout=5, interval=0.02)
    writer = s3_client(sidecar.data_url)
    put = writer.put_object(Bucket=bucket, Key=key, Body=new)
    reader.join(timeout=10)
    assert first["ContentLength"] == len(old)  # it asked before the write: fair
    after = client.head_object(Bucket=bucket, Key=key)
    assert (after["ContentLength"], after["ETag"]) == (len(new), put["ETag"])
    got = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert got == new

