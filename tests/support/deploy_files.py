"""Readers of the deployment files that more than one test module checks."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def dockerfile_stages() -> list[dict[str, Any]]:
    """The instructions of each stage of the Dockerfile (continuation lines joined;
    JSON forms parsed), in order."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)
    stages: list[dict[str, Any]] = []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if instruction == "FROM":
            image, _, name = rest.partition(" AS ")
            stages.append({"FROM": image, "AS": name, "COPY": [], "RUN": []})
        elif instruction in ("COPY", "RUN"):
            stages[-1][instruction].append(rest)
        elif instruction in ("ENTRYPOINT", "CMD"):
            stages[-1][instruction] = json.loads(rest)
        else:
            stages[-1][instruction] = rest
    return stages


def context_sources() -> list[str]:
    """What the Dockerfile copies from the build context (not from another stage)."""
    return [source for stage in dockerfile_stages() for copy in stage["COPY"]
            if not copy.startswith("--from=") for source in copy.split()[:-1]]


def wheel_name() -> str:
    """The file name of the wheel `make dist` builds (PEP 427: the project name with
    runs of -_. as _, the version, a pure-Python tag)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return f"{re.sub(r'[-_.]+', '_', project['name'])}-{project['version']}-py3-none-any.whl"
