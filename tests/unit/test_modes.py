"""Parsing the mode an operator asks for (PUT /api/v1/mode)."""

from __future__ import annotations

import pytest

from sidecar.isolation.modes import Mode, parse_mode


@pytest.mark.parametrize("mode", list(Mode))
def test_every_mode_parses_by_its_name(mode: Mode) -> None:
    assert parse_mode(mode.value) is mode


def test_an_unknown_mode_is_quoted_whole_when_short() -> None:
    with pytest.raises(ValueError) as raised:
        parse_mode("fast")
    assert str(raised.value) == (
        "unknown mode 'fast' (expected one of: normal, no-prefetch, cache-only, bypass)")


def test_a_long_unknown_mode_is_cut_and_the_modes_are_still_named() -> None:
    value = "x" * 1024 * 1024
    with pytest.raises(ValueError) as raised:
        parse_mode(value)
    message = str(raised.value)
    assert len(message) < 200
    assert message.startswith("unknown mode 'xxxx")
    assert f"({len(repr(value))} characters)" in message
    assert message.endswith("(expected one of: normal, no-prefetch, cache-only, bypass)")


def test_a_long_value_of_another_type_is_cut_too() -> None:
    with pytest.raises(ValueError) as raised:
        parse_mode(list(range(100_000)))
    assert len(str(raised.value)) < 200
