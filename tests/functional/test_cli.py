"""`sidecar serve` start-up failures: one clear line on stderr; exit code 2 for
what the operator must fix, 75 for an origin that may come back by itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.tools.local_s3 import CREDENTIALS, LocalS3


def run_sidecar(*args: str, timeout: float = 60, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args], capture_output=True, text=True,
        timeout=timeout, env=env if env is not None else {**os.environ, **CREDENTIALS},
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_args(origin: str, cache_dir: Path, *extra: str) -> list[str]:
    return ["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--origin-endpoint", origin, "--cache-dir", str(cache_dir), *extra]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--cache-size", "12 parsecs"], "--cache-size: not a size"),
        (["--block-size", "3000"], "--block-size must be a multiple"),
        (["--cpus", "9-1"], "not a CPU list"),
        (["--listen", "127.0.0.1:99999"], "not a HOST:PORT"),
        (["--cpus", "4096"], "CPUs this machine does not have"),
        (["--origin-endpoint", "http://[::1"], "not a URL: 'http://[::1' (Invalid IPv6 URL)"),
        (["--origin-endpoint", "ftp://x"], "not an http(s) URL: 'ftp://x'"),
        (["--cache-size", "9" * 400], "too large a size"),
    ],
)
def test_bad_flags(tmp_path: Path, local_s3: LocalS3, extra: list[str], message: str) -> None:
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path, *extra))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize(
    "args",
    [["stats", "--admin", "http://[::1"], ["mode", "bypass", "--admin", "ftp://x"],
     ["replay", "--endpoint", "http://[::1", "--bucket", "b"],
     ["replay", "--endpoint", "http://127.0.0.1:9", "--bucket", "b",
      "--list-endpoint", "http://h:99999"]],
)
def test_a_client_given_a_bad_url_says_which(args: list[str]) -> None:
    result = run_sidecar(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert "argument --" in lines[-1] and "URL" in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--listen", "127.0.0.1:99999"], "argument --listen: not a HOST:PORT"),
     (["--seconds", "-1"], "argument --seconds: not a positive number"),
     (["--seconds", "nan"], "argument --seconds: not a positive number")],
)
def test_a_demo_that_cannot_run_makes_nothing(tmp_path: Path, args: list[str],
                                              message: str) -> None:
    """Refused before its run directory is made: no "Kept after the demo" for
    a demo that never ran."""
    result = run_sidecar("demo", *args, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Kept after the demo" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_memory_tier_the_machine_cannot_give_is_named(tmp_path: Path,
                                                         local_s3: LocalS3) -> None:
    """Not "cannot create a cache": the disk cache is not what failed."""
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path),
                         env={**os.environ, **CREDENTIALS, "SIDECAR_MEMORY_TIER": "100TiB"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot set up a 109951162777600-byte memory_tier" in lines[0], \
        result.stderr
    assert "bytes of memory this machine or container has" in lines[0], result.stderr


def test_unreachable_origin_is_worth_a_retry(tmp_path: Path) -> None:
    """75 (EX_TEMPFAIL), not 2: the systemd unit restarts on it, not on config errors."""
    origin = f"http://127.0.0.1:{closed_port()}"
    result = run_sidecar(*serve_args(origin, tmp_path))
    assert result.returncode == 75
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"origin {origin} unreachable" in lines[0], result.stderr


def test_no_credentials_yet_is_worth_a_retry(tmp_path: Path, local_s3: LocalS3) -> None:
    """No credentials in any source botocore knows (env, files, instance metadata):
    an instance role's metadata service may not be up yet, so 75, not 2."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path), env=env)
    assert result.returncode == 75
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no origin credentials found" in lines[0], result.stderr


@pytest.mark.parametrize(
    ("cache_dir", "message"),
    [("missing", "does not exist"), ("/proc", "is not writable"), ("file", "not a directory")],
)
def test_unusable_cache_dir(
    tmp_path: Path, local_s3: LocalS3, cache_dir: str, message: str
) -> None:
    (tmp_path / "file").write_text("x")
    path = cache_dir if cache_dir.startswith("/") else str(tmp_path / cache_dir)
    result = run_sidecar(*serve_args(local_s3.endpoint, Path(path)))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_cache_on_a_protected_device_is_refused(tmp_path: Path, local_s3: LocalS3) -> None:
    log_dirs = tmp_path / "kafka-logs"
    log_dirs.mkdir()
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path, "--protect-path", str(log_dirs)))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "same device" in lines[0] and "--allow-shared-disk" in lines[0]


def test_config_file_and_env(tmp_path: Path, local_s3: LocalS3) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text('cache_size = "1MiB"\n')
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path, "--config", str(config)))
    assert result.returncode == 2 and "cannot hold one block" in result.stderr
    config.write_text('cache_sizes = "1GiB"\n')
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path, "--config", str(config)))
    assert result.returncode == 2 and "unknown config key 'cache_sizes'" in result.stderr
    # Named with its file, which SIDECAR_CONFIG may have chosen out of sight.
    result = run_sidecar(*serve_args(local_s3.endpoint, tmp_path),
                         env={**os.environ, **CREDENTIALS, "SIDECAR_CONFIG": str(config)})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"sidecar: error: {config}: unknown config key 'cache_sizes'; did you mean 'cache_size'?"]
