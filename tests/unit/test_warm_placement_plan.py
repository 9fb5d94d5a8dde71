"""A plan's Kubernetes placement fields: which templates need the API server, what
`kafka.kubernetes` accepts, and the URL a placement fills in."""

from __future__ import annotations

from typing import Any

import pytest

from spark_warmup.metadata import Broker, Placement
from spark_warmup.plan import KubernetesSpec, PlanError, parse_plan
from spark_warmup.routing import sidecar_url


def kafka_plan(**kafka: Any) -> Any:
    plan = parse_plan({"origin": {"bucket": "tiered"}, "replays": [{"topic": "orders"}],
                       "kafka": {"bootstrap_servers": "b1:9092", **kafka}}, env={})
    assert plan.kafka is not None
    return plan.kafka


@pytest.mark.parametrize(("template", "needs"), [
    ("http://{sidecar_ip}:9331", True), ("http://{node_ip}:9331", True),
    ("http://sidecar-{node}.example:9331", True), ("http://{host}:9331", False),
])
def test_only_templates_naming_the_node_ask_the_api_server(template: str, needs: bool) -> None:
    spec = kafka_plan(sidecar_url=template)
    assert spec.needs_placement is needs
    assert spec.kubernetes == KubernetesSpec()


def test_the_kubernetes_block_is_checked_field_by_field() -> None:
    spec = kafka_plan(sidecar_url="http://{sidecar_ip}:9331", kubernetes={
        "api": "http://127.0.0.1:8001/", "namespace": "kafka", "broker_namespace": "brokers",
        "sidecar_selector": "app=sidecar"})
    assert spec.kubernetes == KubernetesSpec("http://127.0.0.1:8001", "kafka", "brokers",
                                             "app=sidecar")
    for kubernetes, message in (
        ({"apiserver": "x"}, "kafka.kubernetes.apiserver: unknown field"),
        ({"namespace": ""}, "kafka.kubernetes.namespace: must be a non-empty string"),
        ({"api": "127.0.0.1:8001"}, "kafka.kubernetes.api: must be an http(s) URL"),
        ([], "kafka.kubernetes: must be a JSON object"),
    ):
        with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
            kafka_plan(sidecar_url="http://{sidecar_ip}:9331", kubernetes=kubernetes)
    with pytest.raises(PlanError, match=r"only \{host\}, \{id\} and \{rack\} \(and in "
                                        r"Kubernetes \{node\}, \{node_ip\} and \{sidecar_ip\}"):
        kafka_plan(sidecar_url="http://{pod_ip}:9331")


def test_a_placement_fills_the_template_and_a_missing_sidecar_fills_nothing() -> None:
    # A sidecar URL has no path (spark_warmup.sidecar_urls): each field fills a host.
    spec = kafka_plan(sidecar_url="http://{sidecar_ip}:9331")
    broker = Broker(1, "b1.example", 9092)
    placed = Placement("n1", "fd00::1", "fd00:1::9")
    assert sidecar_url(broker, spec, placed) == "http://[fd00:1::9]:9331"
    assert sidecar_url(broker, kafka_plan(sidecar_url="http://{node_ip}:9331"), placed) \
        == "http://[fd00::1]:9331"
    assert sidecar_url(broker, kafka_plan(sidecar_url="http://sidecar.{node}.example:1"),
                       placed) == "http://sidecar.n1.example:1"
    assert sidecar_url(broker, spec, Placement("n1", "10.0.0.1", None, "no pod")) is None
    assert sidecar_url(broker, spec) is None
    explicit = kafka_plan(sidecar_url="http://{sidecar_ip}:9331", sidecars={"1": "http://a:1"})
    assert sidecar_url(broker, explicit) == "http://a:1"
