"""Where each broker runs in Kubernetes, and the sidecar on its node: the `{node}`,
`{node_ip}` and `{sidecar_ip}` of a `kafka.sidecar_url` template.

The DaemonSet (deploy/kubernetes/daemonset.yaml) puts one sidecar on every broker
node. Its pods' IPs change with every restart and are reachable only inside the
cluster, and the node-local Service reaches the sidecar of the caller's node, not
the broker's. So the warm-up asks the API server, with the credentials of its
service account (deploy/kubernetes/components/warmup: a Role that may list pods):

1. the broker's advertised host, resolved to an IP (a pod's DNS name, such as
   Strimzi's `my-cluster-kafka-0.my-cluster-kafka-brokers.kafka.svc`);
2. the pod that has that IP, in the brokers' namespace, leaving out finished
   ones (an evicted pod keeps an IP the network may have given the broker since):
   `GET /api/v1/namespaces/NS/pods?fieldSelector=status.podIP=IP`: its
   `spec.nodeName` and `status.hostIP`;
3. the sidecar on that node, in the sidecars' namespace:
   `GET /api/v1/namespaces/NS/pods?labelSelector=SELECTOR&fieldSelector=spec.nodeName=NODE`:
   the pod IP of one that is Running and Ready.

Both field selectors are ones the API server supports for pods (Kubernetes
documentation, "Field Selectors"; `status.podIP` and `spec.nodeName`). In the
cluster the API server is `KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT` with
the service account's token and CA (Kubernetes documentation, "Accessing the
Kubernetes API from a Pod"); elsewhere `kafka.kubernetes.api` names one, such as
`kubectl proxy`'s `http://127.0.0.1:8001`, which adds the credentials itself.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spark_warmup.metadata import Broker, Placement
from spark_warmup.plan import KafkaSpec, KubernetesSpec, PlanError
from spark_warmup.sidecar_http import http_answers

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_S = 10.0
# Pod phases after which a pod runs nothing more (its IP may be another's now).
_FINISHED = ("Succeeded", "Failed")

# A broker host's addresses, in the resolver's order.
Resolve = Callable[[str], list[str]]


def place_brokers(brokers: Mapping[int, Broker], spec: KafkaSpec,
                  resolve: Resolve | None = None) -> dict[int, Placement]:
    """Where each broker without a `kafka.sidecars` entry runs, and its node's sidecar."""
    api = ApiServer.for_spec(spec.kubernetes)
    resolve = resolve or resolve_host
    placements: dict[int, Placement] = {}
    sidecars: dict[str, tuple[str | None, str | None]] = {}  # node -> (pod IP, problem)
    for node_id, broker in sorted(brokers.items()):
        if node_id in spec.broker_sidecars:
            continue
        addresses = resolve(broker.host)
        pod = None
        # A dual-stack pod's status.podIP is one of its addresses, and its name
        # may resolve to the other family first: each address is asked in turn.
        for ip in addresses:
            pod = api.first_pod(api.broker_namespace, {"fieldSelector": f"status.podIP={ip}"})
            if pod is not None:
                break
        if pod is None:
            raise PlanError(
                f"kafka.kubernetes: broker {node_id} ({broker.host}, {', '.join(addresses)}) "
                f"is no pod in "
                f"namespace {api.broker_namespace}; set kafka.kubernetes.broker_namespace, "
                "or give its sidecar in kafka.sidecars")
        node = str(pod.get("spec", {}).get("nodeName") or "")
        node_ip = str(pod.get("status", {}).get("hostIP") or "")
        if not node:
            raise PlanError(f"kafka.kubernetes: broker {node_id}'s pod "
                            f"{pod['metadata']['name']} is on no node yet")
        if node not in sidecars:
            sidecars[node] = api.sidecar_on(node)
        sidecar_ip, problem = sidecars[node]
        placements[node_id] = Placement(node, node_ip, sidecar_ip, problem)
    return placements


def url_fields(placement: Placement) -> dict[str, str]:
    """The template's placement fields (IPv6 literals in brackets, RFC 3986 3.2.2)."""
    return {"node": placement.node, "node_ip": _bracketed(placement.node_ip),
            "sidecar_ip": _bracketed(placement.sidecar_ip or "")}


