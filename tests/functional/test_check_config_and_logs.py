"""`sidecar serve --check-config` and the structured logs of a running sidecar."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import OPTIONS
from sidecar.tools.local_s3 import LocalS3
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.processes import SidecarProcess

ROOT = Path(__file__).resolve().parents[2]
SECRET = "tok-3f9a1c-do-not-print"


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SIDECAR_")}
    return {**env, **extra}


def sidecar_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A loopback socket that listens but never accepts: connecting to it would queue."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def test_example_toml_passes_check_config() -> None:
    result = sidecar_cli("serve", "--config", str(ROOT / "sidecar.example.toml"),
                         "--check-config", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert 'cache_dir = "/var/cache/kafka-sidecar"' in result.stdout
    assert result.stderr == ""


def test_check_config_merges_every_source_and_touches_nothing(
    tmp_path: Path, listening: socket.socket
) -> None:
    port = listening.getsockname()[1]
    cache_dir = tmp_path / "not-created"
    config = tmp_path / "sidecar.toml"
    config.write_text('cache_size = "2GiB"\nblock_size = "4MiB"\n[auth]\nallow_anonymous = true\n')
    result = sidecar_cli(
        "serve", "--config", str(config), "--check-config",
        # A data port already taken and an origin that would queue a connection:
        # serve would fail to bind, and a contact with the origin would show.
        "--listen", f"127.0.0.1:{port}", "--origin-endpoint", f"http://127.0.0.1:{port}",
        "--cache-dir", str(cache_dir), "--block-size", "1MiB",
        env=clean_env(SIDECAR_ADMIN_TOKEN=SECRET, SIDECAR_ORIGIN_REGION="eu-west-1"),
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split(" = ")[0]: line for line in result.stdout.splitlines()
             if " = " in line and not line.startswith("#")}
    assert sorted(lines) == sorted(option.name for option in OPTIONS)
    assert lines["block_size"].endswith("# flag --block-size")  # flag beats file
    assert lines["cache_size"].endswith(f"# file {config}")
    assert lines["origin_region"].endswith("# env SIDECAR_ORIGIN_REGION")
    assert lines["auth_allow_anonymous"].startswith("auth_allow_anonymous = true")
    assert lines["admin_token"].startswith('admin_token = "<set>"')
    assert lines["max_requests"].endswith("# default")
    assert SECRET not in result.stdout + result.stderr
    assert not cache_dir.exists()
    with pytest.raises(BlockingIOError):
        listening.accept()  # nobody connected to the "origin"


def test_check_config_reports_a_bad_value_in_one_line(tmp_path: Path) -> None:
    result = sidecar_cli("serve", "--cache-dir", str(tmp_path), "--check-config",
                         env=clean_env(SIDECAR_LOG_FORMAT="yaml"))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "SIDECAR_LOG_FORMAT" in lines[0] and "unknown log format" in lines[0]


def _records(lines: list[str]) -> list[dict[str, Any]]:
    records = []
    for line in lines:
        if line.strip():
            record = json.loads(line)  # every stderr line is one JSON object
            assert {"ts", "level", "logger", "msg"} <= set(record), record
            records.append(record)
    return records


def test_a_running_sidecar_logs_json_with_config_and_mode(
    tmp_path: Path, local_s3: LocalS3
) -> None:
    env = {"SIDECAR_LOG_LEVEL": "INFO", "SIDECAR_ADMIN_TOKEN": SECRET}
    with SidecarProcess(local_s3.endpoint, tmp_path, "--cache-size", "64MiB", env=env) as sidecar:
        request = urllib.request.Request(
            sidecar.admin_url + "/api/v1/mode", method="PUT",
            data=json.dumps({"mode": "cache-only"}).encode(),
            headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["mode"] == "cache-only"
    records = _records(sidecar.stderr_lines)
    assert SECRET not in "".join(sidecar.stderr_lines)
    started = [r for r in records if r.get("event") == "started"]
    assert len(started) == 1
    config = started[0]["config"]
    assert config["admin_token"] == "<set>" and config["cache_dir"] == str(tmp_path)
    assert config["cache_size"] == "64MiB" and started[0]["data_url"] == sidecar.data_url
    assert started[0]["ts"].endswith("Z") and started[0]["level"] == "INFO"
    changes = [r for r in records if r.get("mode") == "cache-only"]
    assert any(r["logger"] == "sidecar.server" and "mode changed" in r["msg"] for r in changes)
    assert any(r.get("requested_mode") == "cache-only" for r in changes)


def test_what_a_request_causes_is_logged_with_its_request_id(
    tmp_path: Path, local_s3: LocalS3, origin_s3: Any, bucket: str
) -> None:
    """The origin fetch a request starts runs in a task of its own; its warning
    still names the request, by the id the client got in x-amz-request-id."""
    origin_s3.put_object(Bucket=bucket, Key="k.log", Body=os.urandom(100_000))
    env = {"SIDECAR_PREFETCH": "false", "SIDECAR_ORIGIN_DEADLINE": "1s",
           "SIDECAR_ORIGIN_BREAKER_FAILURES": "0"}
    with FaultProxy(local_s3.endpoint) as proxy, SidecarProcess(
        proxy.endpoint, tmp_path, "--block-size", "64KiB", "--cache-size", "4MiB", env=env
    ) as sidecar:
        proxy.add(Fault("status", status=500, code="InternalError"), method="GET", key="k.log",
                  times=None)
        request = urllib.request.Request(f"{sidecar.data_url}/{bucket}/k.log",
                                         headers={"Range": "bytes=0-99"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 503
        request_id = caught.value.headers["x-amz-request-id"]
        caught.value.close()
    records = _records(sidecar.stderr_lines)
    mine = [r for r in records if r.get("request_id") == request_id]
    assert any(r["level"] == "WARNING" and f"s3://{bucket}/k.log" in r["msg"] for r in mine), \
        records
    # Lines of no request (start-up, shutdown) carry none.
    assert all(r.get("request_id") in (None, request_id) for r in records)


def test_log_format_text_is_plain_lines(tmp_path: Path, local_s3: LocalS3) -> None:
    env = {"SIDECAR_LOG_LEVEL": "INFO"}
    with SidecarProcess(local_s3.endpoint, tmp_path, "--log-format", "text", env=env) as sidecar:
        pass
    lines = [line for line in sidecar.stderr_lines if line.strip()]
    started = [line for line in lines if " INFO sidecar.server: serving S3 reads on " in line]
    assert len(started) == 1 and not any(line.startswith("{") for line in lines)
    assert " event=started " in started[0] and '"admin_token": "<unset>"' in started[0]


_PROBE = (
    "import logging; from sidecar.cli import configure_logging; configure_logging('auto'); "
    "logging.getLogger('sidecar.probe').warning('disk %s', 'full', extra={'mode': 'bypass'})"
)


def test_auto_logs_text_to_a_terminal_and_json_to_a_pipe() -> None:
    leader, follower = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", _PROBE], stderr=follower, timeout=60,
                       env=clean_env(), check=True)
        os.close(follower)
        follower = -1
        output = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO once the terminal's other end is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    text = output.decode().strip()
    assert not text.startswith("{")
    assert text.endswith("WARNING sidecar.probe: disk full mode=bypass")
    piped = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                           timeout=60, env=clean_env(), check=True)
    record = json.loads(piped.stderr)
    assert (record["msg"], record["mode"], record["level"]) == ("disk full", "bypass", "WARNING")


def test_a_sidecar_on_ipv6_loopback_announces_urls_clients_and_stats_can_use(
    tmp_path: Path, local_s3: LocalS3, origin_s3: Any, bucket: str
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="k", Body=b"v6" * 1000)
    env = {"SIDECAR_LOG_LEVEL": "INFO"}
    with SidecarProcess(local_s3.endpoint, tmp_path, "--listen", "[::1]:0",
                        "--admin-listen", "[::1]:0", env=env) as sidecar:
        assert sidecar.data_url.startswith("http://[::1]:")
        assert sidecar.admin_url.startswith("http://[::1]:")
        with urllib.request.urlopen(sidecar.admin_url + "/healthz", timeout=10) as response:
            assert response.status == 200
        request = urllib.request.Request(f"{sidecar.data_url}/{bucket}/k",
                                         headers={"Range": "bytes=0-9"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 206 and response.read() == b"v6" * 5
        # `sidecar stats` takes the admin address as the sidecar printed it, or
        # without its scheme.
        stats = sidecar_cli("stats", "--admin", sidecar.admin_url.removeprefix("http://"),
                            "--json", env=clean_env())
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["served_bytes"]["origin"] >= 10
    started = [r for r in _records(sidecar.stderr_lines) if r.get("event") == "started"]
    assert started and started[0]["data_url"] == sidecar.data_url


@pytest.mark.parametrize("command", [("--check-config",), ()])
def test_a_file_value_of_the_wrong_type_stops_serve_in_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(f'cache_dir = "{tmp_path / "cache"}"\nprotect_path = 5\n')
    result = sidecar_cli("serve", "--config", str(config), "--listen", "127.0.0.1:0",
                         "--admin-listen", "127.0.0.1:0", *command, env=clean_env())
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"sidecar: error: {config}: config key protect_path: takes an array of strings, "
        "got an integer: 5"]
    assert not (tmp_path / "cache").exists()
