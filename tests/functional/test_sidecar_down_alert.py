"""`SidecarDown` in a real Prometheus (Debian's, scripts/ensure-prometheus.sh), under
both ways a cluster scrapes the sidecars: annotation-based pod scraping (one
shared job, with the relabelling of Prometheus' own example configuration for
Kubernetes pods) and the PodMonitor's job. Kubernetes' service discovery is
stood in for by static targets that carry the `__meta_kubernetes_pod_*` labels
it would give the DaemonSet's pods (read from daemonset.yaml); everything after
discovery (relabelling, scraping, rule evaluation, ALERTS) is Prometheus' own.
Targets that are down are loopback ports nothing listens on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sidecar.tools.ports import free_port
from tests.support.prometheus import POLL_S, WAIT_S, Prometheus
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "sidecar-rules.yml"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "daemonset.yaml"


def meta_labels(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, str]:
    """What Kubernetes pod discovery gives a pod's target: every label and annotation as
    __meta_kubernetes_pod_label_<name> / _annotation_<name>, names sanitised to
    [a-zA-Z0-9_] (Prometheus' kubernetes_sd_config documentation)."""
    def clean(name: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", name)

    return {**{f"__meta_kubernetes_pod_label_{clean(k)}": v for k, v in labels.items()},
            **{f"__meta_kubernetes_pod_annotation_{clean(k)}": v
               for k, v in annotations.items()},
            "__meta_kubernetes_namespace": "kafka"}


# The "kubernetes-pods" job of Prometheus' example configuration
# (documentation/examples/prometheus-kubernetes.yml), as its Helm chart also has it.
ANNOTATION_RELABELLING: list[dict[str, Any]] = [
    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
     "action": "keep", "regex": "true"},
    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
     "action": "replace", "target_label": "__metrics_path__", "regex": "(.+)"},
    {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
     "action": "replace", "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
     "target_label": "__address__"},
    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
    {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace",
     "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace",
     "target_label": "pod"},
]


def test_sidecar_down_goes_pending_under_annotation_and_podmonitor_scraping(
    prometheus_installed: None, tmp_path: Path,
) -> None:
    template = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["metadata"]
    sidecar_port, web_port, monitored_port = free_port(), free_port(), free_port()
    annotations = {**template["annotations"], "prometheus.io/port": str(sidecar_port)}
    sidecar = {**meta_labels(template["labels"], annotations),
               "__meta_kubernetes_pod_name": "kafka-cold-sidecar-x7k2p"}
    web = {**meta_labels({"app.kubernetes.io/name": "web"},
                         {"prometheus.io/scrape": "true", "prometheus.io/port": str(web_port)}),
           "__meta_kubernetes_pod_name": "web-5d9f"}
    scrape_configs = [
        {"job_name": "kubernetes-pods", "relabel_configs": ANNOTATION_RELABELLING,
         "static_configs": [{"targets": ["127.0.0.1:1"], "labels": sidecar},
                            {"targets": ["127.0.0.2:1"], "labels": web}]},
        # The PodMonitor without jobLabel: prometheus-operator names its job so.
        {"job_name": "kafka/kafka-cold-sidecar",
         "static_configs": [{"targets": [f"127.0.0.1:{monitored_port}"]}]},
    ]
    with Prometheus(tmp_path / "prometheus", "", [RULES], scrape_configs) as prometheus:
        def pending() -> dict[str, dict[str, str]] | None:
            alerts = prometheus.query('ALERTS{alertname="SidecarDown"}')
            found = {alert["metric"]["instance"]: alert["metric"] for alert in alerts}
            return found if len(found) >= 2 else None

        alerts = eventually(pending, "SidecarDown for both sidecars", WAIT_S, POLL_S)
        # Both targets Prometheus could not scrape are down, the web pod's too
        # (once its first scrape is in: each target has a schedule of its own)...
        unscraped = {f"127.0.0.1:{sidecar_port}", f"127.0.0.2:{web_port}",
                     f"127.0.0.1:{monitored_port}"}

        def all_down() -> set[str] | None:
            down = {s["metric"]["instance"] for s in prometheus.query("up == 0")}
            return down if down >= unscraped else None

        down = eventually(all_down, "up == 0 for every target", WAIT_S, POLL_S)
        assert down == unscraped
    # ...but only the sidecars raise the alert, waiting out its `for:` first.
    assert set(alerts) == {f"127.0.0.1:{sidecar_port}", f"127.0.0.1:{monitored_port}"}
    annotated = alerts[f"127.0.0.1:{sidecar_port}"]
    assert (annotated["job"], annotated["pod"], annotated["namespace"]) == (
        "kubernetes-pods", "kafka-cold-sidecar-x7k2p", "kafka")
    assert {alert["alertstate"] for alert in alerts.values()} == {"pending"}
