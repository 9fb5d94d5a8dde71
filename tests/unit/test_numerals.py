"""sidecar.numerals: what int() would take and a wire number must not be."""

from __future__ import annotations

import pytest

from sidecar.numerals import is_decimal, parse_decimal, parse_hex


@pytest.mark.parametrize("text", ["", "²", "١٠", "１０", "1_0", " 1", "1 ", "+1", "-1", "1.0",
                                  "0x10", "1" * 20, "9" * 5000, "\u0661"])
def test_what_int_takes_but_a_wire_number_is_not(text: str) -> None:
    assert not is_decimal(text)
    with pytest.raises(ValueError, match="not a decimal number"):
        parse_decimal(text)


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("007", 7), ("9" * 19, 10**19 - 1)])
def test_ascii_digits_read_as_int_does(text: str, value: int) -> None:
    assert is_decimal(text) and parse_decimal(text) == value


def test_hex_is_ascii_and_bounded() -> None:
    assert parse_hex("fF09") == 0xFF09 and parse_hex("0" * 16) == 0
    for text in ("", "g", "1_0", " a", "a" * 17, "\uff10", "0x1"):
        with pytest.raises(ValueError, match="not a hex number"):
            parse_hex(text)
    assert parse_decimal("1234", max_digits=4) == 1234
    with pytest.raises(ValueError):
        parse_decimal("12345", max_digits=4)
