"""The Host names a loopback admin port serves its tokenless pages under."""

from __future__ import annotations

import pytest

from sidecar.admin.host_names import names_loopback


@pytest.mark.parametrize("host", [
    "127.0.0.1:9331", "127.0.0.1", "127.9.8.7:1", "localhost", "LOCALHOST:80", "[::1]:9331",
    "[::1]", "[0:0:0:0:0:0:0:1]:9331", None,
])
def test_loopback_names_are_served(host: str | None) -> None:
    assert names_loopback(host)


@pytest.mark.parametrize("host", [
    "rebind.attacker.example", "rebind.attacker.example:9331", "127.0.0.1.nip.io:9331",
    "localhost.attacker.example", "0.0.0.0:9331", "10.0.0.1", "::1", "[127.0.0.1]", "[::1",
    "127.0.0.1:x", "127.0.0.1:9331:1", "127.0.0.1:٣", "", "127.1", "[::2]:9331",
    "localhost:",
])
def test_any_other_name_is_not(host: str) -> None:
    assert not names_loopback(host)


def test_the_configured_host_is_served_whatever_its_case() -> None:
    assert names_loopback("Sidecar-Admin:9331", "sidecar-admin")
    assert not names_loopback("other:9331", "sidecar-admin")
