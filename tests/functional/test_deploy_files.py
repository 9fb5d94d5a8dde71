"""The deployment files: Kubernetes manifests, the systemd unit, the Dockerfile.

Nothing here deploys (no cluster, no docker on the test machines); the tests
check what can be checked offline: the manifests parse and carry the fields
operators rely on, kustomize (`kubectl kustomize`, or where kubectl is missing a
standalone kustomize that scripts/ensure-kustomize.sh builds from its Go module)
renders them with and without the optional components and refuses to render
without the operator's credentials, the ConfigMap's sidecar.toml passes
`--check-config` with the credentials' keys, the unit passes `systemd-analyze
verify`, and the Dockerfile's COPY sources, entrypoint and config path match
the project.
"""

from __future__ import annotations

import base64
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import OPTIONS, parse_host_port
from tests.support.deploy_files import (
    FILLED_CREDENTIALS,
    KUBE,
    ROOT,
    base_copy,
    by_kind,
    configmap_toml,
    container,
    context_sources,
    dockerfile_stages,
    kustomization,
    kustomize,
    manifests,
    renderer_command,
    wheel_name,
)
from tests.support.installs import ensure

COMPONENTS = KUBE / "components"
CREDENTIALS_EXAMPLE = KUBE / "credentials.env.example"
RULES = ROOT / "deploy" / "prometheus" / "sidecar-rules.yml"
UNIT = ROOT / "deploy" / "systemd" / "kafka-sidecar.service"
DEFAULTS = {option.name: option.default for option in OPTIONS}


def env_file(path: Path) -> dict[str, str]:
    """KEY=value lines as kustomize's secretGenerator reads them (# comments, blanks skipped)."""
    pairs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, separator, value = line.partition("=")
            assert separator, line
            pairs[name.strip()] = value
    return pairs


def secret_references() -> list[dict[str, Any]]:
    return [env["valueFrom"]["secretKeyRef"] for env in container()["env"]
            if "secretKeyRef" in env.get("valueFrom", {})]


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SIDECAR_")}
    return {**env, **extra}


def test_kustomization_lists_every_manifest_and_the_image() -> None:
    base = kustomization()
    listed = sorted(base["resources"])
    on_disk = sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed == on_disk
    # The DaemonSet's image first, then the one components/warmup's Job and CronJob run.
    images = [image["name"] for image in base["images"]]
    assert images[0] == container()["image"]
    used = {box["image"] for path in COMPONENTS.rglob("*.yaml")
            for document in yaml.safe_load_all(path.read_text(encoding="utf-8"))
            for box in _containers(document) if "image" in box}  # patches name no image
    assert set(images[1:]) == used - {container()["image"]}
    # The optional parts stay optional: a plain `kubectl apply -k` enables none.
    assert "components" not in base
    for component in sorted(COMPONENTS.iterdir()):
        assert f"components/{component.name}" in (KUBE / "kustomization.yaml").read_text()


