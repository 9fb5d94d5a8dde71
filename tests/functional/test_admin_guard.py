"""The admin port's guard on a running sidecar: a token always guards the mutating
calls (generated into a 0600 file when none is configured), their bodies must be
JSON, and off loopback the pages that name objects need the token too, while a
separate metrics listener serves Prometheus without one."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.local_s3 import LocalS3
from tests.support.private_network import PrivateNetwork
from tests.support.processes import SidecarProcess


def call(url: str, method: str = "GET", body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def loopback(url: str) -> str:
    """A URL of a listener bound to 0.0.0.0, reached over loopback."""
    return url.replace("0.0.0.0", "127.0.0.1")


def test_a_token_is_generated_once_kept_private_and_always_required(
    local_s3: LocalS3, tmp_path: Path
) -> None:
    mode_body = json.dumps({"mode": "bypass"}).encode()
    with SidecarProcess(local_s3.endpoint, tmp_path) as sidecar:
        token_file = Path(sidecar.admin_token_file)
        assert token_file == tmp_path / "admin.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = sidecar.admin_token
        assert len(token) >= 40
        mode_url = sidecar.admin_url + "/api/v1/mode"
        purge_url = sidecar.admin_url + "/api/v1/cache/b/k"
        # No token configured, loopback: still refused without the generated one.
        for method, url, body in (("PUT", mode_url, mode_body), ("DELETE", purge_url, None),
                                  ("POST", sidecar.admin_url + "/api/v1/reload", b"")):
            status, _ = call(url, method, body, {"Content-Type": "application/json"})
            assert status == 401, (method, url)
            status, _ = call(url, method, body, bearer("not-" + token))
            assert status == 401, (method, url)
        assert json.loads(call(mode_url)[1])["mode"] == "normal"
        status, answer = call(mode_url, "PUT", mode_body, bearer(token))
        assert status == 200 and json.loads(answer)["requested"] == "bypass"
        assert call(purge_url, "DELETE", None, bearer(token))[0] == 200
    # A restart keeps the token: clients that read the file once keep working.
    with SidecarProcess(local_s3.endpoint, tmp_path) as again:
        assert again.admin_token == token
        assert call(again.admin_url + "/api/v1/mode", "PUT", mode_body, bearer(token))[0] == 200


def test_mutating_bodies_must_be_declared_json(local_s3: LocalS3, tmp_path: Path) -> None:
    with SidecarProcess(local_s3.endpoint, tmp_path) as sidecar:
        token = sidecar.admin_token
        auth = {"Authorization": f"Bearer {token}"}
        warm_body = json.dumps({"objects": [{"bucket": "b", "key": "k"}]}).encode()
        # What a cross-site <form> can send without a CORS preflight.
        for content_type in ("application/x-www-form-urlencoded", "text/plain",
                             "multipart/form-data; boundary=x"):
            for method, path, body in (("POST", "/api/v1/warm", warm_body),
                                       ("PUT", "/api/v1/mode", b'{"mode": "bypass"}'),
                                       ("POST", "/api/v1/reload", b"mode=bypass")):
                status, answer = call(sidecar.admin_url + path, method, body,
                                      {**auth, "Content-Type": content_type})
                assert status == 415, (content_type, path, answer)
                assert "application/json" in json.loads(answer)["error"]
        assert json.loads(call(sidecar.admin_url + "/api/v1/mode")[1])["mode"] == "normal"
        assert sidecar.stats()["warm_calls"] == []


def test_off_loopback_the_pages_need_the_token_and_prometheus_gets_its_own_listener(
    tmp_path: Path
) -> None:
    token_file = tmp_path / "secrets" / "admin.token"
    token_file.parent.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    # The admin port on 0.0.0.0, as in a pod, in a network namespace of its own
    # with its own S3 server: nothing outside the test reaches it. The last
    # --admin-listen wins over the helper's loopback one.
    with PrivateNetwork() as network, LocalS3(network.prefix) as origin, SidecarProcess(
            origin.endpoint, cache, "--admin-listen", "0.0.0.0:0",
            "--metrics-listen", "127.0.0.1:0", env={"SIDECAR_ADMIN_TOKEN_FILE": str(token_file)},
            program=(*network.prefix, sys.executable, "-m", "sidecar")) as sidecar:
        admin = loopback(sidecar.admin_url)
        assert sidecar.admin_url.startswith("http://0.0.0.0:")
        assert sidecar.admin_token_file == str(token_file)
        token = sidecar.admin_token

        def pages() -> None:
            for path in ("/metrics", "/ui", "/api/v1/stats"):
                status, answer = call(admin + path)
                assert status == 401 and b"admin token" in answer, path
                status, answer = call(admin + path,
                                      headers={"Authorization": f"Bearer {token}"})
                assert status == 200, path
            # Probes stay open: the kubelet sends no token.
            assert call(admin + "/healthz")[0] == 200 and call(admin + "/readyz")[0] == 200
            # The metrics listener: counters only, no token, nothing else served.
            status, metrics = call(sidecar.metrics_url + "/metrics")
            assert status == 200 and b"sidecar_requests_total" in metrics
            for path in ("/ui", "/api/v1/stats", "/api/v1/mode"):
                assert call(sidecar.metrics_url + path)[0] == 404, path

        network.run(pages)
        with pytest.raises(OSError):  # from the machine's own network: nothing there
            call(admin + "/healthz")
        # `sidecar stats` finds the token in the file it is given, or fails clearly.
        inside = network.prefix
        stats = run_stats(admin, {"SIDECAR_ADMIN_TOKEN_FILE": str(token_file)}, inside)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["mode"] == "normal"
        refused = run_stats(admin, {}, inside)
        assert refused.returncode == 2 and "401" in refused.stderr


def test_on_loopback_the_tokenless_pages_answer_only_to_loopback_names(
    local_s3: LocalS3, tmp_path: Path
) -> None:
    """A page whose own name was rebound to 127.0.0.1 sends that name in Host:
    the pages served without a token refuse it; what needs the token does not care."""
    with SidecarProcess(local_s3.endpoint, tmp_path) as sidecar:
        port = sidecar.admin_url.rsplit(":", 1)[1]
        rebound = {"Host": f"rebind.attacker.example:{port}"}
        for path in ("/metrics", "/ui", "/api/v1/stats"):
            status, answer = call(sidecar.admin_url + path, headers=rebound)
            assert status == 421, path
            assert b"sidecar_" not in answer and b"loopback Host" in answer, path
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1", "LocalHost"):
                assert call(sidecar.admin_url + path, headers={"Host": host})[0] == 200, host
            # The token opens them under any name, as off loopback.
            assert call(sidecar.admin_url + path,
                        headers={**rebound, **bearer(sidecar.admin_token)})[0] == 200, path
            assert call(sidecar.admin_url + path,
                        headers={**rebound, **bearer("not-the-token")})[0] == 401, path
        # Pages that never take a token, and calls that always need one, are as they were.
        assert call(sidecar.admin_url + "/healthz", headers=rebound)[0] == 200
        mode_url = sidecar.admin_url + "/api/v1/mode"
        body = json.dumps({"mode": "no-prefetch"}).encode()
        assert call(mode_url, "PUT", body, {**rebound, "Content-Type": "application/json"}
                    )[0] == 401
        assert call(mode_url, "PUT", body, {**rebound, **bearer(sidecar.admin_token)}
                    )[0] == 200


def test_a_metrics_listener_on_loopback_answers_only_to_loopback_names(
    local_s3: LocalS3, tmp_path: Path
) -> None:
    """The counters the admin port keeps from a rebound page are kept from it on
    the metrics listener too; Prometheus on the node scrapes it by loopback name."""
    with SidecarProcess(local_s3.endpoint, tmp_path, "--metrics-listen", "127.0.0.1:0"
                        ) as sidecar:
        url = sidecar.metrics_url + "/metrics"
        port = sidecar.metrics_url.rsplit(":", 1)[1]
        status, answer = call(url, headers={"Host": f"rebind.attacker.example:{port}"})
        assert status == 421
        assert b"sidecar_" not in answer and b"loopback Host" in answer
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            status, answer = call(url, headers={"Host": host})
            assert status == 200 and b"sidecar_requests_total" in answer, host


def run_stats(admin: str, env: dict[str, str], prefix: tuple[str, ...] = ()
              ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    return subprocess.run([*prefix, sys.executable, "-m", "sidecar", "stats", "--admin", admin,
                           "--json"],
                          capture_output=True, text=True, timeout=60, env={**clean, **env})


def test_the_token_flag_warns_that_it_shows_in_ps(local_s3: LocalS3, tmp_path: Path) -> None:
    sidecar = SidecarProcess(local_s3.endpoint, tmp_path, "--admin-token", "flag-token-1",
                             env={"SIDECAR_LOG_LEVEL": "WARNING"})
    with sidecar:
        assert sidecar.admin_token_file == "" and not (tmp_path / "admin.token").exists()
        body = json.dumps({"mode": "no-prefetch"}).encode()
        assert call(sidecar.admin_url + "/api/v1/mode", "PUT", body,
                    bearer("flag-token-1"))[0] == 200
    warnings: list[Any] = [line for line in sidecar.stderr_lines if "shows in ps" in line]
    assert len(warnings) == 1 and "SIDECAR_ADMIN_TOKEN" in warnings[0]


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True,
                          text=True, timeout=60, env={**clean, **env})


def test_the_mode_and_purge_commands_find_the_generated_token(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="dir/a b.bin", Body=b"z" * 5000)
    with SidecarProcess(local_s3.endpoint, tmp_path) as sidecar:
        with urllib.request.urlopen(f"{sidecar.data_url}/{bucket}/dir/a%20b.bin") as response:
            assert response.read() == b"z" * 5000
        admin = ["--admin", sidecar.admin_url]
        # On the node: the token is found in the cache dir the sidecar uses.
        on_node = {"SIDECAR_CACHE_DIR": str(tmp_path)}
        shown = run_cli("mode", *admin, env={})
        assert shown.returncode == 0 and json.loads(shown.stdout)["mode"] == "normal"
        refused = run_cli("mode", "bypass", *admin, env={})
        assert refused.returncode == 2 and "no admin token found" in refused.stderr
        wrong = run_cli("mode", "bypass", *admin, env={"SIDECAR_ADMIN_TOKEN": "nope"})
        assert wrong.returncode == 2 and "401" in wrong.stderr
        assert json.loads(call(sidecar.admin_url + "/api/v1/mode")[1])["requested"] == "normal"
        changed = run_cli("mode", "bypass", *admin, env=on_node)
        assert changed.returncode == 0, changed.stderr
        assert json.loads(changed.stdout)["requested"] == "bypass"
        purged = run_cli("purge", bucket, "dir/a b.bin", *admin, env=on_node)
        assert purged.returncode == 0, purged.stderr
        assert json.loads(purged.stdout) == {"purged_blocks": 1}


def test_purge_reaches_a_key_holding_a_line_break(
    local_s3: LocalS3, bucket: str, tmp_path: Path
) -> None:
    # S3 keys may hold CR and LF (the local origin cannot store one, so nothing
    # is cached): the purge must reach its handler, which answers with JSON,
    # not the router's plain-text 404.
    quoted = urllib.parse.quote("dir/line\nbreak\r.bin")
    with SidecarProcess(local_s3.endpoint, tmp_path) as sidecar:
        status, answer = call(f"{sidecar.admin_url}/api/v1/cache/{bucket}/{quoted}", "DELETE",
                              None, bearer(sidecar.admin_token))
        assert status == 200, answer
        assert json.loads(answer) == {"purged_blocks": 0}
