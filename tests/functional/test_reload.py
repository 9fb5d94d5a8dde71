"""Reloading the configuration of a running sidecar: SIGHUP and POST /api/v1/reload
take what can change live, say what needs a restart, and keep the running
configuration when the new one is not valid."""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sidecar.tools.local_s3 import LocalS3
from tests.functional.test_passthrough_limits import trickling_upload
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.loopback_http import admin_call, raw_request
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

MiB = 1024 * 1024
TOKEN = "reload-token-Wq4"


def small_sidecar(local_s3: LocalS3, tmp_path: Path, config: Path) -> SidecarProcess:
    """A sidecar with a small cache, `config` its file, and the admin token."""
    cache = tmp_path / "cache"
    cache.mkdir()
    return SidecarProcess(local_s3.endpoint, cache, "--config", str(config),
                          "--block-size", "256KiB", "--cache-size", "16MiB",
                          env={"SIDECAR_ADMIN_TOKEN": TOKEN})


def reload(sidecar: SidecarProcess) -> tuple[int, dict[str, Any]]:
    """POST /api/v1/reload: its status and answer."""
    return admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"", TOKEN)


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
        status, answer = reload(sidecar)
        assert status == 200, answer
        assert sorted(answer["applied"]) == ["client_timeout", "origin_bandwidth"]
        assert answer["needs_restart"] == []
        # A typo: nothing of the new file is taken, and the cap stays.
        config.write_text('max_requests = 64\norigin_bandwith = "1MiB/s"\n')
        status, answer = reload(sidecar)
        assert status == 400
        # The file is named, as at a start (SIDECAR_CONFIG may have chosen it).
        assert f"{config}: unknown config key 'origin_bandwith'; did you mean " \
            "'origin_bandwidth'?" in answer["error"]
        assert "running configuration stays" in answer["error"]
        os.kill(sidecar.pid, signal.SIGHUP)
        failed = eventually(lambda: next((line for line in sidecar.stderr_lines
                                          if "configuration reload failed" in line), None),
                            "the failed reload's log line")
        assert f"{config}: unknown config key" in failed
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
        status, answer = reload(sidecar)
        assert status == 400, answer
        assert "origin_bandwidth 1KiB/s is too low: one 8MiB block would take 2.28 h" in \
            answer["error"]
        assert "running configuration stays" in answer["error"]
        config.write_text('origin_bandwidth = "1MiB/s"\nwarm_share = 0.05\n'
                          'block_size = "64KiB"\nprefetch = false\n')
        status, answer = reload(sidecar)
        assert status == 400, answer
        assert "warm_share 0.05 of origin_bandwidth 1MiB/s gives the warm-up lane 51.2KiB/s, " \
            "under one 8MiB block a minute (137KiB/s)" in answer["error"]
        assert "(with the running block_size)" in answer["error"]
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        assert not any("configuration reloaded" in line for line in sidecar.stderr_lines)
        assert sidecar.alive()