def _containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a workload's pod template (Job, CronJob, DaemonSet...)."""
    spec = document.get("spec", {})
    spec = spec.get("jobTemplate", {}).get("spec", spec)
    containers: list[dict[str, Any]] = spec.get("template", {}).get("spec", {}).get(
        "containers", [])
    return containers


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
    # Prometheus scrapes the token-free metrics listener: off loopback the admin
    # port's /metrics wants the admin token.
    assert ports["metrics"] == parse_host_port(config["metrics_listen"]).port
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_startup_probe_allows_what_the_readme_says_start_up_takes() -> None:
    """README.md's warm restart serves within a second, whatever the cache's size:
    the probe gives a minute, not the minutes a scan before serving would need, and
    its comment says the same as the README."""
    probe = container()["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    assert 30 <= budget <= 120, budget
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "**Warm restart.**" in readme and "serves within 0.1 s" in readme
    text = (KUBE / "daemonset.yaml").read_text(encoding="utf-8")
    start = text.index("startupProbe:")
    comment = " ".join(line.strip().lstrip("# ") for line in
                       text[start:text.index("httpGet:", start)].splitlines())
    assert '"Warm restart"' in comment and "within a second" in comment, comment
    assert "slot header of the slab to rebuild" not in comment


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
    # The cache disk is the only host path a pod needs to start: the brokers'
    # log.dirs live in different places on different clusters
    # (components/protect-log-dirs mounts them).
    assert [name for name, volume in volumes.items() if "hostPath" in volume] == [cache["name"]]
    assert "protect_path" not in config
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


def test_the_secret_is_generated_from_the_operators_credentials_file() -> None:
    """`kubectl apply -k` deploys no Secret of placeholders: the Secret is made
    from credentials.env, which the operator writes and git never sees."""
    generators = kustomization()["secretGenerator"]
    assert [generator["envs"] for generator in generators] == [["credentials.env"]]
    references = secret_references()
    assert {ref["name"] for ref in references} == {generators[0]["name"]}
    for path in KUBE.rglob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        assert "CHANGE-ME" not in text, path
        assert all(document["kind"] != "Secret" for document in yaml.safe_load_all(text)), path
    ignored = subprocess.run(["git", "check-ignore", "-q", str(KUBE / "credentials.env")],
                             cwd=ROOT, timeout=30)
    assert ignored.returncode == 0, "deploy/kubernetes/credentials.env must be git-ignored"


def test_credentials_example_names_every_key_the_daemonset_reads() -> None:
    example = env_file(CREDENTIALS_EXAMPLE)
    references = secret_references()
    assert {ref["key"] for ref in references} == set(example)
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SIDECAR_ADMIN_TOKEN",
            "SIDECAR_AUTH_KEYS"} <= set(example)
    # No value to forget: an unedited copy is refused at start (the next test).
    assert set(example.values()) == {""}
    # Only the origin credentials may be left out (IRSA, Pod Identity).
    optional = {ref["key"] for ref in references if ref.get("optional")}
    assert optional == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_configmap_toml_passes_check_config_with_the_credentials(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(manifests()["ConfigMap"]["data"]["sidecar.toml"], encoding="utf-8")
    # Secrets never in the ConfigMap.
    secrets = {option.name for option in OPTIONS if option.secret}
    assert secrets and not secrets & set(configmap_toml())
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--check-config"],
        capture_output=True, text=True, timeout=60, env=clean_env(**FILLED_CREDENTIALS),
    )
    assert result.returncode == 0, result.stderr
    assert 'admin_token = "<set>"' in result.stdout and 'auth_keys = "<set>"' in result.stdout
    # An unedited copy of the example, and no credentials at all, are refused:
    # the admin port is off loopback.
    for env in (clean_env(**env_file(CREDENTIALS_EXAMPLE)), clean_env()):
        refused = subprocess.run(
            [sys.executable, "-m", "sidecar", "serve", "--config", str(config),
             "--check-config"], capture_output=True, text=True, timeout=60, env=env,
        )
        assert refused.returncode == 2 and "admin-token" in refused.stderr


def tolerated(tolerations: list[dict[str, Any]], key: str, value: str, effect: str) -> bool:
    """Whether a pod with `tolerations` may run on a node tainted key=value:effect
    (the rules of the Kubernetes scheduler's TaintToleration)."""
    for toleration in tolerations:
        operator = toleration.get("operator", "Equal")
        if toleration.get("key", "") not in ("", key):
            continue
        if not toleration.get("key") and operator != "Exists":
            continue
        if toleration.get("effect", "") not in ("", effect):
            continue
        if operator == "Exists" or toleration.get("value", "") == value:
            return True
    return False


def test_daemonset_tolerates_tainted_kafka_nodes() -> None:
    tolerations = manifests()["DaemonSet"]["spec"]["template"]["spec"]["tolerations"]
    assert tolerated(tolerations, "dedicated", "kafka", "NoSchedule")
    # The example is one taint, not every taint: a node kept for other work stays so.
    assert not tolerated(tolerations, "dedicated", "gpu", "NoSchedule")
    assert not tolerated(tolerations, "other", "kafka", "NoSchedule")
    assert not tolerated(tolerations, "dedicated", "kafka", "NoExecute")
    assert "tolerations" in (ROOT / "deploy" / "README.md").read_text()


