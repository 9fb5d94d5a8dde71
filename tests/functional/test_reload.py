"""Reloading the configuration of a running sidecar: SIGHUP and POST /api/v1/reload
take what can change live, say what needs a restart, and keep the running
configuration when the new one is not valid."""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
from pathlib import Path
from typing import Any

from sidecar.tools.local_s3 import LocalS3
from tests.support.loopback_http import admin_call, raw_request
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

MiB = 1024 * 1024
TOKEN = "reload-token-Wq4"


def put(origin_s3: Any, bucket: str, size: int) -> tuple[str, bytes]:
    key = f"reload-{secrets.token_hex(4)}.log"
    data = random.Random(size).randbytes(size)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
    return key, data


def foreground_waited(sidecar: SidecarProcess) -> float:
    return sidecar.metric("sidecar_ratelimit_wait_seconds_total", lane="foreground")


def test_sighup_lifts_the_bandwidth_cap_of_a_running_sidecar(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text('origin_bandwidth = "4MiB/s"\nprefetch = false\n')
    cache = tmp_path / "cache"
    cache.mkdir()
    capped, uncapped = put(origin_s3, bucket, 6 * MiB), put(origin_s3, bucket, 6 * MiB + 1)
    with SidecarProcess(local_s3.endpoint, cache, "--config", str(config),
                        "--block-size", "1MiB", "--cache-size", "32MiB") as sidecar:
        key, data = capped
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        waited = foreground_waited(sidecar)
        assert waited > 0  # 6 MiB at 4 MiB/s: the lane waited for its budget
        # Lifted, and (a restart's matter) the memory for recent chunks changed.
        config.write_text('origin_bandwidth = "unlimited"\nprefetch = false\n'
                          'recent_chunks = "8MiB"\n')
        os.kill(sidecar.pid, signal.SIGHUP)
        line = eventually(
            lambda: next((line for line in sidecar.stderr_lines
                          if "configuration reloaded" in line and "restart" in line), None),
            "the reload's log lines")
        assert "recent_chunks" in line
        assert any("origin_bandwidth changed" in line for line in sidecar.stderr_lines)
        key, data = uncapped
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        assert foreground_waited(sidecar) == waited  # no budget asked for any more
        assert sidecar.alive()


def test_the_reload_call_says_what_changed_and_keeps_a_bad_configuration_out(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("max_requests = 64\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    key, data = put(origin_s3, bucket, 2 * MiB)
    with SidecarProcess(local_s3.endpoint, cache, "--config", str(config),
                        "--block-size", "1MiB", "--cache-size", "16MiB",
                        env={"SIDECAR_ADMIN_TOKEN": TOKEN}) as sidecar:
        status, answer = admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"", None)
        assert status == 401  # a mutating call: the token is needed
        config.write_text('max_requests = 64\norigin_bandwidth = "8MiB/s"\n'
                          'client_timeout = "10s"\n')
        status, answer = admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"", TOKEN)
        assert status == 200, answer
        assert sorted(answer["applied"]) == ["client_timeout", "origin_bandwidth"]
        assert answer["needs_restart"] == []
        # A typo: nothing of the new file is taken, and the cap stays.
        config.write_text('max_requests = 64\norigin_bandwith = "1MiB/s"\n')
        status, answer = admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"", TOKEN)
        assert status == 400
        assert "did you mean 'origin_bandwidth'" in answer["error"]
        assert "running configuration stays" in answer["error"]
        os.kill(sidecar.pid, signal.SIGHUP)
        eventually(lambda: any("configuration reload failed" in line
                               for line in sidecar.stderr_lines),
                   "the failed reload's log line")
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        assert foreground_waited(sidecar) > 0  # still capped at 8 MiB/s
        status, index = admin_call(sidecar.admin_url, "GET", "/", b"", None)
        assert "POST /api/v1/reload" in json.dumps(index)


def test_a_bandwidth_too_low_for_a_block_is_refused_at_reload(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    """1 KiB/s would make a miss of an 8 MiB block wait for hours: refused, and
    the running cap stays. So is a lane share that is fine for the blocks the
    new file names (a restart's matter) but not for the blocks read now."""
    config = tmp_path / "sidecar.toml"
    config.write_text('origin_bandwidth = "8MiB/s"\nprefetch = false\n')
    cache = tmp_path / "cache"
    cache.mkdir()
    key, data = put(origin_s3, bucket, 2 * MiB + 7)
    with SidecarProcess(local_s3.endpoint, cache, "--config", str(config),
                        "--cache-size", "64MiB",
                        env={"SIDECAR_ADMIN_TOKEN": TOKEN}) as sidecar:
        config.write_text('origin_bandwidth = "1KiB/s"\nprefetch = false\n')
        status, answer = admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"", TOKEN)
        assert status == 400, answer
        assert "origin_bandwidth 1KiB/s is too low: one 8MiB block would take 2.28 h" in \
            answer["error"]
        assert "running configuration stays" in answer["error"]
        config.write_text('origin_bandwidth = "1MiB/s"\nwarm_share = 0.05\n'
                          'block_size = "64KiB"\nprefetch = false\n')
        status, answer = admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"", TOKEN)
        assert status == 400, answer
        assert "warm_share 0.05 of origin_bandwidth 1MiB/s gives the warm-up lane 51.2KiB/s, " \
            "under one 8MiB block a minute (137KiB/s)" in answer["error"]
        assert "(with the running block_size)" in answer["error"]
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        assert not any("configuration reloaded" in line for line in sidecar.stderr_lines)
        assert sidecar.alive()