def test_a_limit_added_by_a_reload_paces_the_fetch_under_way(
    fault_proxy: FaultProxy, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    """A coalesced fetch begun unlimited (four GETs that trickle from the
    origin) is paced from its next chunk on once a reload sets 1 MiB/s, and
    goes at full speed again once a reload lifts it; the client's bytes are
    exact throughout."""
    config = tmp_path / "sidecar.toml"
    config.write_text('origin_bandwidth = "unlimited"\nprefetch = false\n')
    cache = tmp_path / "cache"
    cache.mkdir()
    key, data = put(origin_s3, bucket, 8 * MiB)
    # About 1.6 MiB/s a GET, 6 MiB/s for the four of a coalesced fetch.
    fault_proxy.add(Fault("trickle", after_bytes=64 * 1024, seconds=0.04), "GET", key,
                    times=None)
    with SidecarProcess(fault_proxy.endpoint, cache, "--config", str(config),
                        "--block-size", "256KiB", "--cache-size", "64MiB",
                        env={"SIDECAR_ADMIN_TOKEN": TOKEN}) as sidecar, \
            ThreadPoolExecutor(1) as client:
        def fetched() -> float:
            return sidecar.metric("sidecar_origin_bytes_total", lane="foreground")

        def reload(text: str) -> None:
            config.write_text(text)
            status, answer = admin_call(sidecar.admin_url, "POST", "/api/v1/reload", b"",
                                        TOKEN)
            assert (status, answer["applied"]) == (200, ["origin_bandwidth"]), answer

        try:
            read = client.submit(raw_request, sidecar.data_url, "GET", f"/{bucket}/{key}",
                                 {"Range": f"bytes=0-{len(data) - 1}"})
            eventually(lambda: fetched() >= MiB, "the fetch to be under way")
            reload('origin_bandwidth = "1MiB/s"\nprefetch = false\n')
            # The fetch's own threads now wait for the budget...
            eventually(lambda: foreground_waited(sidecar) > 0,
                       "the running fetch to wait for the new limit")
            # ...and its rate falls to the limit: 3 MiB take at least the time
            # 1 MiB/s gives, less the new buckets' first burst (768 KiB) and a
            # chunk each of the four GETs granted before (1 MiB).
            started = time.monotonic()  # before the count: the window holds it
            start_bytes = fetched()
            assert start_bytes < len(data) - 3 * MiB, "the fetch ended before the limit"
            eventually(lambda: fetched() >= start_bytes + 3 * MiB, "3 MiB more at 1 MiB/s")
            assert time.monotonic() - started >= (3 * MiB - 768 * 1024 - MiB) / MiB
            reload('origin_bandwidth = "unlimited"\nprefetch = false\n')
            fault_proxy.clear()
            status, _, body = read.result(timeout=30)
        finally:
            fault_proxy.clear()
        assert status == 206 and body == data
        assert fetched() == len(data)


def test_a_sighup_during_the_start_is_taken_once_the_sidecar_serves(
    fault_proxy: FaultProxy, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    """A reload asked while the sidecar starts (a long cache recovery, a slow
    origin check) waits for the start to end, then reads the file: what it
    says is changed is in force, here max_requests lowered to 1."""
    config = tmp_path / "sidecar.toml"
    config.write_text("max_requests = 64\nprefetch = false\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    key, data = put(origin_s3, bucket, 256 * 1024)
    checking, go_on = threading.Event(), threading.Event()

    def hold_the_origin_check() -> None:
        checking.set()
        go_on.wait(30)

    # The start's origin check (ListBuckets) is held: the start is under way.
    fault_proxy.add(Fault("pass"), "GET", None, times=1, before=hold_the_origin_check)
    sidecar = SidecarProcess(fault_proxy.endpoint, cache, "--config", str(config),
                             "--block-size", "256KiB", "--cache-size", "16MiB",
                             env={"SIDECAR_LOG_LEVEL": "INFO"}).launch()
    try:
        assert checking.wait(30), "the start's origin check"
        config.write_text("max_requests = 1\nprefetch = false\n")
        os.kill(sidecar.pid, signal.SIGHUP)
        eventually(lambda: any("configuration reload" in line
                               for line in sidecar.stderr_lines),
                   "the reload to be taken up")
        go_on.set()
        sidecar.await_ready()
        eventually(lambda: any("max_requests changed" in line
                               for line in sidecar.stderr_lines), "the reload's log line")
        # One request held at the origin; a second one is over max_requests.
        fault_proxy.add(Fault("latency", seconds=30), "GET", key)
        with ThreadPoolExecutor(1) as client:
            held = client.submit(raw_request, sidecar.data_url, "GET", f"/{bucket}/{key}")
            eventually(lambda: bool(fault_proxy.requests("GET", key)), "the held origin read")
            status, _, body = raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")
            fault_proxy.clear()
            assert status == 503 and b"SlowDown" in body
            assert held.result(timeout=30)[2] == data
        assert sidecar.alive()
    finally:
        go_on.set()
        sidecar.stop()


def test_a_reloaded_client_timeout_cuts_off_a_stalled_upload_too(
    local_s3: LocalS3, bucket: str, tmp_path: Path
) -> None:
    """client_timeout is live for every request, pass-through ones included: an
    upload whose body stalls after a reload lowered it to 1s gets 400
    RequestTimeout after about that, not after the minute it was before."""
    config = tmp_path / "sidecar.toml"
    config.write_text('client_timeout = "60s"\n')
    with small_sidecar(local_s3, tmp_path, config) as sidecar:
        config.write_text('client_timeout = "1s"\n')
        status, answer = reload(sidecar)
        assert (status, answer["applied"]) == (200, ["client_timeout"]), answer
        with trickling_upload(sidecar.data_url, f"/{bucket}/stalled") as upload:
            upload.settimeout(20)  # well under the old minute
            reply = upload.recv(65536)
        assert reply.startswith(b"HTTP/1.1 400") and b"RequestTimeout" in reply, reply[:300]
        assert sidecar.alive()


def test_a_config_file_caught_empty_is_not_taken_for_the_defaults(
    local_s3: LocalS3, tmp_path: Path
) -> None:
    """A file being rewritten in place (truncated, then written) and reloaded in
    between holds nothing: taken, it would put every option back to its default
    (auth keys gone, every bucket served, no bandwidth cap). It is refused, and
    the running configuration stays."""
    config = tmp_path / "sidecar.toml"
    written = 'max_requests = 64\norigin_bandwidth = "8MiB/s"\naccess_buckets = ["tiered"]\n'
    config.write_text(written)
    with small_sidecar(local_s3, tmp_path, config) as sidecar:
        config.write_text("")
        status, answer = reload(sidecar)
        assert status == 400, answer
        assert f"config file {config} holds no setting any more" in answer["error"]
        assert "running configuration stays" in answer["error"]
        config.write_text(written)
        status, answer = reload(sidecar)
        assert (status, answer) == (200, {"applied": [], "needs_restart": []})
        assert sidecar.alive()


def test_a_keys_file_caught_empty_is_not_taken(local_s3: LocalS3, tmp_path: Path) -> None:
    """An auth_keys_file rewritten in place and reloaded between the truncation
    and the writing holds no key: taken, the brokers' signatures would all be
    refused (403). The reload is refused and the keys in force stay."""
    config = tmp_path / "sidecar.toml"
    keys = tmp_path / "keys"
    keys.write_text("BROKERKEY1:broker-secret-1\n")
    config.write_text(f'max_requests = 64\nauth_keys_file = "{keys}"\n')
    with small_sidecar(local_s3, tmp_path, config) as sidecar:
        keys.write_text("# rotated by config management\n")
        status, answer = reload(sidecar)
        assert status == 400, answer
        assert f"auth_keys_file {keys} holds no key any more" in answer["error"]
        keys.write_text("BROKERKEY1:broker-secret-1\nBROKERKEY2:broker-secret-2\n")
        status, answer = reload(sidecar)
        assert (status, answer["applied"]) == (200, ["auth_keys"]), answer
        assert sidecar.alive()


def test_a_reload_that_opens_every_bucket_warns_as_a_start_does(
    local_s3: LocalS3, bucket: str, tmp_path: Path
) -> None:
    """A start with access_buckets empty warns that every bucket the origin
    credentials reach is served; a reload that empties it does the same, not
    merely 'access_buckets changed'."""
    config = tmp_path / "sidecar.toml"
    config.write_text(f'max_requests = 64\naccess_buckets = ["{bucket}"]\n')
    with small_sidecar(local_s3, tmp_path, config) as sidecar:
        assert not any("access_buckets is empty" in line for line in sidecar.stderr_lines)
        config.write_text("max_requests = 64\n")
        status, answer = reload(sidecar)
        assert (status, answer["applied"]) == (200, ["access_buckets"]), answer
        eventually(lambda: any("access_buckets is empty, so every bucket the origin "
                               "credentials reach is served" in line
                               for line in sidecar.stderr_lines), "the warning")
