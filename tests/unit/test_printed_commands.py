"""Commands the tools print name this environment's programs as a shell here finds
them (sidecar.tools.commands)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sidecar.tools.commands import program, python_module

BIN = Path(sys.executable).parent


def test_a_program_not_on_path_is_named_by_its_path(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(BIN.parent.parent)  # the checkout holding .venv, say
    assert program("sidecar") == str(BIN.relative_to(Path.cwd()) / "sidecar")
    monkeypatch.chdir(tmp_path)  # elsewhere: the whole path
    assert program("sidecar") == str(BIN / "sidecar")


def test_a_program_the_path_finds_is_named_bare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert program("sidecar") == "sidecar"
    assert python_module("spark_warmup") == "python -m spark_warmup"


def test_another_program_of_the_same_name_on_path_is_not_this_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = tmp_path / "sidecar"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert program("sidecar") == str(BIN / "sidecar")
