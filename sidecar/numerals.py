"""Numbers in what clients send, read strictly: ASCII digits only, bounded length.

Python's int() is lenient in ways a wire format is not: it takes any Unicode
decimal digit ('²' passes str.isdigit(), '٣' and '３' convert), '_' between
digits, a sign and surrounding whitespace, and it raises ValueError past 4,300
digits (the int max-str-digits limit). HTTP's grammar for numbers is ASCII
DIGIT only (RFC 9110 section 5.6.1, RFC 5234 appendix B.1), as is S3's. Every
number a client hands the sidecar (lengths, expiries, times) is read through
here, so hostile input is a ValueError the caller turns into a 400, never a
500 or a silently different number.
"""

from __future__ import annotations

# 19 decimal digits hold every signed 64-bit length S3 or Kafka can name.
MAX_DECIMAL_DIGITS = 19
MAX_HEX_DIGITS = 16
_DECIMAL = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")


def parse_decimal(text: str, max_digits: int = MAX_DECIMAL_DIGITS) -> int:
    """`text` as a non-negative integer: 1 to `max_digits` ASCII digits, nothing else."""
    if not 0 < len(text) <= max_digits or not _DECIMAL.issuperset(text):
        raise ValueError(f"not a decimal number of at most {max_digits} digits: {text[:40]!r}")
    return int(text)


def parse_hex(text: str, max_digits: int = MAX_HEX_DIGITS) -> int:
    """`text` as a non-negative integer: 1 to `max_digits` ASCII hex digits."""
    if not 0 < len(text) <= max_digits or not _HEX.issuperset(text):
        raise ValueError(f"not a hex number of at most {max_digits} digits: {text[:40]!r}")
    return int(text, 16)


def is_decimal(text: str, max_digits: int = MAX_DECIMAL_DIGITS) -> bool:
    return 0 < len(text) <= max_digits and _DECIMAL.issuperset(text)
