"""The warm-up plan: validated once, into frozen dataclasses (docs/ARCHITECTURE.md, "Warm-up plan").

    {
      "origin": {"endpoint": "http://127.0.0.1:9000", "bucket": "tiered",
                 "prefix": "", "region": "us-east-1"},
      "layout": "aiven",
      "sidecars": {"broker-1": "http://10.0.0.1:9331", "broker-2": "http://10.0.0.2:9331"},
      "assignment": {"orders-0": "broker-1", "orders-1": "broker-2"},
      "replays": [
        {"topic": "orders", "partitions": [0, 1], "from_offset": 1000, "to_offset": 500000},
        {"topic": "clicks", "partitions": "all",
         "from_time": "2026-11-01T00:00:00Z", "to_time": "2026-11-01T06:00:00Z"}
      ],
      "ttl_s": 7200
    }

Instead of (or besides) `sidecars` and `assignment`, a plan may name the
Kafka cluster, whose metadata then routes every partition to the sidecar of
the broker that serves it (`spark_warmup.cluster` reads it, `routing` decides):

    "kafka": {"bootstrap_servers": "b1:9092,b2:9092",
              "sidecar_url": "http://{host}:9331",
              "sidecars": {"1": "http://10.0.0.1:9331"},
              "replica": "leader",
              "security": {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                           "sasl_plain_username": "warmup", "sasl_plain_password": "..."},
              "timeout_s": 30}

`sidecar_url` is a template (`{host}`, `{id}`, `{rack}` of the broker; in
Kubernetes also `{node}`, `{node_ip}` and `{sidecar_ip}`: the node the broker's pod
runs on, its address, and the pod IP of the sidecar there, which
`spark_warmup.placement` asks the API server for, as `kafka.kubernetes` says:
`{"api": URL, "namespace": NS, "broker_namespace": NS, "sidecar_selector":
"app.kubernetes.io/name=kafka-cold-sidecar"}`, all optional);
`sidecars` maps broker ids to sidecar URLs and wins over the template; one of
the two is required. `replica`: `leader` (default), `rack:RACK` (the in-sync
replica in that rack, as fetch-from-follower reads, else the leader) or `all`
(every replica's sidecar). `security` holds kafka-python's own client settings
(SASL/SSL). An `assignment` entry still wins for its partition.

A replay may name a consumer group instead of a start: `{"group": "billing",
"topic": "orders"}` (partitions optional) reads from the group's committed
offset of each partition to the partition's end (or `to_offset` / `to_time`).

Optional keys beyond the contract's example: `admin_token` or
`admin_token_file` (else the SIDECAR_ADMIN_TOKEN env var, else the file named by
SIDECAR_ADMIN_TOKEN_FILE), `ca_file` (PEM certificates to verify https:// sidecars
with, else the system's), `warm_rate` (`"200MiB/s"`, or one per sidecar
name; default 100MiB/s; only for the dry run's estimate), `block_size` (the
sidecars' block size, default 8MiB; only to estimate blocks where no sidecar
answered), `concurrency` (warm calls in flight per sidecar, default 4) and
`retries` (per warm call on connection errors and 5xx, default 3).

Each replay gives an offset range (`from_offset`, `to_offset`, inclusive, either
may be left out), a time range (`from_time`, `to_time`: ISO 8601 with a zone, or
epoch milliseconds) or neither (the whole partition). Every error names the
field it is about, e.g. `replays[1].to_time: ...`.
"""

from __future__ import annotations

import json
import math
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from string import Formatter
from urllib.parse import urlsplit

from sidecar.blocks import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from sidecar.bucket_names import bucket_name_problem, uncached_bucket_problem
from spark_warmup.sidecar_urls import SidecarUrlError, check_sidecar_url
from spark_warmup.units import parse_rate, parse_size

DEFAULT_TTL_S = 3600.0
MAX_TTL_S = 7 * 24 * 3600  # what a sidecar accepts for one warm call
DEFAULT_WARM_RATE = 100.0 * 1024 * 1024
DEFAULT_BLOCK_SIZE = 8 * 1024 * 1024
DEFAULT_CONCURRENCY = 4
DEFAULT_RETRIES = 3

