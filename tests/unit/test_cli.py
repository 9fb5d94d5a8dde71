"""Which build runs, and the command line as an operator meets it: --version,
the build-info metric, help for every flag."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sidecar.cli import build_parser, main
from sidecar.telemetry.metrics import Metrics


def test_version_names_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"sidecar {importlib.metadata.version('kafka-cold-sidecar')}")


def test_the_top_level_help_names_every_command() -> None:
    parser = build_parser()
    text = parser.format_help()
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    for name in commands.choices:
        assert name in text.splitlines()[2], f"{name} is missing from the description"


def test_every_flag_of_every_command_says_what_it_is_for() -> None:
    parser = build_parser()
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    silent = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, command in commands.choices.items()
        for action in command._actions
        if action.option_strings and not action.help
    ]
    assert not silent, f"flags without help text: {silent}"


def test_metrics_say_which_build_runs() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    assert registry.get_sample_value("sidecar_build_info", {
        "version": importlib.metadata.version("kafka-cold-sidecar"),
        "python": platform.python_version(),
    }) == 1.0


def test_the_broker_demo_without_the_broker_jars_says_run_make_kafka(tmp_path: Path) -> None:
    # An empty folder as the jars' place: checked before anything is started. A
    # process of its own, as the CLI sets up the root logger.
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "demo", "--broker"], capture_output=True, text=True,
        timeout=60, env={**os.environ, "SIDECAR_KAFKA_LIB": str(tmp_path)})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f"sidecar: error: no Kafka broker jars in {tmp_path}: run `make "
                           "kafka` (Maven fetches them from Maven Central per "
                           "tests/kafka/pom.xml)\n")


@pytest.mark.parametrize(("bucket", "key", "named"), [("b", "", "key"), ("", "k", "bucket")])
def test_purge_of_an_empty_bucket_or_key_says_which(bucket: str, key: str, named: str) -> None:
    """Refused before any call: the admin port's 404 for the path would not say why.
    A process of its own, as the CLI sets up the root logger (in this one, its
    handler would outlive the test's captured stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "purge", "--admin", "127.0.0.1:1", bucket, key],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "SIDECAR_ADMIN_TOKEN": "s3cret"})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"sidecar: error: purge: the {named} is empty\n"
