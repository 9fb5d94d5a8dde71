"""Plans that name the Kafka cluster: their validation, routing partitions to the sidecar
of the broker that serves them, and consumer groups' next reads as offset ranges."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from spark_warmup.groups import GroupLag, next_reads, resolve_groups
from spark_warmup.metadata import NO_LEADER, Broker, ClusterFacts, GroupPosition, PartitionReplicas
from spark_warmup.outcome import format_groups, hashing_warning, unlisted_replicas_warning
from spark_warmup.plan import KafkaSpec, PlanError, Replay, Span, parse_plan
from spark_warmup.routing import broker_node, route_partitions, serving_brokers, sidecar_url

CLUSTER_PLAN: dict[str, Any] = {
    "origin": {"bucket": "tiered"},
    "kafka": {"bootstrap_servers": "b1:9092,b2:9092", "sidecar_url": "http://{host}:9331"},
    "replays": [{"group": "billing", "topic": "orders"},
                {"topic": "clicks", "from_offset": 10}],
}
BROKERS = {
    1: Broker(1, "b1.example", 9092, "eu-1a"),
    2: Broker(2, "b2.example", 9092, "eu-1b"),
    3: Broker(3, "b3.example", 9092, "eu-1c"),
}


def cluster_plan(**kafka: object) -> dict[str, Any]:
    document = copy.deepcopy(CLUSTER_PLAN)
    document["kafka"].update(kafka)
    return document


def facts(partitions: dict[tuple[str, int], PartitionReplicas]) -> ClusterFacts:
    return ClusterFacts("b1:9092", BROKERS, partitions)


def test_a_cluster_plan_needs_no_sidecars_and_parses_its_kafka_block() -> None:
    plan = parse_plan(cluster_plan(
        replica="rack:eu-1b", sidecars={"3": "http://10.0.0.3:9331/"}, timeout_s=5,
        security={"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "warmup", "sasl_plain_password": "secret",
                  "ssl_check_hostname": False},
    ), env={})
    assert plan.sidecars == {} and plan.assignment == {}
    assert plan.kafka == KafkaSpec(
        ("b1:9092", "b2:9092"), "http://{host}:9331", {3: "http://10.0.0.3:9331"}, "rack",
        "eu-1b", {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "warmup", "sasl_plain_password": "secret",
                  "ssl_check_hostname": False}, 5.0)
    group, clicks = plan.replays
    assert (group.group, group.topic, group.partitions, group.offsets) == (
        "billing", "orders", None, None)
    assert clicks.group is None and clicks.offsets == Span(10, None)


def test_a_group_replay_may_bound_its_end() -> None:
    document = cluster_plan()
    document["replays"] = [{"group": "g", "topic": "orders", "partitions": [1],
                            "to_offset": 99},
                           {"group": "g", "topic": "orders", "to_time": 1_790_000_000_000}]
    by_offset, by_time = parse_plan(document, env={}).replays
    assert by_offset.offsets == Span(0, 99) and by_offset.partitions == (1,)
    assert by_time.times_ms == Span(0, 1_790_000_000_000)


def test_a_single_warm_rate_applies_to_the_brokers_found_later() -> None:
    plan = parse_plan({**cluster_plan(), "warm_rate": "50MiB/s"}, env={})
    assert plan.warm_rate("broker-7") == 50 * 1024 * 1024
    plan = parse_plan({**cluster_plan(), "warm_rate": {"broker-7": "10MiB/s"}}, env={})
    assert plan.warm_rate("broker-7") == 10 * 1024 * 1024


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bootstrap_servers": ""}, "kafka.bootstrap_servers: '' is not host:port"),
        ({"bootstrap_servers": "b1"}, "kafka.bootstrap_servers: 'b1' is not host:port"),
        ({"bootstrap_servers": 9092}, "kafka.bootstrap_servers: must be"),
        ({"sidecar_url": None}, "kafka.sidecar_url: missing"),
        ({"sidecar_url": "http://{hostname}:9331"}, "kafka.sidecar_url: only {host}"),
        ({"sidecar_url": "{host}:9331"}, "kafka.sidecar_url: must be an http(s) URL"),
        ({"sidecars": {"one": "http://a:1"}}, "kafka.sidecars.one: a key must be a broker id"),
        ({"sidecars": {"\u00b2": "http://a:1"}}, "kafka.sidecars.\u00b2: a key must be a broker"),
        ({"sidecars": {"2147483648": "http://a:1"}},
         "kafka.sidecars.2147483648: a key must be a broker id"),
        ({"bootstrap_servers": "h:\u00b2"}, "kafka.bootstrap_servers: 'h:\u00b2' is not host:port"),
        ({"sidecars": {"1": "a:1"}}, "kafka.sidecars.1: must be an http(s) URL"),
        ({"sidecars": {"1": "http://[::1"}}, "kafka.sidecars.1: not a URL (Invalid IPv6 URL)"),
        # The admin token goes to these: only http(s)://HOST[:PORT], as for `sidecars`.
        ({"sidecars": {"1": "http://user@evil.example:9331"}},
         "kafka.sidecars.1: must not carry a user name ('@')"),
        ({"sidecars": {"1": "http://a:9331/api"}}, "kafka.sidecars.1: must not have a path"),
        ({"sidecars": {"1": "http://a:9331?x"}}, "kafka.sidecars.1: must not carry a query"),
        ({"sidecars": {"1": "http://a:9331#x"}}, "kafka.sidecars.1: must not carry a fragment"),
        ({"sidecars": {"1": "http://a b:9331"}}, "kafka.sidecars.1: must be printable ASCII"),
        ({"sidecars": {"1": "http://a_!:9331"}}, "kafka.sidecars.1: 'a_!' is not a host name"),
        ({"sidecars": {"1": "ftp://a:9331"}}, "kafka.sidecars.1: must be an http(s) URL"),
        ({"sidecars": {"1": 9331}}, "kafka.sidecars.1: must be an http(s) URL, got 9331"),
        ({"kubernetes": {"api": "https://[x"}}, "kafka.kubernetes.api: not a URL ("),
        ({"replica": "follower"}, "kafka.replica: must be \"leader\", \"rack:RACK\" or \"all\""),
        ({"replica": "rack:"}, "kafka.replica: must be"),
        ({"timeout_s": 0}, "kafka.timeout_s: must be a number of seconds"),
        ({"timeout_s": 10**400}, "kafka.timeout_s: must be a number of seconds, > 0 and at "
         "most 600, got 10000000000000000000... (401 characters)"),
        ({"security": {"sasl_mechanism": "MAGIC", "security_protocol": "SASL_SSL"}},
         "kafka.security.sasl_mechanism: one of PLAIN"),
        ({"security": {"security_protocol": "SASL_SSL"}},
         "kafka.security.sasl_mechanism: missing (needed for SASL_SSL)"),
        ({"security": {"security_protocol": "TLS"}}, "kafka.security.security_protocol: one of"),
        ({"security": {"ssl_context": "x"}}, "kafka.security.ssl_context: unknown field"),
        ({"security": {"ssl_check_hostname": "no"}},
         "kafka.security.ssl_check_hostname: must be true or false"),
        ({"bootstrap": "b1:9092"}, "kafka.bootstrap: unknown field"),
    ],
)
def test_bad_kafka_blocks_name_the_field(change: dict[str, object], message: str) -> None:
    document = cluster_plan(**change)
    if change.get("sidecar_url", "") is None:
        del document["kafka"]["sidecar_url"]
    with pytest.raises(PlanError) as caught:
        parse_plan(document, env={})
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("replay", "message"),
    [
        ({"group": "", "topic": "orders"}, "replays[0].group: must be a consumer group id"),
        ({"group": "g", "topic": "orders", "from_offset": 5},
         "replays[0].from_offset: a group's replay starts at its committed offsets"),
        ({"group": "g", "topic": "orders", "from_time": 5}, "replays[0].from_time: a group's"),
    ],
)
def test_bad_group_replays_name_the_field(replay: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan({**cluster_plan(), "replays": [replay]}, env={})
    assert str(caught.value).startswith(message)


def test_a_group_needs_the_cluster_and_a_plan_needs_sidecars_or_a_cluster() -> None:
    document = copy.deepcopy(CLUSTER_PLAN)
    del document["kafka"]
    document["sidecars"] = {"a": "http://127.0.0.1:9331"}
    with pytest.raises(PlanError, match=r"^replays\[0\]\.group: needs the plan's \"kafka\""):
        parse_plan(document, env={})
    del document["sidecars"]
    with pytest.raises(PlanError, match=r"^sidecars: missing"):
        parse_plan(document, env={})


# -- which broker serves a partition ----------------------------------------


def test_the_leader_serves_by_default() -> None:
    replicas = PartitionReplicas(leader=2, replicas=(2, 3, 1), isr=(2, 3, 1))
    assert serving_brokers(replicas, "leader", None, BROKERS) == (2,)


def test_a_rack_reads_from_its_in_sync_replica_else_the_leader() -> None:
    replicas = PartitionReplicas(leader=2, replicas=(2, 3, 1), isr=(2, 3, 1))
    assert serving_brokers(replicas, "rack", "eu-1c", BROKERS) == (3,)
    assert serving_brokers(replicas, "rack", "eu-1b", BROKERS) == (2,)  # the leader is there
    # Broker 3 is in the rack but out of sync: it does not serve; the leader does.
    lagging = PartitionReplicas(leader=2, replicas=(2, 3, 1), isr=(2, 1))
    assert serving_brokers(lagging, "rack", "eu-1c", BROKERS) == (2,)
    assert serving_brokers(replicas, "rack", "us-2a", BROKERS) == (2,)


def test_of_several_in_sync_replicas_in_the_rack_each_is_warmed() -> None:
    """Kafka picks the most caught-up of them at each fetch: any one may serve."""
    brokers = {**BROKERS, 4: Broker(4, "b4.example", 9092, "eu-1c")}
    replicas = PartitionReplicas(leader=2, replicas=(2, 4, 3), isr=(2, 4, 3))
    assert serving_brokers(replicas, "rack", "eu-1c", brokers) == (3, 4)
    assert serving_brokers(replicas, "rack", "eu-1b", brokers) == (2,)  # the leader is there


def test_all_means_every_replica_the_cluster_knows() -> None:
    replicas = PartitionReplicas(leader=1, replicas=(1, 3, 9), isr=(1, 3))
    assert serving_brokers(replicas, "all", None, BROKERS) == (1, 3)  # broker 9 is gone


def test_an_offline_partition_has_no_server() -> None:
    offline = PartitionReplicas(leader=NO_LEADER, replicas=(1, 2), isr=())
    assert serving_brokers(offline, "leader", None, BROKERS) == ()


def test_sidecar_urls_come_from_the_map_else_the_template() -> None:
    # A sidecar URL has no path (spark_warmup.sidecar_urls): the fields fill the host.
    spec = KafkaSpec(("b1:9092",), "http://sidecar-{rack}-{id}.{host}:9331",
                     {2: "http://10.0.0.2:1"})
    assert sidecar_url(BROKERS[1], spec) == "http://sidecar-eu-1a-1.b1.example:9331"
    assert sidecar_url(BROKERS[2], spec) == "http://10.0.0.2:1"
    assert sidecar_url(BROKERS[1], KafkaSpec(("b1:9092",), None, {2: "http://x:1"})) is None
    plain = KafkaSpec(("b1:9092",), "http://{host}:9331", {})
    assert sidecar_url(Broker(4, "fd00::4", 9092), plain) == "http://[fd00::4]:9331"


@pytest.mark.parametrize("host", [
    "evil#", "evil.example#", "x@attacker.example", "attacker.example/x", "b1?q=1",
    "b1 .example", "b1\r\nHost: x", "b1:80", "-b1", "b1.exa mple", "bücher.example", "",
    "[fd00::1]", "b1.example:9331@evil",
])
def test_a_broker_host_that_would_move_the_target_is_refused(host: str) -> None:
    spec = KafkaSpec(("b1:9092",), "http://{host}:9331", {})
    with pytest.raises(PlanError, match=r"kafka\.sidecar_url: broker 7 advertises host"):
        sidecar_url(Broker(7, host, 9092), spec)


# -- routing a plan's partitions --------------------------------------------


def test_partitions_go_to_their_leaders_sidecars_and_an_assignment_entry_wins() -> None:
    document = cluster_plan()
    document["sidecars"] = {"spare": "http://10.9.9.9:9331"}
    document["assignment"] = {"orders-2": "spare"}
    plan = parse_plan(document, env={})
    cluster = facts({
        ("orders", 0): PartitionReplicas(1, (1, 2), (1, 2)),
        ("orders", 1): PartitionReplicas(3, (3, 1), (3, 1)),
        ("orders", 2): PartitionReplicas(2, (2, 3), (2, 3)),
    })
    routes = route_partitions(
        [("orders", 0, "replays[0]"), ("orders", 1, "replays[0]"), ("orders", 2, "replays[0]")],
        plan, cluster)
    assert dict(routes.targets) == {("orders", 0): ("broker-1",), ("orders", 1): ("broker-3",),
                                    ("orders", 2): ("spare",)}
    assert dict(routes.nodes) == {"spare": "http://10.9.9.9:9331",
                                  "broker-1": "http://b1.example:9331",
                                  "broker-3": "http://b3.example:9331"}
    assert routes.hashed == ()


def test_with_replica_all_a_partition_goes_to_every_replica() -> None:
    plan = parse_plan(cluster_plan(replica="all"), env={})
    routes = route_partitions([("orders", 0, "replays[0]")], plan,
                              facts({("orders", 0): PartitionReplicas(1, (1, 2, 3), (1, 2))}))
    assert routes.targets[("orders", 0)] == ("broker-1", "broker-2", "broker-3")


def test_with_replica_all_a_replica_whose_broker_is_down_is_said_not_warmed() -> None:
    # Broker 9 holds a replica but is not in the cluster now (down): its sidecar
    # cannot be found, and once it is back it serves from a cache nobody warmed.
    plan = parse_plan(cluster_plan(replica="all"), env={})
    routes = route_partitions(
        [("orders", 0, "replays[0]"), ("orders", 1, "replays[0]")], plan,
        facts({("orders", 0): PartitionReplicas(1, (1, 9, 3), (1, 3)),
               ("orders", 1): PartitionReplicas(2, (2, 3), (2, 3))}))
    assert routes.targets[("orders", 0)] == ("broker-1", "broker-3")
    assert routes.unlisted_replicas == ("orders-0 on broker 9",)
    assert unlisted_replicas_warning(routes.unlisted_replicas) == (
        "warning: 1 replica not warmed (orders-0 on broker 9): its broker is not in the "
        "cluster now (down?), so no sidecar could be found for it; warm again once it is back")
    leader_only = route_partitions(
        [("orders", 0, "replays[0]")], parse_plan(cluster_plan(), env={}),
        facts({("orders", 0): PartitionReplicas(1, (1, 9, 3), (1, 3))}))
    assert leader_only.unlisted_replicas == ()  # only the leader serves: nothing skipped


def test_a_plan_without_a_cluster_hashes_what_it_does_not_assign() -> None:
    plan = parse_plan({"origin": {"bucket": "tiered"},
                       "sidecars": {"a": "http://a:1", "b": "http://b:1"},
                       "assignment": {"orders-0": "b"},
                       "replays": [{"topic": "orders"}]}, env={})
    routes = route_partitions([("orders", 0, "replays[0]"), ("orders", 1, "replays[0]")],
                              plan, None)
    assert routes.targets[("orders", 0)] == ("b",)
    assert routes.hashed == ("orders-1",)
    warning = hashing_warning(routes.hashed, len(plan.sidecars))
    assert warning.startswith("warning: 1 partition (orders-1) placed by hashing topic-partition "
                              "over 2 sidecars")


def test_one_sidecar_takes_every_partition_without_a_warning() -> None:
    plan = parse_plan({"origin": {"bucket": "tiered"}, "sidecars": {"a": "http://a:1"},
                       "replays": [{"topic": "orders"}]}, env={})
    routes = route_partitions([("orders", 0, "replays[0]"), ("orders", 1, "replays[0]")],
                              plan, None)
    assert routes.targets == {("orders", 0): ("a",), ("orders", 1): ("a",)}
    assert routes.hashed == ()


@pytest.mark.parametrize(
    ("cluster", "kafka", "message"),
    [
        (facts({}), {}, "replays[0].partitions: partition 0 of 'orders' has remote segments "
                        "but is not in the cluster at b1:9092"),
        (facts({("orders", 0): PartitionReplicas(NO_LEADER, (1,), ())}), {},
         "replays[0]: partition orders-0 has no leader"),
        (facts({("orders", 0): PartitionReplicas(3, (3,), (3,))}),
         {"sidecar_url": None, "sidecars": {"1": "http://a:1"}},
         "kafka.sidecars: broker 3 (b3.example:9092), which serves orders-0, has no sidecar"),
    ],
)
def test_partitions_that_cannot_be_routed_name_the_field(
    cluster: ClusterFacts, kafka: dict[str, object], message: str,
) -> None:
    document = cluster_plan(**kafka)
    if kafka.get("sidecar_url", "") is None:
        del document["kafka"]["sidecar_url"]
    plan = parse_plan(document, env={})
    with pytest.raises(PlanError) as caught:
        route_partitions([("orders", 0, "replays[0]")], plan, cluster)
    assert str(caught.value).startswith(message)


def test_a_named_sidecar_must_agree_with_the_cluster() -> None:
    document = cluster_plan()
    document["sidecars"] = {"broker-1": "http://elsewhere:9331"}
    plan = parse_plan(document, env={})
    with pytest.raises(PlanError, match=r"^sidecars\.broker-1: http://elsewhere:9331 is not"):
        route_partitions([("orders", 0, "replays[0]")], plan,
                         facts({("orders", 0): PartitionReplicas(1, (1,), (1,))}))


def test_broker_nodes_are_named_by_id() -> None:
    assert broker_node(7) == "broker-7"


# -- consumer groups ----------------------------------------------------------


def test_next_reads_run_from_the_committed_offset_to_the_end() -> None:
    assert next_reads(GroupPosition(100, 1000), None) == Span(100, 999)
    assert next_reads(GroupPosition(100, 1000), 499) == Span(100, 499)
    assert next_reads(GroupPosition(1000, 1000), None) is None  # caught up
    assert next_reads(GroupPosition(100, 1000), 50) is None  # bound before the commit
    assert next_reads(GroupPosition(None, 1000), None) is None
    # to_time: the first offset after it stops the reads (the lag is still to the end).
    assert next_reads(GroupPosition(100, 1000, stop=300), None) == Span(100, 299)
    assert next_reads(GroupPosition(100, 1000, stop=300), 200) == Span(100, 200)
    assert next_reads(GroupPosition(100, 1000, stop=100), None) is None


def test_groups_become_one_offset_replay_per_partition_behind() -> None:
    replays = (
        Replay("replays[0]", "clicks", None, Span(5, None)),
        Replay("replays[1]", "orders", None, group="billing"),
    )
    positions = {1: {0: GroupPosition(100, 1000), 1: GroupPosition(2000, 2000),
                     2: GroupPosition(None, 50), 3: GroupPosition(10, 20, stop=15)}}
    resolved, lags = resolve_groups(replays, positions)
    assert resolved == (
        replays[0],
        Replay("replays[1]", "orders", (0,), Span(100, 999), group="billing"),
        Replay("replays[1]", "orders", (3,), Span(10, 14), group="billing"),
    )
    assert lags == (GroupLag("replays[1]", "billing", "orders", lag_records=900 + 10,
                             behind=(0, 3), caught_up=(1,), uncommitted=(2,),
                             ranges={0: Span(100, 999), 3: Span(10, 14)}),)


def test_only_the_part_of_a_groups_lag_before_the_local_log_is_warmed() -> None:
    # The brokers' disks hold every offset from local_start on (ListOffsets
    # EARLIEST_LOCAL): a fetch there never reads remote storage. The remote
    # segments are listed open-ended, so a lag wholly on the disks would
    # otherwise warm the last remote segment for nothing.
    replays = (Replay("replays[0]", "orders", None, group="billing"),)
    positions = {0: {0: GroupPosition(100, 1000, local_start=600),  # partly remote
                     1: GroupPosition(700, 1000, local_start=600),  # wholly local
                     2: GroupPosition(100, 1000, local_start=100),  # starts at it
                     3: GroupPosition(100, 1000)}}  # a broker that cannot say
    resolved, lags = resolve_groups(replays, positions)
    assert resolved == (
        Replay("replays[0]", "orders", (0,), Span(100, 599), group="billing"),
        Replay("replays[0]", "orders", (3,), Span(100, 999), group="billing"),
    )
    # The lag and the next reads are the group's, wherever they are kept.
    (lag,) = lags
    assert lag.behind == (0, 1, 2, 3) and lag.caught_up == ()
    assert lag.lag_records == 900 + 300 + 900 + 900
    assert lag.ranges[1] == Span(700, 999)


def test_the_group_line_gives_lag_and_what_is_warmed() -> None:
    lag = GroupLag("replays[1]", "billing", "orders", lag_records=12_345, behind=(0, 3),
                   caught_up=(1,), uncommitted=(2,), segments=3, bytes=3 * 1024 * 1024)
    assert format_groups([lag], dry_run=True) == (
        "group billing on orders (replays[1]): lag 12,345 records on 2 partitions of 3; "
        "no committed offset in partition(s) 2 (not warmed); in remote storage: 3 segments, "
        "3.0 MiB (would warm)"
    )
    assert format_groups([lag]).endswith("; in remote storage: 3 segments, 3.0 MiB (to warm)")


def json_blocks(path: str, after: str) -> list[Any]:
    text = (Path(__file__).resolve().parents[2] / path).read_text(encoding="utf-8")
    section = text.split(after, 1)[1].split("\n## ", 1)[0]
    return [json.loads(block.split("```", 1)[0]) for block in section.split("```json")[1:]]


def test_the_documented_plans_parse_and_the_readme_shows_the_cluster_form_first() -> None:
    readme = json_blocks("README.md", "## Warm-up ahead of a planned replay")
    assert "kafka" in readme[0] and "sidecars" not in readme[0]
    architecture = json_blocks("docs/ARCHITECTURE.md", "### Warm-up plan")
    for document in (*readme, *architecture):
        parse_plan(document, env={})
    assert any(d.get("kafka", {}).get("security") for d in architecture)
