"""The deployment files: Kubernetes manifests, the systemd unit, the Dockerfile.

Nothing here deploys (no cluster, no docker on the test machines); the tests
check what can be checked offline: the manifests parse and carry the fields
operators rely on, the ConfigMap's sidecar.toml passes `--check-config` with
the Secret's keys, the unit passes `systemd-analyze verify`, and the
Dockerfile's COPY sources, entrypoint and config path match the project.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import OPTIONS, flatten_sections, parse_host_port

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
UNIT = ROOT / "deploy" / "systemd" / "sidecar.service"
DEFAULTS = {option.name: option.default for option in OPTIONS}


def manifests() -> dict[str, dict[str, Any]]:
    by_kind: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert document["kind"] not in by_kind, f"two {document['kind']}s"
            by_kind[document["kind"]] = document
    return by_kind


def container() -> dict[str, Any]:
    containers = manifests()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def configmap_toml() -> dict[str, Any]:
    return flatten_sections(tomllib.loads(manifests()["ConfigMap"]["data"]["sidecar.toml"]))


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SIDECAR_")}
    return {**env, **extra}


def test_kustomization_lists_every_manifest_and_the_image() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = sorted(kustomization["resources"])
    on_disk = sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed == on_disk
    assert [image["name"] for image in kustomization["images"]] == [container()["image"]]


def test_daemonset_probes_annotations_and_ports() -> None:
    daemonset = manifests()["DaemonSet"]
    pod = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    sidecar = container()
    ports = {port["name"]: port["containerPort"] for port in sidecar["ports"]}
    config = configmap_toml()
    assert ports["s3"] == parse_host_port(config["listen"]).port
    assert ports["admin"] == parse_host_port(config["admin_listen"]).port
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["admin"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_resources_are_guaranteed_whole_cpus() -> None:
    resources = container()["resources"]
    assert resources["requests"] == resources["limits"]
    cpu = str(resources["limits"]["cpu"])
    # The static CPU manager pins only integral CPU counts ("2", not "1500m").
    assert cpu.isdigit() and int(cpu) >= 1
    assert resources["limits"]["memory"]


def test_cache_and_config_volumes() -> None:
    pod = manifests()["DaemonSet"]["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container()["volumeMounts"]}
    config = configmap_toml()
    cache = mounts[config["cache_dir"]]
    assert not cache.get("readOnly", False)
    # A dedicated local disk: a hostPath that must already exist (no silent
    # fallback to the root disk) or a local PersistentVolume.
    cache_volume = volumes[cache["name"]]
    assert (cache_volume.get("hostPath", {}).get("type") == "Directory"
            or "persistentVolumeClaim" in cache_volume)
    for protected in config["protect_path"]:
        assert mounts[protected]["readOnly"] is True
    config_mount = next(m for m in mounts.values() if volumes[m["name"]].get("configMap"))
    assert volumes[config_mount["name"]]["configMap"]["name"] == \
        manifests()["ConfigMap"]["metadata"]["name"]
    items = volumes[config_mount["name"]]["configMap"]["items"]
    assert {item["key"] for item in items} == {"sidecar.toml"}
    config_path = f"{config_mount['mountPath']}/{items[0]['path']}"
    assert container()["args"] == ["serve", "--config", config_path]
    assert config_path == dockerfile()["CMD"][-1]


def test_security_context_and_scheduling() -> None:
    everything = manifests()
    pod = everything["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    security = container()["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    # nice > 0 and ionice best-effort/idle (sidecar/isolation/host.py) need no capability.
    assert security["capabilities"] == {"drop": ["ALL"]}
    config = configmap_toml()
    assert int(config.get("nice", 0)) >= 0
    assert not str(config.get("ionice", "")).startswith("realtime")
    assert 10 <= pod["terminationGracePeriodSeconds"] <= 120
    assert pod["priorityClassName"] == everything["PriorityClass"]["metadata"]["name"]
    assert everything["PriorityClass"]["preemptionPolicy"] == "Never"


def test_service_is_node_local_and_selects_the_pods() -> None:
    everything = manifests()
    service = everything["Service"]["spec"]
    assert service["internalTrafficPolicy"] == "Local"
    labels = everything["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    port_names = {port["name"] for port in container()["ports"]}
    assert {port["targetPort"] for port in service["ports"]} <= port_names


def test_secret_keys_referenced_by_the_daemonset_exist() -> None:
    everything = manifests()
    secret = everything["Secret"]
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    references = [env["valueFrom"]["secretKeyRef"] for env in container()["env"]
                  if "secretKeyRef" in env.get("valueFrom", {})]
    assert {ref["name"] for ref in references} == {secret["metadata"]["name"]}
    assert {ref["key"] for ref in references} <= keys
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SIDECAR_ADMIN_TOKEN",
            "SIDECAR_AUTH_KEYS"} <= {ref["key"] for ref in references}
    # Secrets never in the ConfigMap.
    text = everything["ConfigMap"]["data"]["sidecar.toml"]
    assert all(str(value) not in text for value in secret["stringData"].values())


def test_configmap_toml_passes_check_config_with_the_secret(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(manifests()["ConfigMap"]["data"]["sidecar.toml"], encoding="utf-8")
    secret = {k: str(v) for k, v in manifests()["Secret"]["stringData"].items()}
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--check-config"],
        capture_output=True, text=True, timeout=60, env=clean_env(**secret),
    )
    assert result.returncode == 0, result.stderr
    assert 'admin_token = "<set>"' in result.stdout and 'auth_keys = "<set>"' in result.stdout
    assert "CHANGE-ME" not in result.stdout + result.stderr
    # Without the Secret the same file is refused: the admin port is off loopback.
    refused = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--check-config"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )
    assert refused.returncode == 2 and "admin-token" in refused.stderr


# --- systemd ---------------------------------------------------------------

REQUIRED_UNIT_KEYS = {
    "ExecStart", "EnvironmentFile", "Restart", "CPUAffinity", "IOSchedulingClass",
    "IOSchedulingPriority", "Nice", "MemoryMax", "LimitNOFILE", "NoNewPrivileges",
    "ProtectSystem", "ReadWritePaths", "PrivateTmp", "ProtectHome", "ProtectKernelTunables",
    "ProtectKernelModules", "ProtectControlGroups", "RestrictAddressFamilies",
    "SystemCallArchitectures", "CapabilityBoundingSet",
}


def unit_keys(text: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            name, _, value = line.partition("=")
            keys[name.strip()] = value.strip()
    return keys


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    result = subprocess.run(["sh", str(ROOT / "scripts" / "ensure-systemd.sh")],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"ensure-systemd.sh failed:\n{result.stdout}{result.stderr}"
    return "systemd-analyze"


def verify(systemd_analyze: str, text: str, directory: Path) -> subprocess.CompletedProcess[str]:
    unit = directory / "kafka-sidecar.service"
    unit.write_text(text, encoding="utf-8")
    return subprocess.run([systemd_analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60)


def installed_copy() -> str:
    # `systemd-analyze verify` checks that ExecStart's binary exists; the unit
    # names /opt/kafka-sidecar/bin/sidecar, so verify a copy that runs this
    # venv's console script instead, with the same arguments.
    text = UNIT.read_text(encoding="utf-8")
    console_script = Path(sys.executable).parent / "sidecar"
    assert console_script.exists()
    copy, count = re.subn(r"^ExecStart=\S+", f"ExecStart={console_script}", text, flags=re.M)
    assert count == 1
    return copy


def test_systemd_unit_verifies(systemd_analyze: str, tmp_path: Path) -> None:
    result = verify(systemd_analyze, installed_copy(), tmp_path)
    # verify exits 0 on unknown keys and bad values too, and says so on stderr.
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_systemd_verify_would_catch_a_broken_unit(systemd_analyze: str, tmp_path: Path) -> None:
    broken = installed_copy().replace("IOSchedulingClass=best-effort", "IOSchedulingClass=bogus")
    result = verify(systemd_analyze, broken, tmp_path)
    assert result.returncode != 0 or "IO scheduling class" in result.stderr


def test_systemd_unit_carries_isolation_and_hardening() -> None:
    keys = unit_keys(UNIT.read_text(encoding="utf-8"))
    missing = sorted(REQUIRED_UNIT_KEYS - set(keys))
    assert not missing, missing
    command = keys["ExecStart"].split()
    assert command[1:4] == ["serve", "--config", "/etc/kafka-sidecar/sidecar.toml"]
    # The cache dir it serves from is the one it may write and the mount it waits for.
    cache_dir = command[command.index("--cache-dir") + 1]
    assert cache_dir in keys["ReadWritePaths"].split()
    assert cache_dir in keys["RequiresMountsFor"].split()
    assert keys["ProtectSystem"] == "strict" and keys["NoNewPrivileges"] == "yes"
    assert keys["CapabilityBoundingSet"] == ""  # nothing the sidecar calls needs one
    assert set(keys["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert keys["Restart"] == "on-failure"
    # Config errors (2) are not retried; an unreachable origin (75) is.
    assert keys["RestartPreventExitStatus"].split() == ["2"]
    assert "DynamicUser" in keys or keys.get("User") not in (None, "", "root")


# --- Dockerfile ------------------------------------------------------------

def dockerfile() -> dict[str, Any]:
    """The instructions of the Dockerfile (continuation lines joined); JSON forms parsed."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)
    parsed: dict[str, Any] = {"COPY": [], "RUN": [], "FROM": []}
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if instruction in ("COPY", "RUN", "FROM"):
            parsed[instruction].append(rest)
        elif instruction in ("ENTRYPOINT", "CMD"):
            parsed[instruction] = json.loads(rest)
        else:
            parsed[instruction] = rest
    return parsed


def dockerignored(path: str) -> bool:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") or path == p
               for p in patterns)


def test_dockerfile_copies_what_exists_and_is_not_ignored() -> None:
    instructions = dockerfile()
    assert instructions["FROM"] == ["python:3.11-slim"]
    sources = [source for copy in instructions["COPY"] for source in copy.split()[:-1]]
    assert "sidecar" in sources and "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source), f"{source} is COPYed but excluded by .dockerignore"
    assert dockerignored(".venv") and dockerignored("tests")
    # The package only: no extras (tests, Spark) in the image.
    installs = [run for run in instructions["RUN"] if "pip install" in run]
    assert installs and all("[" not in run for run in installs)


def test_dockerfile_entrypoint_user_and_ports() -> None:
    instructions = dockerfile()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert instructions["ENTRYPOINT"] == ["sidecar"] and "sidecar" in scripts
    assert instructions["CMD"][:2] == ["serve", "--config"]
    assert instructions["USER"].split(":")[0] not in ("", "0", "root")
    exposed = sorted(int(port) for port in instructions["EXPOSE"].split())
    assert exposed == sorted(parse_host_port(DEFAULTS[name]).port
                             for name in ("listen", "admin_listen"))
