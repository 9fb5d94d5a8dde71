"""Sidecar admin URLs the warm-up job sends its token to (spark_warmup.sidecar_urls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_warmup.plan import PlanError, parse_plan
from spark_warmup.sidecar_urls import SidecarUrlError, check_sidecar_url


@pytest.mark.parametrize(("given", "checked"), [
    ("http://10.0.0.1:9331", "http://10.0.0.1:9331"),
    ("HTTPS://sidecar-1.kafka.svc:9331/", "https://sidecar-1.kafka.svc:9331"),
    ("http://[fd00::1]:9331", "http://[fd00::1]:9331"),
    ("http://broker_1.internal", "http://broker_1.internal"),
    ("http://node.example.:65535", "http://node.example.:65535"),
])
def test_plain_sidecar_urls_pass(given: str, checked: str) -> None:
    assert check_sidecar_url(given) == checked


@pytest.mark.parametrize(("given", "why"), [
    ("http://evil#:9331", "fragment"),
    ("http://evil#.example:9331", "fragment"),
    ("http://user:pw@10.0.0.1:9331", "user name"),
    ("http://10.0.0.1:9331@attacker.example", "user name"),
    ("http://10.0.0.1:9331/admin", "path"),
    ("http://10.0.0.1:9331?x=1", "query"),
    ("http://10.0.0.1:9331/?x=1", "path"),
    ("ftp://10.0.0.1:9331", "http(s) URL"),
    ("10.0.0.1:9331", "http(s) URL"),
    ("javascript:alert(1)", "http(s) URL"),
    ("http://:9331", "no host"),
    ("http://10.0.0.1:0", "port"),
    ("http://10.0.0.1:65536", "port"),
    ("http://10.0.0.1:93²1", "printable ASCII"),
    ("http://10.0.0.1:９３３１", "printable ASCII"),
    ("http://10.0.0.1:+9331", "port"),
    ("http://10.0.0.1:9_331", "port"),
    ("http://10.0.0.1: 9331", "spaces"),
    ("http://10.0.0.1:9331\r\nX: y", "printable ASCII"),
    ("http://[fd00::1", "IPv6"),
    ("http://[not-v6]:1", "IPv6"),
    ("http://[fd00::1]x:1", "IPv6"),
    ("http://a..b:1", "host name"),
    ("http://-a.example:1", "host name"),
    ("http://" + "a" * 64 + ".example:1", "host name"),
    (9331, "URL string"),
])
def test_urls_that_could_move_the_target_are_refused(given: object, why: str) -> None:
    with pytest.raises(SidecarUrlError) as caught:
        check_sidecar_url(given)
    assert why in str(caught.value)


def plan(**extra: object) -> dict[str, object]:
    return {"origin": {"bucket": "tiered"}, "sidecars": {"a": "http://127.0.0.1:9331"},
            "replays": [{"topic": "orders"}], **extra}


def test_plan_sidecars_and_templates_are_checked() -> None:
    with pytest.raises(PlanError, match=r"sidecars\.a: must not carry a fragment"):
        parse_plan(plan(sidecars={"a": "http://evil#:9331"}), env={})
    kafka = {"bootstrap_servers": "b1:9092", "sidecar_url": "http://{host}:9331/x"}
    with pytest.raises(PlanError, match=r"kafka\.sidecar_url: must not have a path"):
        parse_plan({**plan(), "kafka": kafka}, env={})


def test_a_ca_file_must_load(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    for value, message in ((str(bad), "cannot load CA certificates"),
                           (str(tmp_path / "none.pem"), "cannot load CA certificates"),
                           ("", "must be the path"), (5, "must be the path")):
        with pytest.raises(PlanError, match=f"ca_file: {message}"):
            parse_plan(plan(ca_file=value), env={})
