"""The warm-up finds each broker's node and the sidecar there through the Kubernetes
API (`{sidecar_ip}` in `kafka.sidecar_url`), against a stand-in API server on
loopback that answers the pod lists with the API server's field and label
selector semantics: over plain HTTP as `kubectl proxy` serves it, and over HTTPS
with the service account's token, CA and namespace as a pod has them.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from spark_warmup import placement
from spark_warmup.metadata import Broker, ClusterFacts, PartitionReplicas
from spark_warmup.placement import place_brokers
from spark_warmup.plan import PlanError, parse_plan
from spark_warmup.routing import route_partitions

SIDECAR = {"app.kubernetes.io/name": "kafka-cold-sidecar"}


def pod(name: str, node: str | None, ip: str | None, labels: dict[str, str] | None = None,
        phase: str = "Running", ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kafka", "labels": labels or {}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "podIP": ip, "hostIP": {
                "n1": "192.168.0.1", "n2": "192.168.0.2", "n3": "192.168.0.3"}.get(node or ""),
                "conditions": [{"type": "Ready", "status": str(ready)}]}}


PODS = [
    pod("my-kafka-0", "n1", "10.244.1.5", {"strimzi.io/kind": "Kafka"}),
    pod("my-kafka-1", "n2", "10.244.2.5", {"strimzi.io/kind": "Kafka"}),
    pod("my-kafka-2", "n3", "127.0.0.1", {"strimzi.io/kind": "Kafka"}),
    pod("kafka-cold-sidecar-a", "n1", "10.244.1.9", SIDECAR),
    # n2: the old pod of a rolling update, no longer ready, and its replacement.
    pod("kafka-cold-sidecar-old", "n2", "10.244.2.8", SIDECAR, ready=False),
    pod("kafka-cold-sidecar-b", "n2", "10.244.2.9", SIDECAR),
    # n3: its sidecar is still pending.
    pod("kafka-cold-sidecar-c", "n3", None, SIDECAR, phase="Pending", ready=False),
    pod("web-0", "n1", "10.244.1.7", {"app.kubernetes.io/name": "web"}),
]
BROKERS = {1: Broker(1, "10.244.1.5", 9092), 2: Broker(2, "10.244.2.5", 9092),
           3: Broker(3, "localhost", 9092)}  # a name, resolved as the broker's would be


def field(document: dict[str, Any], path: str) -> str:
    value: Any = document
    for part in path.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


def selected(item: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """Equality selectors, comma-separated, as the API server reads them."""
    for term in ",".join(query.get("fieldSelector", [])).split(","):
        if term:
            name, _, value = term.partition("=")
            if field(item, name) != value:
                return False
    for term in ",".join(query.get("labelSelector", [])).split(","):
        if term:
            name, _, value = term.partition("=")
            if item["metadata"]["labels"].get(name) != value:
                return False
    return True


class ApiServer:
    """GET /api/v1/namespaces/NS/pods, filtered; every request and its token kept."""

    def __init__(self, pods: list[dict[str, Any]], tls: tuple[Path, Path] | None = None,
                 refuse: int | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                served.requests.append((self.path, self.headers.get("Authorization", "")))
                segments = parts.path.strip("/").split("/")
                if refuse is not None:
                    self.answer(refuse, {"kind": "Status", "code": refuse})
                elif segments[:3] == ["api", "v1", "namespaces"] and segments[4:] == ["pods"]:
                    query = urllib.parse.parse_qs(parts.query)
                    items = [p for p in pods if p["metadata"]["namespace"] == segments[3]
                             and selected(p, query)]
                    self.answer(200, {"kind": "PodList", "items": items})
                else:
                    self.answer(404, {"kind": "Status", "code": 404})

            def answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.port = self._server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def plan_with(api: str | None, **kubernetes: str) -> Any:
    return parse_plan({
        "origin": {"bucket": "tiered"}, "replays": [{"topic": "orders"}],
        "kafka": {"bootstrap_servers": "b1:9092", "sidecar_url": "http://{sidecar_ip}:9331",
                  "kubernetes": {**({"api": api} if api else {}), **kubernetes}},
    }, env={})


def test_each_broker_is_routed_to_the_sidecar_on_its_own_node() -> None:
    with ApiServer(PODS) as api:
        plan = plan_with(api.url, namespace="kafka")
        assert plan.kafka is not None
        placements = place_brokers(BROKERS, plan.kafka)
    assert {node_id: (p.node, p.node_ip, p.sidecar_ip) for node_id, p in placements.items()} \
        == {1: ("n1", "192.168.0.1", "10.244.1.9"), 2: ("n2", "192.168.0.2", "10.244.2.9"),
            3: ("n3", "192.168.0.3", None)}
    # One query per broker, one per node, each narrowed by the API server.
    assert sorted(urllib.parse.unquote(path) for path, _ in api.requests) == sorted(
        [f"/api/v1/namespaces/kafka/pods?fieldSelector=status.podIP={ip}"
         for ip in ("10.244.1.5", "10.244.2.5", "127.0.0.1")]
        + [f"/api/v1/namespaces/kafka/pods?labelSelector=app.kubernetes.io/name="
           f"kafka-cold-sidecar&fieldSelector=spec.nodeName={node}" for node in ("n1", "n2",
                                                                                   "n3")])

    partitions = {("orders", 0): PartitionReplicas(1, (1, 2), (1, 2)),
                  ("orders", 1): PartitionReplicas(2, (2, 1), (2, 1))}
    cluster = ClusterFacts("b1:9092", BROKERS, partitions, {}, placements)
    routes = route_partitions([("orders", 0, "replays[0]"), ("orders", 1, "replays[0]")],
                              plan, cluster)
    assert routes.nodes == {"broker-1": "http://10.244.1.9:9331",
                            "broker-2": "http://10.244.2.9:9331"}
    assert routes.targets == {("orders", 0): ("broker-1",), ("orders", 1): ("broker-2",)}

    # A partition served from n3, whose sidecar is not ready: said, with the node.
    led_by_3 = ClusterFacts("b1:9092", BROKERS, {("orders", 2): PartitionReplicas(3, (3,), (3,))},
                            {}, placements)
    with pytest.raises(PlanError, match=r"broker 3 .* has no sidecar \(node n3 has no ready "
                                        r"pod \(of 1\) matching app.kubernetes.io/name="):
        route_partitions([("orders", 2, "replays[0]")], plan, led_by_3)


def test_a_dual_stack_broker_is_found_by_whichever_address_its_pod_lists() -> None:
    """Its name resolves to an IPv6 address first, while the pod's status.podIP
    is its IPv4 one: each address is asked in turn."""
    def both(host: str) -> list[str]:  # the cluster DNS of a dual-stack Service
        return ["fd00:10:244:1::5", "10.244.1.5"]

    with ApiServer(PODS) as api:
        plan = plan_with(api.url, namespace="kafka")
        assert plan.kafka is not None
        placements = place_brokers({1: Broker(1, "my-kafka-0.kafka", 9092)}, plan.kafka, both)
        asked = [urllib.parse.unquote(path) for path, _ in api.requests]
    assert (placements[1].node, placements[1].sidecar_ip) == ("n1", "10.244.1.9")
    assert asked[:2] == [f"/api/v1/namespaces/kafka/pods?fieldSelector=status.podIP={ip}"
                         for ip in both("")]
    with ApiServer([]) as api:  # neither address is a pod's: both named
        plan = plan_with(api.url, namespace="kafka")
        assert plan.kafka is not None
        with pytest.raises(PlanError, match=r"broker 1 \(my-kafka-0.kafka, "
                                            r"fd00:10:244:1::5, 10.244.1.5\) is no pod"):
            place_brokers({1: Broker(1, "my-kafka-0.kafka", 9092)}, plan.kafka, both)


def test_a_host_name_resolves_to_each_of_its_addresses_once() -> None:
    addresses = placement.resolve_host("localhost")
    assert "127.0.0.1" in addresses and len(addresses) == len(set(addresses))
    assert placement.resolve_host("10.244.1.5") == ["10.244.1.5"]


def test_a_finished_pod_that_kept_the_brokers_ip_does_not_place_it() -> None:
    # An evicted or completed pod keeps its status.podIP, which the network may
    # since have given the broker: the API server lists both for the IP.
    finished = [pod("a-job-x1", "n2", "10.244.1.5", phase="Failed", ready=False),
                pod("a-job-x2", "n3", "10.244.1.5", phase="Succeeded", ready=False)]
    with ApiServer(finished + PODS) as api:
        plan = plan_with(api.url, namespace="kafka")
        assert plan.kafka is not None
        placements = place_brokers({1: BROKERS[1]}, plan.kafka)
    assert (placements[1].node, placements[1].sidecar_ip) == ("n1", "10.244.1.9")
    with ApiServer(finished) as api:  # the broker's own pod is gone
        plan = plan_with(api.url, namespace="kafka")
        assert plan.kafka is not None
        with pytest.raises(PlanError, match=r"broker 1 \(10.244.1.5, 10.244.1.5\) is no pod"):
            place_brokers({1: BROKERS[1]}, plan.kafka)


def test_an_api_url_that_answers_no_http_is_a_plan_error() -> None:
    # kafka.kubernetes.api naming another service's port: its banner is no HTTP.
    with socket.create_server(("127.0.0.1", 0)) as server:

        def banner() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                connection.shutdown(socket.SHUT_WR)
                while connection.recv(65536):
                    pass

        thread = threading.Thread(target=banner, daemon=True)
        thread.start()
        plan = plan_with(f"http://127.0.0.1:{server.getsockname()[1]}", namespace="kafka")
        assert plan.kafka is not None
        with pytest.raises(PlanError, match=r"^kafka.kubernetes.api: cannot list pods at "
                                            r"http://127.0.0.1:\d+: no HTTP answer"):
            place_brokers({1: BROKERS[1]}, plan.kafka)
        thread.join(timeout=10)


@pytest.fixture()
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A pod's service account files and a certificate the stand-in serves with."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(tmp_path / "key.pem"), "-out", str(account / "ca.crt"),
         "-days", "1", "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    (account / "token").write_text("eyJhbGciOi.token\n")
    (account / "namespace").write_text("kafka")
    monkeypatch.setattr(placement, "SERVICE_ACCOUNT", account)
    yield account


def test_in_a_pod_the_service_accounts_token_ca_and_namespace_are_used(
    service_account: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ApiServer(PODS, tls=(service_account / "ca.crt", tmp_path / "key.pem")) as api:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        plan = plan_with(None)
        assert plan.kafka is not None
        placements = place_brokers({1: BROKERS[1]}, plan.kafka)
    assert placements[1].sidecar_ip == "10.244.1.9"
    assert {token for _, token in api.requests} == {"Bearer eyJhbGciOi.token"}


def test_what_stops_placement_is_said_with_the_field_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ApiServer(PODS, refuse=403) as api:
        plan = plan_with(api.url, namespace="kafka")
        assert plan.kafka is not None
        with pytest.raises(PlanError, match=r"HTTP 403 .* needs to list pods there: "
                                            r"deploy/kubernetes/components/warmup"):
            place_brokers(BROKERS, plan.kafka)
    with ApiServer(PODS) as api:
        plan = plan_with(api.url, namespace="kafka", broker_namespace="brokers")
        assert plan.kafka is not None
        with pytest.raises(PlanError, match=r"broker 1 \(10.244.1.5, 10.244.1.5\) is no pod in "
                                            r"namespace brokers; set kafka.kubernetes."
                                            r"broker_namespace"):
            place_brokers(BROKERS, plan.kafka)
    # Outside a cluster, with no API named: which setting to give.
    monkeypatch.setattr(placement, "SERVICE_ACCOUNT", tmp_path / "none")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    plan = plan_with(None, namespace="kafka")
    assert plan.kafka is not None
    with pytest.raises(PlanError, match=r"kafka.kubernetes.api: missing.*kubectl proxy"):
        place_brokers(BROKERS, plan.kafka)
