"""What the origin stores and says about an object comes through the sidecar unchanged.

An upload reaches the origin byte for byte as the client encoded it (a gzip
`Content-Encoding` is not undone on the way); cached answers carry the object's
own headers (user metadata, encodings, cache directives) as S3 does; and an
object written through the sidecar while one of its HEADs is out is never
described by that HEAD's older answer afterwards. A key whose current version
is a delete marker is answered with the marker's headers, and the whole
object's checksums come with every whole-object answer that asks for them, and
with no other.
"""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.httpchecksum import StreamingChecksumBody

from sidecar.tools.local_s3 import loopback_client
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.processes import SidecarProcess
from tests.support.s3_clients import s3_client
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



DELETE_MARKER_HEADERS = ("x-amz-delete-marker", "x-amz-version-id")


def error_answer(call: Any, **params: Any) -> tuple[int, str, dict[str, str]]:
    """(status, S3 error code, headers) of a call expected to fail."""
    with pytest.raises(ClientError) as caught:
        call(**params)
    metadata = caught.value.response["ResponseMetadata"]
    return (metadata["HTTPStatusCode"], caught.value.response["Error"]["Code"],
            metadata["HTTPHeaders"])


def marker_headers(headers: dict[str, str]) -> dict[str, str | None]:
    return {name: headers.get(name) for name in DELETE_MARKER_HEADERS}


@pytest.fixture()
def versioned_bucket(origin_s3: Any, bucket: str) -> str:
    origin_s3.put_bucket_versioning(Bucket=bucket,
                                    VersioningConfiguration={"Status": "Enabled"})
    return bucket


def test_a_delete_marker_is_answered_with_its_headers(
    sidecar: SidecarProcess, origin_s3: Any, versioned_bucket: str
) -> None:
    bucket, key = versioned_bucket, "orders-z/0/00000000000000000000-seg.log"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(2 * BLOCK))
    client = s3_client(sidecar.data_url)
    assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] == 2 * BLOCK
    # Deleted through the sidecar, which forgets its remembered HEAD of the key.
    marker = client.delete_object(Bucket=bucket, Key=key)
    assert marker["DeleteMarker"] is True

    at_origin = error_answer(origin_s3.head_object, Bucket=bucket, Key=key)
    # moto answers a HEAD of a delete marker as S3 does: 404 and the marker's headers.
    assert (at_origin[0], marker_headers(at_origin[2])) == \
        (404, {"x-amz-delete-marker": "true", "x-amz-version-id": marker["VersionId"]})
    for attempt in ("first", "again"):  # a 404 is not remembered: asked afresh
        head = error_answer(client.head_object, Bucket=bucket, Key=key)
        assert (head[0], marker_headers(head[2])) == (at_origin[0], marker_headers(at_origin[2])), \
            attempt
        # S3 answers a GET of it the same way, with a NoSuchKey body (GetObject
        # reference, x-amz-delete-marker). moto's GET leaves both headers out,
        # so the origin's HEAD is what the sidecar's GET is held to.
        got = error_answer(client.get_object, Bucket=bucket, Key=key)
        assert (got[0], got[1], marker_headers(got[2])) == \
            (404, "NoSuchKey", marker_headers(at_origin[2])), attempt


@pytest.mark.parametrize("method", ["head_object", "get_object"])
def test_a_version_that_is_a_delete_marker_is_answered_as_the_origin_answers(
    sidecar: SidecarProcess, origin_s3: Any, versioned_bucket: str, method: str
) -> None:
    bucket, key = versioned_bucket, "orders-v/0/00000000000000000000-seg.log"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=b"record batch")
    marker = origin_s3.delete_object(Bucket=bucket, Key=key)["VersionId"]
    client = s3_client(sidecar.data_url)
    # A request for a version is passed through (sidecar.s3.operations): S3
    # answers 405 MethodNotAllowed with the marker's headers and Last-Modified.
    # moto does so for HEAD; for GET it answers 404 NoSuchVersion.
    at_origin = error_answer(getattr(origin_s3, method), Bucket=bucket, Key=key,
                             VersionId=marker)
    through = error_answer(getattr(client, method), Bucket=bucket, Key=key, VersionId=marker)
    assert (through[0], through[1], marker_headers(through[2]), through[2].get("allow")) == \
        (at_origin[0], at_origin[1], marker_headers(at_origin[2]), at_origin[2].get("allow"))
    if method == "head_object":
        assert marker_headers(through[2]) == {"x-amz-delete-marker": "true",
                                              "x-amz-version-id": marker}


def checksum_fields(answer: dict[str, Any]) -> dict[str, Any]:
    return {name: answer.get(name) for name in (
        "ChecksumCRC32", "ChecksumCRC32C", "ChecksumCRC64NVME", "ChecksumSHA1",
        "ChecksumSHA256", "ChecksumType")}


def checksum_headers(answer: dict[str, Any]) -> list[str]:
    return sorted(name for name in answer["ResponseMetadata"]["HTTPHeaders"]
                  if name.startswith("x-amz-checksum-"))


# CRC32C and CRC64NVME need botocore's CRT extra to be computed by the client.
@pytest.mark.parametrize("algorithm", ["CRC32", "SHA256"])
def test_whole_object_answers_carry_the_objects_checksums_when_asked(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, algorithm: str
) -> None:
    key = f"orders-c/0/00000000000000000000-{algorithm}.log"
    body = os.urandom(3 * BLOCK + 517)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm=algorithm)
    at_origin = checksum_fields(origin_s3.head_object(Bucket=bucket, Key=key,
                                                      ChecksumMode="ENABLED"))
    assert at_origin[f"Checksum{algorithm}"], "the origin keeps the object's checksum"
    client = s3_client(sidecar.data_url)

    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert checksum_fields(head) == at_origin
    for attempt in ("miss", "hit"):
        got = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert got["ResponseMetadata"]["HTTPHeaders"]["x-sidecar-cache"] == attempt
        assert checksum_fields(got) == at_origin, attempt
        # botocore checks the body against the checksum as it is read, and
        # raises if they differ.
        assert isinstance(got["Body"], StreamingChecksumBody), attempt
        assert got["Body"].read() == body, attempt

    # Never on a part of the object: those bytes are not what it describes.
    ranged = client.get_object(Bucket=bucket, Key=key, Range="bytes=100-70000",
                               ChecksumMode="ENABLED")
    assert ranged["Body"].read() == body[100:70001]
    assert checksum_headers(ranged) == []
    ranged_head = client.head_object(Bucket=bucket, Key=key, Range="bytes=0-99",
                                     ChecksumMode="ENABLED")
    assert checksum_headers(ranged_head) == []


def test_checksums_are_not_sent_unasked(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    key = "orders-u/0/00000000000000000000-seg.log"
    body = os.urandom(BLOCK + 3)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm="CRC32")
    # botocore asks for checksums on every GetObject unless told to only when required.
    unasking = loopback_client(sidecar.data_url,
                               response_checksum_validation="when_required")
    try:
        got = unasking.get_object(Bucket=bucket, Key=key)
        assert got["Body"].read() == body
        head = unasking.head_object(Bucket=bucket, Key=key)
    finally:
        unasking.close()
    assert (checksum_headers(got), checksum_headers(head)) == ([], [])
    at_origin = origin_s3.head_object(Bucket=bucket, Key=key)
    assert checksum_headers(at_origin) == []