def component(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A component's kustomization and the documents it adds or patches with."""
    directory = COMPONENTS / name
    spec = kustomization(directory)
    assert spec["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert spec["kind"] == "Component"
    files = spec.get("resources", []) + [patch["path"] for patch in spec.get("patches", [])]
    documents = [document for file in files
                 for document in yaml.safe_load_all((directory / file).read_text())]
    return spec, documents


def test_protect_log_dirs_component_mounts_what_it_protects() -> None:
    _, (patch,) = component("protect-log-dirs")
    base = manifests()["DaemonSet"]
    assert (patch["kind"], patch["metadata"]["name"]) == ("DaemonSet", base["metadata"]["name"])
    pod = patch["spec"]["template"]["spec"]
    (patched,) = pod["containers"]
    assert patched["name"] == container()["name"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in patched["volumeMounts"]}
    env = {item["name"]: item["value"] for item in patched["env"]}
    protect_env = next(option.env for option in OPTIONS if option.name == "protect_path")
    protected = env[protect_env].split(",")
    assert sorted(protected) == sorted(mounts)
    for path in protected:
        assert mounts[path]["readOnly"] is True
        # Named by the operator, so it must be there: never created on the root disk.
        assert volumes[mounts[path]["name"]]["hostPath"]["type"] == "Directory"
    base_names = {volume["name"] for volume in base["spec"]["template"]["spec"]["volumes"]}
    assert not set(volumes) & base_names


def test_podmonitor_component_scrapes_the_metrics_listener_under_the_alerted_job() -> None:
    _, (monitor,) = component("podmonitor")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    labels = manifests()["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    ports = {port["name"]: port["containerPort"] for port in container()["ports"]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert ports[endpoint["port"]] == parse_host_port(configmap_toml()["metrics_listen"]).port
    assert endpoint["path"] == "/metrics"
    # The job label it gives is one the SidecarDown alert knows.
    job = labels[spec["jobLabel"]]
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (down,) = [rule for group in rules["groups"] for rule in group["rules"]
               if rule.get("alert") == "SidecarDown"]
    pattern = re.search(r'up\{job=~"([^"]+)"\}', down["expr"])
    assert pattern, down["expr"]
    # Prometheus anchors label regexes at both ends.
    assert re.fullmatch(pattern[1], job)
    assert re.fullmatch(pattern[1], f"kafka/{monitor['metadata']['name']}")
    assert re.fullmatch(pattern[1], "sidecar")
    assert not re.fullmatch(pattern[1], "kubernetes-pods")


def test_annotation_scraped_pods_carry_the_label_sidecar_down_matches() -> None:
    """Under annotation-based scraping every pod shares one job; the alert knows the
    sidecar's targets by the pod label that job maps onto them (Prometheus' labelmap
    of __meta_kubernetes_pod_label_<name>, <name> with each character outside
    [a-zA-Z0-9_] made "_")."""
    template = manifests()["DaemonSet"]["spec"]["template"]
    annotations, labels = template["metadata"]["annotations"], template["metadata"]["labels"]
    ports = {port["name"]: port["containerPort"] for port in container()["ports"]}
    assert annotations["prometheus.io/scrape"] == "true"
    # The token-free metrics listener: off loopback the admin port's /metrics is guarded.
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (down,) = [rule for group in rules["groups"] for rule in group["rules"]
               if rule.get("alert") == "SidecarDown"]
    matchers = re.findall(r'up\{(\w+)="([^"]+)"\} == 0', down["expr"])
    assert matchers, down["expr"]
    mapped = {re.sub(r"[^a-zA-Z0-9_]", "_", name): value for name, value in labels.items()}
    for name, value in matchers:
        assert mapped.get(name) == value, (name, value, mapped)


# --- kustomize --------------------------------------------------------------

@pytest.fixture(scope="module")
def renderer() -> list[str]:
    return list(renderer_command())


def test_kustomize_refuses_to_render_without_the_credentials_file(
    renderer: list[str], tmp_path: Path,
) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy, ignore=shutil.ignore_patterns("credentials.env"))
    result = kustomize(renderer, copy)
    assert result.returncode != 0 and "credentials.env" in result.stderr, result.stderr


def test_kustomize_renders_the_base_with_the_generated_secret(
    renderer: list[str], tmp_path: Path,
) -> None:
    result = kustomize(renderer, base_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    rendered = by_kind(list(yaml.safe_load_all(result.stdout)))
    assert set(rendered) == {"PriorityClass", "ConfigMap", "Secret", "Service", "NetworkPolicy",
                             "DaemonSet"}
    secret = rendered["Secret"]
    data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert data == FILLED_CREDENTIALS
    # The name carries a hash of the contents, and the DaemonSet follows it.
    name = secret["metadata"]["name"]
    assert name.startswith("kafka-cold-sidecar-credentials-")
    pod = rendered["DaemonSet"]["spec"]["template"]["spec"]
    (sidecar,) = pod["containers"]
    assert {env["valueFrom"]["secretKeyRef"]["name"] for env in sidecar["env"]
            if "valueFrom" in env} == {name}
    assert all(document["metadata"].get("namespace") == "kafka"
               for kind, document in rendered.items() if kind != "PriorityClass")
    assert [volume["name"] for volume in pod["volumes"] if "hostPath" in volume] == ["cache"]


def test_kustomize_renders_the_optional_components(renderer: list[str], tmp_path: Path
                                                   ) -> None:
    copy = base_copy(tmp_path, ("podmonitor", "protect-log-dirs"))
    result = kustomize(renderer, copy)
    assert result.returncode == 0, result.stderr
    rendered = by_kind(list(yaml.safe_load_all(result.stdout)))
    assert rendered["PodMonitor"]["metadata"]["namespace"] == "kafka"
    pod = rendered["DaemonSet"]["spec"]["template"]["spec"]
    (sidecar,) = pod["containers"]
    env = {item["name"]: item for item in sidecar["env"]}
    # The patch added to the base's list, it did not replace it.
    assert {"SIDECAR_PROTECT_PATH", "SIDECAR_ADMIN_TOKEN", "SIDECAR_LOG_LEVEL"} <= set(env)
    mounts = {mount["mountPath"]: mount for mount in sidecar["volumeMounts"]}
    assert {"/etc/kafka-sidecar", "/var/cache/kafka-sidecar"} <= set(mounts)
    for path in env["SIDECAR_PROTECT_PATH"]["value"].split(","):
        assert mounts[path]["readOnly"] is True
    host_paths = {volume["name"] for volume in pod["volumes"] if "hostPath" in volume}
    assert host_paths == {"cache", mounts[path]["name"]}


# --- systemd ---------------------------------------------------------------

REQUIRED_UNIT_KEYS = {
    "ExecStart", "EnvironmentFile", "Restart", "CPUWeight", "IOSchedulingClass",
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
    ensure("ensure-systemd.sh")
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
    # It starts on any host: no core pinned that a small one lacks, no placeholder.
    assert "CPUAffinity" not in keys
    assert keys["Documentation"] == "file:/usr/share/doc/kafka-sidecar/README.md"
    assert "install -m 0644 deploy/systemd/kafka-sidecar.service /etc/systemd/system/" \
        in UNIT.read_text(encoding="utf-8")


def test_systemd_unit_installs_the_wheel_make_dist_builds() -> None:
    """No index has the package: the unit's header installs the wheel of `make dist`."""
    text = UNIT.read_text(encoding="utf-8")
    installs = re.findall(r"/pip install (\S+)", text)
    assert installs, "the unit's header says how to install the package"
    assert all(Path(target).name == wheel_name() for target in installs), installs
    assert "make dist" in text
    assert re.search(r"^dist:", (ROOT / "Makefile").read_text(), re.M)


def header_commands() -> list[str]:
    """The install steps of the unit's header comment, continuation lines joined."""
    lines = [line.removeprefix("#").strip() for line in
             UNIT.read_text(encoding="utf-8").split("\n[Unit]")[0].splitlines()]
    return [step.split("  #")[0].strip() for step in
            re.sub(r"\\\s+", " ", "\n".join(lines)).splitlines()
            if re.match(r"(install|useradd|python3|sudo|systemctl|/opt/)", step)]


def test_systemd_install_steps_put_every_file_where_the_unit_reads_it(tmp_path: Path) -> None:
    """The header's steps, run as written, leave each path the unit names in place,
    from files the checkout has; the example config they install passes the
    unit's own --check-config command as it stands (a 2-core host needs no edit)."""
    keys = unit_keys(UNIT.read_text(encoding="utf-8"))
    installed: dict[str, str] = {}  # destination -> source in the checkout
    for step in header_commands():
        words = step.split()
        if words[0] == "install" and "-d" not in words:
            source, destination = words[-2], words[-1]
            if source != "/dev/null":
                assert (ROOT / source).is_file(), step
            if destination.endswith("/"):
                destination += Path(source).name
            installed[destination] = source
    assert installed["/etc/systemd/system/kafka-sidecar.service"] == \
        "deploy/systemd/kafka-sidecar.service"
    command = keys["ExecStart"].split()
    config = command[command.index("--config") + 1]
    assert installed[config] == "sidecar.example.toml"
    assert keys["EnvironmentFile"] in installed
    documentation = keys["Documentation"].removeprefix("file:")
    assert installed[documentation] == "deploy/README.md"
    directories = [step.split()[-1] for step in header_commands()
                   if step.startswith("install -d")]
    assert command[command.index("--cache-dir") + 1] in directories
    assert command[0] == "/opt/kafka-sidecar/bin/sidecar"
    assert any(step == "python3 -m venv /opt/kafka-sidecar" for step in header_commands())
    assert "systemctl daemon-reload && systemctl enable --now kafka-sidecar" \
        in header_commands()

    # The unit's command with the checkout's example config and a cache dir here.
    cache = tmp_path / "cache"
    cache.mkdir()
    arguments = [str(ROOT / "sidecar.example.toml") if word == config
                 else str(cache) if word == command[command.index("--cache-dir") + 1]
                 else word for word in command[1:]]
    result = subprocess.run([sys.executable, "-m", "sidecar", *arguments, "--check-config"],
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert re.search(r"^cpus = \"\"", result.stdout, re.M), "no cores pinned by default"


def test_deploy_readme_shows_the_units_own_settings() -> None:
    """The unit settings deploy/README.md quotes are the unit's, with no core pinned:
    a quoted CPUAffinity=3 would fail on a host of fewer than 4 cores."""
    keys = unit_keys(UNIT.read_text(encoding="utf-8"))
    blocks = re.findall(r"```ini\n(.*?)```", (ROOT / "deploy" / "README.md").read_text(),
                        re.S)
    assert blocks
    for block in blocks:
        quoted = unit_keys(block)
        assert "CPUAffinity" not in quoted
        # systemd has no trailing comments: "3G  # ..." would be the value.
        assert not [value for value in quoted.values() if "#" in value], quoted
        assert quoted == {name: keys[name] for name in quoted}, quoted


# --- Dockerfile ------------------------------------------------------------

def dockerfile() -> dict[str, Any]:
    """The final stage: what the image is."""
    return dockerfile_stages()[-1]


def dockerignored(path: str) -> bool:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") or path == p
               for p in patterns)


def test_dockerfile_copies_what_exists_and_is_not_ignored() -> None:
    assert [stage["FROM"] for stage in dockerfile_stages()] == ["python:3.11-slim"] * 2
    sources = context_sources()
    assert "sidecar" in sources and "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source), f"{source} is COPYed but excluded by .dockerignore"
    assert dockerignored(".venv") and dockerignored(".venv-build")
    assert dockerignored("tests") and dockerignored("dist")


def test_dockerfile_installs_the_wheel_of_its_build_stage_without_extras() -> None:
    """The image is the wheel (as `make dist` builds it) and its runtime dependencies:
    no source tree, no build tools, no extras (tests, Spark, tools)."""
    build, image = dockerfile_stages()
    (built,) = [run for run in build["RUN"] if run.startswith("pip wheel")]
    wheels = built.split("--wheel-dir", 1)[1].split()[0]
    assert "--no-deps" in built
    (copied,) = [copy for copy in image["COPY"] if copy.startswith("--from=")]
    source_stage, source, target = copied.split()
    assert source_stage == f"--from={build['AS']}" and source == wheels
    (install,) = [run for run in image["RUN"] if "pip install" in run]
    assert f"pip install {target}/kafka_cold_sidecar-*.whl" in install
    assert "[" not in install and " ." not in install
    assert image["COPY"] == [copied], "the image copies nothing else"


def test_dockerfile_entrypoint_user_and_ports() -> None:
    instructions = dockerfile()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert instructions["ENTRYPOINT"] == ["sidecar"] and "sidecar" in scripts
    assert instructions["CMD"][:2] == ["serve", "--config"]
    assert instructions["USER"].split(":")[0] not in ("", "0", "root")
    exposed = sorted(int(port) for port in instructions["EXPOSE"].split())
    assert exposed == sorted(parse_host_port(DEFAULTS[name]).port
                             for name in ("listen", "admin_listen"))
