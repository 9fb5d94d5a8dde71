"""Readers of the deployment files that more than one test module checks, and
kustomize to render them."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from sidecar.config import flatten_sections

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"

# Values an operator might write into credentials.env.
FILLED_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "origin-secret",
    "SIDECAR_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef",
    "SIDECAR_AUTH_KEYS": "kafka-broker:a-long-random-secret",
}


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for document in documents:
        assert document["kind"] not in kinds, f"two {document['kind']}s"
        kinds[document["kind"]] = document
    return kinds


def manifests() -> dict[str, dict[str, Any]]:
    """The base's own manifests (the resources of kustomization.yaml), by kind."""
    documents = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents += yaml.safe_load_all(path.read_text(encoding="utf-8"))
    return by_kind(documents)


def kustomization(directory: Path = KUBE) -> dict[str, Any]:
    result: dict[str, Any] = yaml.safe_load(
        (directory / "kustomization.yaml").read_text(encoding="utf-8"))
    return result


def container() -> dict[str, Any]:
    containers = manifests()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def configmap_toml() -> dict[str, Any]:
    return flatten_sections(tomllib.loads(manifests()["ConfigMap"]["data"]["sidecar.toml"]))


@functools.cache
def renderer_command() -> tuple[str, ...]:
    """`kubectl kustomize`, or a standalone kustomize where kubectl is missing
    (scripts/ensure-kustomize.sh builds it once): never skipped."""
    result = subprocess.run(["sh", str(ROOT / "scripts" / "ensure-kustomize.sh")],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"ensure-kustomize.sh failed:\n{result.stderr}"
    return tuple(result.stdout.split())


def kustomize(renderer: list[str], directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*renderer, str(directory)], capture_output=True,
                          text=True, timeout=120)


def base_copy(tmp_path: Path, components: tuple[str, ...] = ()) -> Path:
    """deploy/kubernetes with a filled credentials.env and the given components on."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy)
    (copy / "credentials.env").write_text(
        "".join(f"{name}={value}\n" for name, value in FILLED_CREDENTIALS.items()))
    if components:
        spec = kustomization(copy)
        spec["components"] = [f"components/{name}" for name in components]
        (copy / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return copy


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
