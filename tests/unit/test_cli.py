"""Which build runs, and the command line as an operator meets it: --version,
the build-info metric, help for every flag."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform

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