_TOP = ("origin", "layout", "sidecars", "assignment", "kafka", "replays", "ttl_s", "warm_rate",
        "admin_token", "admin_token_file", "ca_file", "block_size", "concurrency", "retries")
_KAFKA = ("bootstrap_servers", "sidecar_url", "sidecars", "replica", "security", "timeout_s",
          "kubernetes")
_KUBERNETES = ("api", "namespace", "broker_namespace", "sidecar_selector")
# kafka-python's client settings for SASL and SSL (KafkaAdminClient's names) that a
# JSON plan can carry; objects (ssl_context, token providers) cannot be written in one.
_SECURITY_STRINGS = (
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_kerberos_service_name", "sasl_kerberos_domain_name", "ssl_cafile", "ssl_certfile",
    "ssl_keyfile", "ssl_password", "ssl_crlfile",
)
_SECURITY_BOOLS = ("ssl_check_hostname",)
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512")
_TEMPLATE_FIELDS = ("host", "id", "rack")
# Filled from where the broker's pod runs (spark_warmup.placement).
PLACEMENT_FIELDS = ("node", "node_ip", "sidecar_ip")
DEFAULT_SIDECAR_SELECTOR = "app.kubernetes.io/name=kafka-cold-sidecar"
DEFAULT_KAFKA_TIMEOUT_S = 30.0
_ORIGIN = ("endpoint", "bucket", "prefix", "region")
_REPLAY = ("topic", "partitions", "from_offset", "to_offset", "from_time", "to_time", "group")
# Kafka's group.id may be any non-empty string; a bound keeps error messages short.
_MAX_GROUP = 255
# Kafka's legal topic names (Topic.validate): at most 249 of these characters.
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_TOPIC_PARTITION = re.compile(r"(?P<topic>.+)-(?P<partition>0|[1-9][0-9]{0,9})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# ASCII digits only: str.isdigit() also takes '²' and other scripts' digits, which
# int() then refuses.
_BROKER_ID = re.compile(r"0|[1-9][0-9]{0,9}")
_PORT = re.compile(r"[0-9]{1,5}")
_MAX_INT32 = 2**31 - 1  # Kafka's broker ids and partitions are int32s
_MAX_INT64 = 2**63 - 1  # and its offsets and timestamps (epoch ms) int64s


class PlanError(ValueError):
    """A plan that cannot be run; the message starts with the field it is about."""


@dataclass(frozen=True)
class OriginSpec:
    endpoint: str | None
    bucket: str
    prefix: str = ""
    region: str = "us-east-1"


@dataclass(frozen=True)
class Span:
    """An inclusive range [first, last]; `last` None is open-ended."""

    first: int = 0
    last: int | None = None


@dataclass(frozen=True)
class Replay:
    where: str  # "replays[i]", for error messages found later (listing)
    topic: str
    partitions: tuple[int, ...] | None  # None = every partition in the bucket
    offsets: Span | None = None
    times_ms: Span | None = None
    # A consumer group's next reads: offsets start at its committed offsets, and
    # `offsets.last` / `times_ms.last` (if given) bound the end; see `groups`.
    group: str | None = None


@dataclass(frozen=True)
class KubernetesSpec:
    """Where the API server and the pods are, for a template's placement fields."""

    api: str | None = None  # None: in the cluster (the service account's token and CA)
    namespace: str | None = None  # the sidecars'; None: the service account's own
    broker_namespace: str | None = None  # the brokers'; None: the sidecars'
    sidecar_selector: str = DEFAULT_SIDECAR_SELECTOR


@dataclass(frozen=True)
class KafkaSpec:
    """The cluster whose metadata routes partitions (and holds the groups' offsets)."""

    bootstrap_servers: tuple[str, ...]
    sidecar_url: str | None = None  # template: {host}, {id}, {rack}, PLACEMENT_FIELDS
    broker_sidecars: Mapping[int, str] = field(default_factory=dict)  # broker id -> URL
    replica: str = "leader"  # "leader", "all" or "rack"
    rack: str | None = None  # for replica "rack"
    security: Mapping[str, str | bool] = field(default_factory=dict)
    timeout_s: float = DEFAULT_KAFKA_TIMEOUT_S
    kubernetes: KubernetesSpec = field(default_factory=KubernetesSpec)

    @property
    def needs_placement(self) -> bool:
        """Whether the template names where a broker's pod runs."""
        return self.sidecar_url is not None and any(
            name in PLACEMENT_FIELDS for _, name, _, _ in Formatter().parse(self.sidecar_url))


@dataclass(frozen=True)
class Plan:
    origin: OriginSpec
    sidecars: Mapping[str, str]  # node name -> admin URL
    assignment: Mapping[str, str]  # "topic-partition" -> node name
    replays: tuple[Replay, ...]
    ttl_s: float = DEFAULT_TTL_S
    warm_rates: Mapping[str, float] | None = None  # node -> bytes/s; missing = default
    admin_token: str | None = None
    ca_file: str | None = None  # PEM CAs for https:// sidecars (on every executor)
    block_size: int = DEFAULT_BLOCK_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    retries: int = DEFAULT_RETRIES
    layout: str = "aiven"
    kafka: KafkaSpec | None = None
    # The rate of a node the plan does not name (a broker's sidecar found in the
    # cluster's metadata): a single `warm_rate`, else the default.
    default_warm_rate: float = DEFAULT_WARM_RATE

    def warm_rate(self, node: str) -> float:
        return (self.warm_rates or {}).get(node, self.default_warm_rate)


def load_plan(path: Path, env: Mapping[str, str]) -> Plan:
    """Read and validate a plan file; PlanError (naming the field) if it cannot run."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"cannot read the plan: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:  # JSON is UTF-8 (RFC 8259); Latin-1, UTF-16 are not
        raise PlanError(f"not UTF-8 text: byte {exc.start} is {exc.object[exc.start]:#04x} "
                        "(a JSON plan is UTF-8)") from None
    try:
        document = json.loads(text, parse_constant=_no_constant,
                              object_pairs_hook=_unique_keys)
    except PlanError:
        raise
    except RecursionError:
        raise PlanError("not JSON this job reads: nested too deeply") from None
    except ValueError as exc:
        raise PlanError(f"not JSON: {exc}") from None
    return parse_plan(document, env)


def parse_plan(document: object, env: Mapping[str, str]) -> Plan:
    """Validate a decoded plan. `env` supplies SIDECAR_ADMIN_TOKEN when the plan has none."""
    top = _mapping(document, "plan")
    _known(top, _TOP, "plan")
    origin = _origin(_required(top, "origin", "plan"))
    layout = top.get("layout", "aiven")
    if layout != "aiven":
        raise PlanError(
            "layout: only 'aiven' can be planned (its keys carry the start offsets), "
            f"got {layout!r}"
        )
    kafka = _kafka(top["kafka"]) if "kafka" in top else None
    if kafka is None:
        sidecars = _sidecars(_required(top, "sidecars", "plan"))
    else:
        sidecars = _sidecars(top["sidecars"]) if "sidecars" in top else {}
    assignment = _assignment(top.get("assignment", {}), sidecars)
    replays_value = _required(top, "replays", "plan")
    if not isinstance(replays_value, list) or not replays_value:
        raise PlanError("replays: must be a non-empty list of replays")
    replays = tuple(_replay(item, f"replays[{i}]") for i, item in enumerate(replays_value))
    for replay in replays:
        if replay.group is not None and kafka is None:
            raise PlanError(f"{replay.where}.group: needs the plan's \"kafka\" cluster, "
                            "where the group's committed offsets are read")
    warm_rate = top.get("warm_rate")
    token = _admin_token(top, env)
    return Plan(
        origin=origin, sidecars=sidecars, assignment=assignment, replays=replays,
        ttl_s=_ttl(top.get("ttl_s", DEFAULT_TTL_S)),
        warm_rates=_warm_rates(warm_rate, sidecars, kafka is not None),
        default_warm_rate=(_rate(warm_rate, "warm_rate") if isinstance(warm_rate, str)
                           else DEFAULT_WARM_RATE),
        admin_token=token,
        ca_file=_ca_file(top.get("ca_file")),
        block_size=_block_size(top.get("block_size", DEFAULT_BLOCK_SIZE)),
        concurrency=_bounded_int(top.get("concurrency", DEFAULT_CONCURRENCY), "concurrency", 1, 64),
        retries=_bounded_int(top.get("retries", DEFAULT_RETRIES), "retries", 0, 10),
        layout=layout,
        kafka=kafka,
    )


def _admin_token(top: Mapping[str, object], env: Mapping[str, str]) -> str | None:
    """`admin_token`, else `admin_token_file` (the file a sidecar generates its
    token into, mode 0600), else SIDECAR_ADMIN_TOKEN, else SIDECAR_ADMIN_TOKEN_FILE."""
    if "admin_token" in top and "admin_token_file" in top:
        raise PlanError("admin_token, admin_token_file: give one of them, not both")
    token = top.get("admin_token")
    where = "admin_token"
    if token is None and "admin_token_file" in top:
        token, where = _token_file(top["admin_token_file"], "admin_token_file"), \
            "admin_token_file"
    if token is None and env.get("SIDECAR_ADMIN_TOKEN", "").strip():
        token, where = env["SIDECAR_ADMIN_TOKEN"], "SIDECAR_ADMIN_TOKEN"
    if token is None and env.get("SIDECAR_ADMIN_TOKEN_FILE"):
        token = _token_file(env["SIDECAR_ADMIN_TOKEN_FILE"], "SIDECAR_ADMIN_TOKEN_FILE")
    if token is None:
        return None
    if not isinstance(token, str) or not token.strip():
        raise PlanError(f"{where}: must be a non-empty string")
    # Surrounding whitespace goes, as the sidecar drops it from the same setting
    # (a Secret given as a variable often ends in a newline). What is left goes
    # into every call's Authorization header: a line break or a non-ASCII letter
    # there would fail each call inside the executors, a space would be a 401.
    # The message does not show the token.
    token = token.strip()
    if not token.isascii() or not token.isprintable() or " " in token:
        raise PlanError(f"{where}: must be one token (printable ASCII without spaces)")
    return token


def _ca_file(value: object) -> str | None:
    """A PEM file of CA certificates the driver can load (executors read the same
    path, so it must be there on every node)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PlanError("ca_file: must be the path of a PEM file of CA certificates")
    try:
        ssl.create_default_context(cafile=value)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PlanError(f"ca_file: cannot load CA certificates from {value}: {reason}") from None
    return value


def _token_file(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise PlanError(f"{where}: must be the path of the sidecars' admin token file")
    try:
        token = Path(value).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII text"
        raise PlanError(f"{where}: cannot read {value}: {reason}") from None
    if not token or not token.isprintable() or " " in token:
        raise PlanError(f"{where}: {value} does not hold one token")
    return token


def _origin(value: object) -> OriginSpec:
    origin = _mapping(value, "origin")
    _known(origin, _ORIGIN, "origin")
    endpoint = origin.get("endpoint")
    if endpoint is not None:
        endpoint = _url(endpoint, "origin.endpoint")
    bucket = _required(origin, "bucket", "origin")
    # What could never be a bucket is an error here; S3's legacy names (upper
    # case, '_') are buckets still (sidecar.bucket_names), and the warm-up caches
    # their objects, so a name the cache cannot record is one too.
    if not isinstance(bucket, str):
        raise PlanError(f"origin.bucket: not an S3 bucket name: {bucket!r}")
    problem = bucket_name_problem(bucket) or uncached_bucket_problem(bucket)
    if problem is not None:
        raise PlanError(f"origin.bucket: {problem}: {bucket[:70]!r}")
    prefix = origin.get("prefix", "")
    if not isinstance(prefix, str):
        raise PlanError(f"origin.prefix: must be a string, got {prefix!r}")
    region = origin.get("region", "us-east-1")
    if not isinstance(region, str) or not region:
        raise PlanError(f"origin.region: must be a non-empty string, got {region!r}")
    return OriginSpec(endpoint, bucket, prefix, region)


def _sidecars(value: object) -> dict[str, str]:
    sidecars = _mapping(value, "sidecars")
    if not sidecars:
        raise PlanError("sidecars: must name at least one sidecar (node name -> admin URL)")
    result: dict[str, str] = {}
    for name, url in sidecars.items():
        if not name:
            raise PlanError("sidecars: a node name must not be empty")
        result[name] = _sidecar_url(url, f"sidecars.{name}")
    return result


def _sidecar_url(value: object, where: str) -> str:
    try:
        return check_sidecar_url(value)
    except SidecarUrlError as exc:
        raise PlanError(f"{where}: {exc}") from None


def _kafka(value: object) -> KafkaSpec:
    kafka = _mapping(value, "kafka")
    _known(kafka, _KAFKA, "kafka")
    servers = _bootstrap_servers(_required(kafka, "bootstrap_servers", "kafka"))
    template = kafka.get("sidecar_url")
    if template is not None:
        template = _template(template, "kafka.sidecar_url")
    broker_sidecars: dict[int, str] = {}
    for key, url in _mapping(kafka.get("sidecars", {}), "kafka.sidecars").items():
        if _BROKER_ID.fullmatch(key) is None or int(key) > _MAX_INT32:
            raise PlanError(f"kafka.sidecars.{key}: a key must be a broker id, e.g. \"1\"")
        # The admin token goes to these as to `sidecars`: checked as strictly.
        where = f"kafka.sidecars.{key}"
        broker_sidecars[int(key)] = _sidecar_url(_url(url, where), where)
    if template is None and not broker_sidecars:
        raise PlanError("kafka.sidecar_url: missing; give a template such as "
                        "\"http://{host}:9331\", or kafka.sidecars (broker id -> sidecar URL)")
    replica = kafka.get("replica", "leader")
    rack = None
    if isinstance(replica, str) and replica.startswith("rack:") and len(replica) > 5:
        replica, rack = "rack", replica[5:]
    elif replica not in ("leader", "all"):
        raise PlanError(f"kafka.replica: must be \"leader\", \"rack:RACK\" or \"all\", "
                        f"got {replica!r}")
    assert isinstance(replica, str)
    timeout = kafka.get("timeout_s", DEFAULT_KAFKA_TIMEOUT_S)
    if not _finite(timeout) or not 0 < timeout <= 600:  # type: ignore[operator]
        raise PlanError(f"kafka.timeout_s: must be a number of seconds, > 0 and at most 600, "
                        f"got {_shown(timeout)}")
    assert isinstance(timeout, int | float)
    return KafkaSpec(servers, template, broker_sidecars, replica, rack,
                     _security(kafka.get("security", {})), float(timeout),
                     _kubernetes(kafka.get("kubernetes", {})))


def _kubernetes(value: object) -> KubernetesSpec:
    spec = _mapping(value, "kafka.kubernetes")
    _known(spec, _KUBERNETES, "kafka.kubernetes")
    strings: dict[str, str] = {}
    for name, setting in spec.items():
        if not isinstance(setting, str) or not setting.strip():
            raise PlanError(f"kafka.kubernetes.{name}: must be a non-empty string, "
                            f"got {setting!r}")
        strings[name] = setting.strip()
    if "api" in strings:
        strings["api"] = _url(strings["api"], "kafka.kubernetes.api").rstrip("/")
    return KubernetesSpec(**strings)


def _bootstrap_servers(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise PlanError("kafka.bootstrap_servers: must be \"host:port,host:port\" or a list "
                        f"of \"host:port\", got {value!r}")
    servers = []
    for item in items:
        server = item.strip() if isinstance(item, str) else ""
        host, _, port = server.rpartition(":")
        if not host or _PORT.fullmatch(port) is None or not 0 < int(port) < 65536:
            raise PlanError(f"kafka.bootstrap_servers: {item!r} is not host:port")
        servers.append(server)
    return tuple(servers)


def _template(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise PlanError(f"{where}: must be a URL template such as \"http://{{host}}:9331\", "
                        f"got {value!r}")
    try:
        sample = value.format(host="broker.example", id=1, rack="rack", node="node-1",
                              node_ip="10.0.0.1", sidecar_ip="10.1.0.1")
    except (KeyError, IndexError, ValueError):
        raise PlanError(f"{where}: only {{host}}, {{id}} and {{rack}} (and in Kubernetes "
                        f"{{node}}, {{node_ip}} and {{sidecar_ip}}) may be filled in, "
                        f"got {value!r}") from None
    _sidecar_url(sample, where)
    return value.rstrip("/")


def _security(value: object) -> dict[str, str | bool]:
    security = _mapping(value, "kafka.security")
    _known(security, _SECURITY_STRINGS + _SECURITY_BOOLS, "kafka.security")
    result: dict[str, str | bool] = {}
    for name, setting in security.items():
        where = f"kafka.security.{name}"
        if name in _SECURITY_BOOLS:
            if not isinstance(setting, bool):
                raise PlanError(f"{where}: must be true or false, got {setting!r}")
        elif not isinstance(setting, str) or not setting:
            raise PlanError(f"{where}: must be a non-empty string")
        result[name] = setting
    protocol = result.get("security_protocol", "PLAINTEXT")
    if protocol not in _PROTOCOLS:
        raise PlanError(f"kafka.security.security_protocol: one of {', '.join(_PROTOCOLS)}, "
                        f"got {protocol!r}")
    mechanism = result.get("sasl_mechanism")
    if mechanism is not None and mechanism not in _MECHANISMS:
        raise PlanError(f"kafka.security.sasl_mechanism: one of {', '.join(_MECHANISMS)}, "
                        f"got {mechanism!r}")
    if str(protocol).startswith("SASL_") and mechanism is None:
        raise PlanError(f"kafka.security.sasl_mechanism: missing (needed for {protocol})")
    return result


def _assignment(value: object, sidecars: Mapping[str, str]) -> dict[str, str]:
    assignment = _mapping(value, "assignment")
    for key, node in assignment.items():
        match = _TOPIC_PARTITION.fullmatch(key)
        if match is None or int(match["partition"]) > _MAX_INT32:
            raise PlanError(f"assignment.{key}: a key must be 'topic-partition', e.g. 'orders-0'")
        if not isinstance(node, str) or node not in sidecars:
            raise PlanError(
                f"assignment.{key}: {node!r} is not one of the sidecars ({', '.join(sidecars)})"
            )
    return dict(assignment)  # type: ignore[arg-type]  # values checked above


def _replay(value: object, where: str) -> Replay:
    replay = _mapping(value, where)
    _known(replay, _REPLAY, where)
    topic = _required(replay, "topic", where)
    if not isinstance(topic, str) or _TOPIC.fullmatch(topic) is None:
        raise PlanError(f"{where}.topic: not a Kafka topic name: {topic!r}")
    partitions = _partitions(replay.get("partitions", "all"), f"{where}.partitions")
    group = replay.get("group")
    if group is not None:
        if not isinstance(group, str) or not 0 < len(group) <= _MAX_GROUP:
            raise PlanError(f"{where}.group: must be a consumer group id, got {group!r}")
        for start in ("from_offset", "from_time"):
            if start in replay:
                raise PlanError(f"{where}.{start}: a group's replay starts at its committed "
                                "offsets; give only to_offset or to_time")
    has_offsets = "from_offset" in replay or "to_offset" in replay
    has_times = "from_time" in replay or "to_time" in replay
    if has_offsets and has_times:
        raise PlanError(f"{where}: give an offset range or a time range, not both")
    offsets = times = None
    if has_offsets:
        offsets = _span(
            _optional(_offset, replay.get("from_offset"), f"{where}.from_offset") or 0,
            _optional(_offset, replay.get("to_offset"), f"{where}.to_offset"),
            f"{where}.to_offset",
        )
    if has_times:
        times = _span(
            _optional(_time, replay.get("from_time"), f"{where}.from_time") or 0,
            _optional(_time, replay.get("to_time"), f"{where}.to_time"),
            f"{where}.to_time",
        )
    return Replay(where, topic, partitions, offsets, times, group)


def _partitions(value: object, where: str) -> tuple[int, ...] | None:
    if value == "all":
        return None
    if not isinstance(value, list) or not value:
        raise PlanError(f"{where}: must be \"all\" or a non-empty list of partition numbers")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= _MAX_INT32:
            raise PlanError(f"{where}: {item!r} is not a partition number "
                            f"(0 to {_MAX_INT32}, as Kafka's)")
    if len(set(value)) != len(value):
        raise PlanError(f"{where}: lists a partition twice")
    return tuple(sorted(value))


def _span(first: int, last: int | None, where: str) -> Span:
    if last is not None and last < first:
        raise PlanError(f"{where}: {last} is before the start of the range ({first})")
    return Span(first, last)


def _optional(parse: Callable[[object, str], int], value: object, where: str) -> int | None:
    return None if value is None else parse(value, where)


def _offset(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT64:
        raise PlanError(f"{where}: must be a non-negative integer offset "
                        f"(at most {_MAX_INT64}, as Kafka's), got {value!r}")
    return value


def _time(value: object, where: str) -> int:
    """Epoch milliseconds from an ISO 8601 time with a zone, or an int already in ms;
    either within Kafka's timestamps (int64 ms, none before 1970)."""
    ms: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
        if moment is not None and moment.tzinfo is not None:
            ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    if ms is not None:
        if not 0 <= ms <= _MAX_INT64:
            raise PlanError(f"{where}: {value!r} is not a Kafka timestamp (epoch milliseconds "
                            f"from 0, 1970-01-01T00:00:00Z, to {_MAX_INT64})")
        return ms
    raise PlanError(
        f"{where}: must be an ISO 8601 time with a zone (e.g. 2026-11-01T00:00:00Z) "
        f"or epoch milliseconds, got {value!r}"
    )


def _ttl(value: object) -> float:
    if not _finite(value):
        raise PlanError(f"ttl_s: must be a number of seconds, got {_shown(value)}")
    assert isinstance(value, int | float)
    if not 0 < value <= MAX_TTL_S:
        raise PlanError(f"ttl_s: must be > 0 and at most {MAX_TTL_S} (7 days), got {value}")
    return float(value)


def _finite(value: object) -> bool:
    """A JSON number that is a finite float. JSON integers have no bound, and
    math.isfinite raises OverflowError for one past a float's range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _shown(value: object) -> str:
    """A value as an error message shows it: an integer of 400 digits, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _warm_rates(value: object, sidecars: Mapping[str, str],
                cluster: bool) -> dict[str, float] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        rates = {}
        for node, rate in value.items():
            # A cluster's nodes ("broker-ID") are known only once its metadata is read.
            if node not in sidecars and not (cluster and node.startswith("broker-")):
                raise PlanError(
                    f"warm_rate.{node}: not one of the sidecars ({', '.join(sidecars)})")
            rates[node] = _rate(rate, f"warm_rate.{node}")
        return rates
    rate = _rate(value, "warm_rate")
    return {node: rate for node in sidecars}


def _rate(value: object, where: str) -> float:
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise PlanError(f"{where}: {exc}") from None


def _block_size(value: object) -> int:
    """The sidecars' block size, by their own rule (sidecar/config/loading.py):
    the plan counts blocks of it and a progress line bytes, so a size no
    sidecar runs with (1 byte, 1 GiB) would make every such figure wrong."""
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise PlanError(f"block_size: {exc}") from None
    if not MIN_BLOCK_SIZE <= size <= MAX_BLOCK_SIZE or size % 4096:
        raise PlanError("block_size: must be the sidecars' block size, a multiple of 4KiB "
                        f"from 64KiB to 256MiB, got {_shown(size)}")
    return size


def _bounded_int(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError(f"{where}: must be an integer from {low} to {high}, got {value!r}")
    return value


def _url(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise PlanError(f"{where}: must be an http(s) URL, got {value!r}")
    try:
        parts = urlsplit(value)
    except ValueError as exc:  # a bracketed host unclosed or not an address: "http://[::1"
        raise PlanError(f"{where}: not a URL ({exc}): {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PlanError(f"{where}: must be an http(s) URL, got {value!r}")
    try:
        parts.port  # noqa: B018  # raises on a port that is not a number
    except ValueError:
        raise PlanError(f"{where}: bad port in {value!r}") from None
    return value


def _mapping(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise PlanError(f"{where}: must be a JSON object, got {type(value).__name__}")
    return value


def _required(document: Mapping[str, object], name: str, where: str) -> object:
    if name not in document:
        field = name if where == "plan" else f"{where}.{name}"
        raise PlanError(f"{field}: missing")
    return document[name]


def _known(document: Mapping[str, object], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(document) - set(allowed))
    if unknown:
        field = unknown[0] if where == "plan" else f"{where}.{unknown[0]}"
        raise PlanError(f"{field}: unknown field; allowed here: {', '.join(allowed)}")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are each given once: json.loads keeps a repeated
    key's last value and drops the first silently (a replay list, a sidecar)."""
    document: dict[str, object] = {}
    for key, value in pairs:
        if key in document:
            raise PlanError(f"{key}: given twice in the same JSON object; give each key once")
        document[key] = value
    return document


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")
