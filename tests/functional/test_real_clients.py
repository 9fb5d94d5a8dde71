"""Unchanged S3 tools against the sidecar in front of moto: the aws cli, rclone
and s3cmd (installed from Debian by scripts/ensure-s3-clients.sh when missing).

Ranged reads equal the origin's bytes; uploads (multipart included) land at the
origin intact; deletes remove the object and its cached blocks; listings match
the origin's. The sidecar's requests to the origin pass a signature check.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sidecar.tools.local_s3 import CREDENTIALS
from tests.support.installs import ensure
from tests.support.processes import SidecarProcess
from tests.support.verifying_proxy import VerifyingProxy
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def s3_clients_installed() -> None:
    ensure("ensure-s3-clients.sh")


@pytest.fixture(scope="module")
def sidecar(verifying: VerifyingProxy, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[SidecarProcess]:
    """1 MiB blocks, room for 80: a whole 64 MiB segment stays cached."""
    cache = tmp_path_factory.mktemp("clients-cache")
    with SidecarProcess(verifying.endpoint, cache, "--block-size", "1MiB",
                        "--cache-size", str(80 * (MiB + 4096)),
                        env={"SIDECAR_PREFETCH": "false"}) as process:
        yield process


@pytest.fixture(scope="module")
def shared_bucket(origin_s3: Any) -> str:
    name = "clients-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:8]
    origin_s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(autouse=True)
def _signatures_hold(verifying: VerifyingProxy) -> Iterator[None]:
    yield
    assert verifying.failures == [], verifying.failures


def client_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # The sidecar speaks plain HTTP on loopback: a CA bundle from the caller's
    # environment has nothing to verify, and rclone's SDK refuses to start with one.
    base = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    return {**base, **CREDENTIALS, **(extra or {})}


def run(args: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                            env=client_env(env))
    assert result.returncode == 0, f"{args[0]} failed ({result.returncode}):\n{result.stderr}"
    return result.stdout


def origin_bytes(origin_s3: Any, bucket: str, key: str) -> bytes:
    data: bytes = origin_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


def origin_keys(origin_s3: Any, bucket: str) -> list[str]:
    return [item["Key"] for item in origin_s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def assert_gone(origin_s3: Any, bucket: str, key: str) -> None:
    with pytest.raises(ClientError) as caught:
        origin_s3.head_object(Bucket=bucket, Key=key)
    assert caught.value.response["Error"]["Code"] == "404"


def blocks(sidecar: SidecarProcess) -> int:
    return int(sidecar.metric("sidecar_cache_blocks"))


def blocks_reach(sidecar: SidecarProcess, expect: int) -> None:
    """Blocks land in the cache just after their bytes went to the client: wait
    (10 s at most) until `expect` of them are there."""
    eventually(lambda: blocks(sidecar) == expect, f"{expect} blocks in the cache", timeout=10)


def test_aws_cli(s3_clients_installed: None, sidecar: SidecarProcess, origin_s3: Any,
                 shared_bucket: str, tmp_path: Path) -> None:
    config = tmp_path / "aws-config"
    config.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
    env = {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    aws = [shutil.which("aws") or "aws", "--endpoint-url", sidecar.data_url]
    segment = random.Random(64).randbytes(64 * MiB)
    local = tmp_path / "segment.log"
    local.write_bytes(segment)
    key = "orders-0/00000000000000000000-seg.log"

    # Up: 64 MiB is a multipart upload for the cli (8 MiB parts by default).
    run(aws + ["s3", "cp", str(local), f"s3://{shared_bucket}/{key}"], env)
    assert hashlib.sha256(origin_bytes(origin_s3, shared_bucket, key)).digest() == \
        hashlib.sha256(segment).digest()
    assert sidecar.metric("sidecar_requests_total", op="UploadPart", code="200") >= 8
    assert sidecar.metric("sidecar_requests_total", op="CompleteMultipartUpload", code="200") >= 1

    before = blocks(sidecar)
    for first, last in [(0, 60), (MiB - 5, MiB + 5), (40 * MiB + 3, 41 * MiB + 9)]:
        out = tmp_path / f"range-{first}"
        run(aws + ["s3api", "get-object", "--bucket", shared_bucket, "--key", key,
                   "--range", f"bytes={first}-{last}", str(out)], env)
        assert out.read_bytes() == segment[first:last + 1]

    # Down: the whole object through the cache, then every block is cached.
    down = tmp_path / "down.log"
    run(aws + ["s3", "cp", f"s3://{shared_bucket}/{key}", str(down)], env)
    assert down.read_bytes() == segment
    blocks_reach(sidecar, before + 64)

    listed = run(aws + ["s3", "ls", f"s3://{shared_bucket}/", "--recursive"], env)
    assert sorted(line.split()[-1] for line in listed.splitlines()) == \
        sorted(origin_keys(origin_s3, shared_bucket))

    invalidated = sidecar.metric("sidecar_cache_evictions_total", reason="invalidated")
    run(aws + ["s3", "rm", f"s3://{shared_bucket}/{key}"], env)
    assert_gone(origin_s3, shared_bucket, key)
    assert blocks(sidecar) == before
    assert sidecar.metric("sidecar_cache_evictions_total", reason="invalidated") == \
        invalidated + 64


def test_rclone(s3_clients_installed: None, sidecar: SidecarProcess, origin_s3: Any,
                shared_bucket: str, tmp_path: Path) -> None:
    env = {
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_SIDECAR_TYPE": "s3", "RCLONE_CONFIG_SIDECAR_PROVIDER": "Other",
        "RCLONE_CONFIG_SIDECAR_ENV_AUTH": "false",
        "RCLONE_CONFIG_SIDECAR_ACCESS_KEY_ID": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "RCLONE_CONFIG_SIDECAR_SECRET_ACCESS_KEY": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "RCLONE_CONFIG_SIDECAR_REGION": "us-east-1",
        "RCLONE_CONFIG_SIDECAR_ENDPOINT": sidecar.data_url,
        "RCLONE_CONFIG_SIDECAR_FORCE_PATH_STYLE": "true",
    }
    (tmp_path / "rclone.conf").write_text("")
    rclone = [shutil.which("rclone") or "rclone"]
    data = random.Random(12).randbytes(12 * MiB + 333)
    local = tmp_path / "r.log"
    local.write_bytes(data)
    key = "rclone/00000000000000001000-seg.log"
    remote = f"sidecar:{shared_bucket}/{key}"

    # Multipart: 5 MiB chunks above a 5 MiB cutoff. --s3-no-head: rclone checks
    # an upload with `HEAD ?versionId=null` (moto's answer to an unversioned
    # upload), which moto itself refuses with 400, sidecar or not.
    # --s3-no-check-bucket: rclone would first CreateBucket, which the sidecar
    # refuses (access_bucket_admin off) as S3 refuses it to a key without
    # s3:CreateBucket; rclone's documented setting for such keys.
    run(rclone + ["copyto", str(local), remote, "--s3-upload-cutoff", "5M",
                  "--s3-chunk-size", "5M", "--s3-no-head", "--s3-no-check-bucket"], env)
    assert origin_bytes(origin_s3, shared_bucket, key) == data

    before = blocks(sidecar)
    for offset, count in [(0, 61), (5 * MiB - 7, 100), (len(data) - 1000, 1000)]:
        assert _cat_bytes(rclone, remote, offset, count, env) == data[offset:offset + count]
    cached = blocks(sidecar)
    assert cached > before

    listed = run(rclone + ["lsf", "-R", "--files-only", f"sidecar:{shared_bucket}"], env)
    assert sorted(listed.split()) == sorted(origin_keys(origin_s3, shared_bucket))

    run(rclone + ["deletefile", remote], env)
    assert_gone(origin_s3, shared_bucket, key)
    assert blocks(sidecar) == before


def _cat_bytes(rclone: list[str], remote: str, offset: int, count: int,
               env: dict[str, str]) -> bytes:
    result = subprocess.run(rclone + ["cat", "--offset", str(offset), "--count", str(count),
                                      remote],
                            capture_output=True, timeout=RUN_TIMEOUT_S, env=client_env(env))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_s3cmd(s3_clients_installed: None, sidecar: SidecarProcess, origin_s3: Any,
               shared_bucket: str, tmp_path: Path) -> None:
    host = sidecar.data_url.removeprefix("http://")
    config = tmp_path / "s3cfg"
    config.write_text("[default]\n")
    s3cmd = [
        shutil.which("s3cmd") or "s3cmd", "--config", str(config),
        "--access_key", CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "--secret_key", CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "--host", host, "--host-bucket", host, "--no-ssl", "--region", "us-east-1",
    ]
    data = random.Random(11).randbytes(11 * MiB + 5)
    local = tmp_path / "s.log"
    local.write_bytes(data)
    key = "s3cmd/00000000000000002000-seg.log"
    url = f"s3://{shared_bucket}/{key}"

    run(s3cmd + ["put", "--multipart-chunk-size-mb=5", str(local), url])
    assert origin_bytes(origin_s3, shared_bucket, key) == data

    before = blocks(sidecar)
    down = tmp_path / "s-down.log"
    run(s3cmd + ["get", url, str(down)])
    assert down.read_bytes() == data
    blocks_reach(sidecar, before + 12)

    listed = run(s3cmd + ["ls", "--recursive", f"s3://{shared_bucket}"])
    assert sorted(line.split()[-1].removeprefix(f"s3://{shared_bucket}/")
                  for line in listed.splitlines()) == sorted(origin_keys(origin_s3, shared_bucket))

    run(s3cmd + ["del", url])
    assert_gone(origin_s3, shared_bucket, key)
    assert blocks(sidecar) == before