def resolve_host(host: str) -> list[str]:
    """The addresses `host` resolves to, each once, in the resolver's order."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        return list(dict.fromkeys(
            str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)))
    except OSError as exc:
        raise PlanError(f"kafka.kubernetes: cannot resolve the broker host {host}: "
                        f"{exc.strerror or exc}") from None


class ApiServer:
    """The few pod queries placement needs, over HTTP(S) with a bearer token."""

    def __init__(self, url: str, namespace: str, broker_namespace: str, selector: str,
                 token_file: Path | None = None, context: ssl.SSLContext | None = None) -> None:
        self.url = url
        self.namespace = namespace
        self.broker_namespace = broker_namespace
        self.selector = selector
        self._token_file = token_file
        self._context = context

    @classmethod
    def for_spec(cls, spec: KubernetesSpec) -> ApiServer:
        own_namespace = SERVICE_ACCOUNT / "namespace"
        namespace = spec.namespace or (own_namespace.read_text().strip()
                                       if own_namespace.is_file() else None)
        if namespace is None:
            raise PlanError("kafka.kubernetes.namespace: missing, and this is no pod with a "
                            "service account to take it from")
        broker_namespace = spec.broker_namespace or namespace
        if spec.api is not None:
            return cls(spec.api, namespace, broker_namespace, spec.sidecar_selector)
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
            "KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise PlanError("kafka.kubernetes.api: missing, and this is not a pod in a cluster "
                            "(no KUBERNETES_SERVICE_HOST); e.g. kubectl proxy's "
                            "http://127.0.0.1:8001")
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        return cls(f"https://{_bracketed(host)}:{port}", namespace, broker_namespace,
                   spec.sidecar_selector, SERVICE_ACCOUNT / "token", context)

    def pods(self, namespace: str, query: Mapping[str, str]) -> list[dict[str, Any]]:
        url = (f"{self.url}/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods?"
               + urllib.parse.urlencode(query))
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self._token_file is not None:
            # Read at each call: bound service account tokens are rotated in place.
            request.add_header("Authorization",
                               f"Bearer {self._token_file.read_text().strip()}")
        try:
            # http_answers: what is not HTTP (another service's port) is an OSError.
            with http_answers(), urllib.request.urlopen(request, timeout=TIMEOUT_S,
                                                        context=self._context) as answer:
                document = json.load(answer)
        except urllib.error.HTTPError as exc:
            hint = (" (the warm-up's service account needs to list pods there: "
                    "deploy/kubernetes/components/warmup)" if exc.code in (401, 403) else "")
            raise PlanError(f"kafka.kubernetes: {self.url} answered HTTP {exc.code} to a "
                            f"list of pods in namespace {namespace}{hint}") from None
        except (OSError, ValueError) as exc:
            raise PlanError(f"kafka.kubernetes.api: cannot list pods at {self.url}: "
                            f"{getattr(exc, 'reason', None) or exc}") from None
        items = document.get("items") if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise PlanError(f"kafka.kubernetes.api: {self.url} did not answer with a pod list")
        return items

    def first_pod(self, namespace: str, query: Mapping[str, str]) -> dict[str, Any] | None:
        # A host-network broker shares its IP with every host-network pod of its
        # node: any of them names the same node. A pod that has finished (evicted,
        # completed) keeps its IP in its status after the network has given it to
        # another pod, on another node: never that one.
        return next((pod for pod in self.pods(namespace, query)
                     if pod.get("status", {}).get("phase") not in _FINISHED), None)

    def sidecar_on(self, node: str) -> tuple[str | None, str | None]:
        """The pod IP of a ready sidecar on `node`, else None and why."""
        pods = self.pods(self.namespace, {"labelSelector": self.selector,
                                          "fieldSelector": f"spec.nodeName={node}"})
        for pod in pods:
            status = pod.get("status", {})
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions", ()))
            if status.get("phase") == "Running" and ready and status.get("podIP"):
                return str(status["podIP"]), None
        what = "no pod" if not pods else f"no ready pod (of {len(pods)})"
        return None, (f"node {node} has {what} matching {self.selector} in namespace "
                      f"{self.namespace}")


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address
