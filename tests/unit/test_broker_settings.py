"""The real broker's settings (sidecar/tools/broker.py): loopback only, KRaft with
node 1 as the controller, tiered storage through the stand-in manager."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.tools.broker import (
    RSM_CLASS,
    BrokerError,
    RemoteStorage,
    broker_lib,
    broker_properties,
    kafka_uuid,
)

STORAGE = RemoteStorage("http://127.0.0.1:9000", "tiered", "AKID", "SECRET")


def test_the_controller_node_listens_for_both_roles_on_loopback() -> None:
    props = broker_properties(1, 9092, 9093, Path("/data"), STORAGE, controller=True)
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["remote.log.storage.system.enable"] == "true"
    assert props["remote.log.storage.manager.class.name"] == RSM_CLASS
    assert props["rsm.config.storage.s3.endpoint.url"] == "http://127.0.0.1:9000"
    assert props["rsm.config.chunk.size"] == str(4 * 1024 * 1024)


def test_a_further_node_is_a_broker_that_uses_node_1_as_its_controller() -> None:
    props = broker_properties(2, 9094, 9093, Path("/data"), None, controller=False)
    assert props["process.roles"] == "broker"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9094"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["remote.log.storage.system.enable"] == "false"
    assert not any(key.startswith("rsm.config.") for key in props)


def test_every_address_is_on_loopback() -> None:
    props = broker_properties(1, 9092, 9093, Path("/data"), STORAGE, controller=True)
    for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
        hosts = [part.split("//")[-1].split("@")[-1].rsplit(":", 1)[0]
                 for part in props[key].split(",")]
        assert set(hosts) == {"127.0.0.1"}, key


def test_missing_jars_name_the_command_that_fetches_them(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match=r"no Kafka broker jars in .*: run `make kafka`"):
        broker_lib(tmp_path)


def test_jars_of_two_kafka_versions_are_refused_not_mixed(tmp_path: Path) -> None:
    # What a version changed in tests/kafka/pom.xml left behind before `make kafka`
    # copied the jars afresh: both on the classpath, and kafka_version() naming either.
    for jar in ("kafka_2.13-4.3.0.jar", "kafka_2.13-4.4.0.jar", "kafka-peer-1.jar"):
        (tmp_path / jar).touch()
    with pytest.raises(BrokerError, match=r"several Kafka versions in .*\(kafka_2\.13-4\.3\.0"
                                          r"\.jar, kafka_2\.13-4\.4\.0\.jar\): run `make kafka`"):
        broker_lib(tmp_path)


def test_a_kafka_uuid_is_22_url_safe_characters_never_led_by_a_dash() -> None:
    # One id in 64 would start with "-" and the storage tool would take it for an
    # option (a CI run failed so); 5,000 draws meet that case all but surely.
    ids = {kafka_uuid() for _ in range(5000)}
    assert len(ids) == 5000
    assert all(len(i) == 22 and set(i) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids)
    assert not any(i.startswith("-") for i in ids)


def test_the_docs_name_the_versions_the_pom_pins() -> None:
    root = Path(__file__).resolve().parents[2]
    pom = (root / "tests" / "kafka" / "pom.xml").read_text()
    pinned = {name: re.search(rf"<{name}\.version>([^<]+)<", pom).group(1)  # type: ignore[union-attr]
              for name in ("kafka", "awssdk", "log4j")}
    said = {"kafka": "Apache Kafka {}", "awssdk": "AWS SDK v2 {}", "log4j": "log4j {}"}
    for doc in ("README.md", "docs/ARCHITECTURE.md"):
        text = " ".join((root / doc).read_text().split())
        for name, version in pinned.items():
            assert said[name].format(version) in text, (doc, name, version)
