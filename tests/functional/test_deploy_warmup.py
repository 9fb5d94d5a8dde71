"""The fleet's warm-up and sizing in Kubernetes (deploy/kubernetes/components/warmup,
the access log of configmap.yaml), checked offline: kustomize renders the
component into the base with every reference resolved, and each manifest is held
to what the code that runs in it accepts: the plan parses with the warm-up's own
parser and reaches the sidecars' admin port through the NetworkPolicy, the Job's
and the CronJob's arguments parse with the jobs' own argument parsers, the
CronJob reads where the sidecars ship their logs, and the image they name is
built from files that exist and are not ignored.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import parse_host_port, parse_size
from sidecar.config.parsing import parse_s3_location
from spark_warmup.__main__ import parse_args as warmup_args
from spark_warmup.capacity.__main__ import parse_args as capacity_args
from spark_warmup.plan import parse_plan
from tests.support.deploy_files import (
    FILLED_CREDENTIALS,
    KUBE,
    ROOT,
    base_copy,
    by_kind,
    configmap_toml,
    container,
    kustomization,
    kustomize,
    manifests,
    renderer_command,
)


@pytest.fixture(scope="module")
def renderer() -> list[str]:
    return list(renderer_command())


WARMUP = KUBE / "components" / "warmup"
DOCKERFILE = ROOT / "warmup.Dockerfile"


def component_documents() -> dict[str, dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for name in kustomization(WARMUP)["resources"]:
        documents += yaml.safe_load_all((WARMUP / name).read_text(encoding="utf-8"))
    return by_kind(documents)


def pod_spec(kind: str) -> dict[str, Any]:
    document = component_documents()[kind]
    template = (document["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob"
                else document["spec"]["template"])
    result: dict[str, Any] = template
    return result


def the_plan() -> Any:
    return parse_plan(json.loads((WARMUP / "warmup-plan.json").read_text()), env={})


def admitted_to(port: int, labels: dict[str, str]) -> bool:
    """Whether networkpolicy.yaml lets a pod of the sidecars' namespace with
    `labels` reach `port` of the sidecars (Kubernetes' NetworkPolicy semantics:
    rules OR'ed, peers in a rule OR'ed, a podSelector alone means this namespace)."""
    for rule in manifests()["NetworkPolicy"]["spec"]["ingress"]:
        if port not in [p["port"] for p in rule.get("ports", [])]:
            continue
        for peer in rule["from"]:
            if set(peer) == {"podSelector"} and \
                    peer["podSelector"]["matchLabels"].items() <= labels.items():
                return True
    return False


# --- the access log and its shipping --------------------------------------------


def test_the_access_log_is_on_rotates_on_its_own_volume_and_is_shipped() -> None:
    config = configmap_toml()
    log = Path(config["access_log"])
    mounts = {mount["mountPath"]: mount for mount in container()["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in
               manifests()["DaemonSet"]["spec"]["template"]["spec"]["volumes"]}
    mount = mounts[str(log.parent)]
    assert not mount.get("readOnly", False)
    volume = volumes[mount["name"]]["emptyDir"]
    assert volume.get("medium") != "Memory", "the log is not kept in the pod's memory limit"
    # Room for the live file and every rotated one kept.
    size, backups = parse_size(config["access_log_max_size"]), int(config["access_log_backups"])
    assert size and backups
    assert (backups + 1) * size <= parse_size(volume["sizeLimit"].replace("i", "iB"))
    assert parse_s3_location(config["access_log_upload"]) is not None


# --- the component, rendered -----------------------------------------------------


def test_kustomize_renders_the_warmup_component_with_every_reference_resolved(
    renderer: list[str], tmp_path: Path,
) -> None:
    result = kustomize(renderer, base_copy(tmp_path, ("warmup",)))
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    names = {(d["kind"], d["metadata"]["name"]) for d in documents}
    rendered = {d["kind"]: d for d in documents if d["kind"] in (
        "Job", "CronJob", "Secret", "ServiceAccount", "Role", "RoleBinding",
        "PersistentVolumeClaim")}
    secret = rendered["Secret"]["metadata"]["name"]
    plans = [d for d in documents if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].startswith("kafka-cold-sidecar-warmup-plan-")]
    assert len(plans) == 1 and set(plans[0]["data"]) == {"warmup-plan.json"}
    job = rendered["Job"]["spec"]["template"]["spec"]
    cron = rendered["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for pod in (job, cron):
        (box,) = pod["containers"]
        assert box["image"] == "registry.example.com/kafka-cold-sidecar-warmup:0.1.0"
        references = {env["valueFrom"]["secretKeyRef"]["name"] for env in box["env"]
                      if "valueFrom" in env}
        assert references == {secret}
        assert {env["valueFrom"]["secretKeyRef"]["key"] for env in box["env"]
                if "valueFrom" in env} <= set(FILLED_CREDENTIALS)
        for volume in pod["volumes"]:
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim",
                        volume["persistentVolumeClaim"]["claimName"]) in names
    assert ("ServiceAccount", job["serviceAccountName"]) in names
    binding = rendered["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": job["serviceAccountName"],
                                    "namespace": "kafka"}]
    assert binding["roleRef"]["name"] == rendered["Role"]["metadata"]["name"]
    assert rendered["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                          "verbs": ["list"]}]
    assert all(d["metadata"].get("namespace") == "kafka" for d in documents
               if d["kind"] != "PriorityClass")


# --- each manifest against the code it runs --------------------------------------


def test_the_plan_finds_each_brokers_sidecar_and_may_call_it() -> None:
    plan = the_plan()
    assert plan.kafka is not None and plan.kafka.needs_placement
    template = plan.kafka.sidecar_url.format(host="h", id=1, rack="", node="n",
                                             node_ip="10.0.0.1", sidecar_ip="10.1.0.1")
    admin_port = parse_host_port(configmap_toml()["admin_listen"]).port
    assert parse_host_port(template.split("//")[1].split("/")[0]).port == admin_port
    # The selector it looks for sidecars with is the DaemonSet's pods' label.
    name, _, value = plan.kafka.kubernetes.sidecar_selector.partition("=")
    assert manifests()["DaemonSet"]["spec"]["template"]["metadata"]["labels"][name] == value
    # Its namespace is the service account's own (the Job's, the sidecars').
    assert plan.kafka.kubernetes.namespace is None
    config = configmap_toml()
    assert (plan.origin.endpoint, plan.origin.region) == (config["origin_endpoint"],
                                                          config["origin_region"])
    # The NetworkPolicy lets the Job's pods reach the admin port, and only that.
    labels = pod_spec("Job")["metadata"]["labels"]
    assert admitted_to(admin_port, labels)
    assert not admitted_to(parse_host_port(config["listen"]).port, labels)
    assert not admitted_to(admin_port, pod_spec("CronJob")["metadata"]["labels"])


def test_the_job_runs_the_plan_it_mounts() -> None:
    pod = pod_spec("Job")["spec"]
    (box,) = pod["containers"]
    entry = instructions()["ENTRYPOINT"]
    assert entry == ["python", "-m"]
    module, *arguments = box["args"]
    assert importlib.util.find_spec(module) is not None
    args = warmup_args(arguments)
    mounts = {m["mountPath"]: m for m in box["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = mounts[str(args.plan.parent)]
    generated = kustomization(WARMUP)["configMapGenerator"][0]
    assert volumes[mount["name"]]["configMap"]["name"] == generated["name"]
    assert args.plan.name in generated["files"]
    assert args.master.startswith("local") and not args.dry_run
    assert pod["restartPolicy"] == "Never" and component_documents()["Job"]["spec"][
        "backoffLimit"] == 0


def test_the_cronjob_sizes_the_cache_from_where_the_sidecars_ship_their_logs() -> None:
    cron = component_documents()["CronJob"]
    assert len(cron["spec"]["schedule"].split()) == 5
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = pod_spec("CronJob")["spec"]
    (box,) = pod["containers"]
    assert box["command"] == ["sh", "-c"]
    words = shlex.split(box["args"][0].replace("$(date -u +%Y-%m-%dT%H%MZ)", "2026-11-27T0630Z"))
    assert words[:4] == ["exec", "python", "-m", "spark_warmup.capacity"]
    args = capacity_args(words[4:])
    config = configmap_toml()
    assert args.logs == [config["access_log_upload"]]
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env["AWS_DEFAULT_REGION"] == config["origin_region"]
    reports = {m["mountPath"]: m for m in box["volumeMounts"]}[str(args.report.parent)]
    claim = {v["name"]: v for v in pod["volumes"]}[reports["name"]]["persistentVolumeClaim"]
    assert claim["claimName"] == component_documents()["PersistentVolumeClaim"]["metadata"][
        "name"]


def test_the_jobs_run_unprivileged_on_a_read_only_root() -> None:
    for kind in ("Job", "CronJob"):
        pod = pod_spec(kind)["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (box,) = pod["containers"]
        assert box["securityContext"]["readOnlyRootFilesystem"] is True
        assert box["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        writable = {m["mountPath"] for m in box["volumeMounts"] if not m.get("readOnly")}
        assert "/tmp" in writable
        assert {"name": "HOME", "value": "/tmp"} in box["env"]


# --- the image --------------------------------------------------------------------


def instructions() -> dict[str, Any]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found: dict[str, Any] = {"COPY": [], "RUN": []}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            if name in ("COPY", "RUN"):
                found[name].append(rest)
            else:
                found[name] = json.loads(rest) if name in ("ENTRYPOINT", "CMD") else rest
    return found


def test_the_warmup_image_is_built_from_what_the_checkout_has() -> None:
    found = instructions()
    ignored = [line.strip() for line in
               (ROOT / "warmup.Dockerfile.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    sources = [source for copy in found["COPY"] for source in copy.split()[:-1]]
    assert {"pyproject.toml", "sidecar", "spark_warmup"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source not in ignored, f"{source} is copied but ignored"
    (install,) = [run for run in found["RUN"] if run.startswith("pip install")]
    extra = re.search(r'"\.\[(\w+)\]"', install)
    assert extra, install
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(name.startswith("pyspark") for name in extras[extra[1]])
    # PySpark 4 runs on Java 17.
    assert any("openjdk-17-jre-headless" in run for run in found["RUN"])
    assert found["USER"].split(":")[0] not in ("", "0", "root")
