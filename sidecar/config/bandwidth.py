"""The floors of the origin bandwidth options: a limit so low that a block
would take minutes to arrive is refused, at load and at reload, with what to
give instead. Pure, on the option values and the block size.

A block is the unit every origin read is made of (sidecar.blocks): a reader's
miss waits for its first chunk and then for its block; read-ahead and warm-up
fetch whole blocks, each holding an origin connection and a cache slot until
it has landed. A limit of 1 KiB/s with 8 MiB blocks is accepted by the rate's
grammar and would make one miss wait more than two hours (and a warm-up take
days); no operator means that, so it is refused rather than obeyed.

- `origin_bandwidth` (the total, all of which a waiting reader may take): at
  least MIN_ORIGIN_RATE, 1 MiB/s, so that a reader's first 1 MiB chunk (the
  cache's checksum chunk, sidecar.config.tree.chunk_bytes) comes within a
  second of the limiter's wait, and at least one block per BLOCK_WITHIN_S for
  blocks larger than 60 MiB.
- The read-ahead and warm-up lanes (`prefetch_share`, `warm_share` of the
  total): at least one block per BLOCK_WITHIN_S each, so that a lane's fetch
  holds its connection and slot for at most a minute (a presigned block GET is
  valid for 15, sidecar.origin.block_fetches).

0 or `unlimited` is no limit and always accepted.
"""

from __future__ import annotations

import math

MIB = 1024 * 1024
MIN_ORIGIN_RATE = MIB  # bytes per second
BLOCK_WITHIN_S = 60.0

_LANES = (("prefetch_share", "read-ahead"), ("warm_share", "warm-up"))


def origin_rate_floor(block_size: int) -> int:
    """The lowest non-zero `origin_bandwidth` accepted, in bytes per second."""
    return max(MIN_ORIGIN_RATE, lane_rate_floor(block_size))


def lane_rate_floor(block_size: int) -> int:
    """The lowest rate a lower lane's share of the total may come to (in whole
    KiB/s, so that the floor an error names is one the operator can write)."""
    return math.ceil(block_size / BLOCK_WITHIN_S / 1024) * 1024


def bandwidth_refusal(rate: int | None, prefetch_share: float, warm_share: float,
                      block_size: int) -> str | None:
    """Why these bandwidth settings are refused with blocks of `block_size`
    bytes, or None when they are accepted (`rate` None: unlimited)."""
    if rate is None:
        return None
    floor = origin_rate_floor(block_size)
    if rate < floor:
        return (f"origin_bandwidth {rate_text(rate)} is too low: one {size_text(block_size)} "
                f"block would take {duration_text(block_size / rate)} to read; give at least "
                f"{floor_text(floor)}, or unlimited")
    shares = {"prefetch_share": prefetch_share, "warm_share": warm_share}
    lane_floor = lane_rate_floor(block_size)
    for name, lane in _LANES:
        lane_rate = rate * shares[name]
        if lane_rate < lane_floor:
            return (f"{name} {shares[name]:g} of origin_bandwidth {rate_text(rate)} gives the "
                    f"{lane} lane {rate_text(lane_rate)}, under one {size_text(block_size)} "
                    f"block a minute ({floor_text(lane_floor)}); raise {name} or "
                    "origin_bandwidth")
    return None


def size_text(size: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return f"{size:.4g}B"


def rate_text(rate: float) -> str:
    """A rate as written in the configuration: exact when it is whole KiB/s."""
    if rate >= 1024 and rate == int(rate) and int(rate) % 1024 == 0:
        return floor_text(int(rate))
    return f"{size_text(rate)}/s"


def floor_text(rate: int) -> str:
    """A rate of whole KiB/s exactly, as a rate option takes it."""
    return f"{rate // MIB}MiB/s" if rate % MIB == 0 else f"{rate // 1024}KiB/s"


def duration_text(seconds: float) -> str:
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"
