"""Debian's Prometheus (scripts/ensure-prometheus.sh installs it) scraping one target on
loopback, with the project's rule files loaded and its storage in a temporary folder."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from sidecar.tools.ports import free_port
from tests.support.waiting import eventually

# A scrape and a rule evaluation a second: generous waits, unhurried polls.
WAIT_S = 30.0
POLL_S = 0.2


class Prometheus:
    """Debian's prometheus scraping one target every second, rules loaded, storage in tmp."""

    def __init__(self, directory: Path, target: str, rule_files: list[Path],
                 scrape_configs: list[dict[str, Any]] | None = None) -> None:
        """`scrape_configs`: in place of one job named "sidecar" scraping `target`."""
        self.directory = directory
        self.target = target
        self.rule_files = rule_files
        self.scrape_configs = scrape_configs or [
            {"job_name": "sidecar", "static_configs": [{"targets": [target]}]}]
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        self.directory.mkdir()
        config = self.directory / "prometheus.yml"
        # JSON is YAML: no YAML library needed to write the config.
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": self.scrape_configs,
        }))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(self.directory / "prometheus.log", "wb")
        self._process = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            eventually(self._ready, "prometheus to be ready", WAIT_S, POLL_S)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool | None:
        assert self._process is not None
        if self._process.poll() is not None:
            raise AssertionError("prometheus exited:\n"
                                 + (self.directory / "prometheus.log").read_text())
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                return True if response.status == 200 else None
        except OSError:
            return None

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # a bad query is a 400 with a JSON error
            body = json.load(exc)
            exc.close()
        assert body["status"] == "success", f"{params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
