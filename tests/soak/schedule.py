"""The chaos schedule: what happens to the sidecar and when, from a seed alone.

Pure: no clock, no I/O. The soak's runner plays the events at their times; the
unit tests check the plan itself (tests/unit/test_soak.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# What the origin can do to a GET (tests/support/fault_proxy.py's faults).
ORIGIN_FAULTS = ("reset_before_body", "reset_mid_body", "stall_mid_body", "503_burst",
                 "slow_down", "truncate", "truncate_close")
MODES = ("no-prefetch", "cache-only", "bypass")
# Each kind and how often it is drawn after the first round, which has every
# kind (and every origin fault) once, in a shuffled order, so that even a short
# run meets all of them.
WEIGHTS = {
    "kill": 2.0, "origin_fault": 4.0, "etag_flip": 2.0, "origin_down": 0.5, "warm": 1.0,
    "mode": 1.5, "disk_full": 1.0, "slab_truncate": 0.7, "punch_holes": 1.0,
}
KINDS = tuple(WEIGHTS)
FIRST_EVENT_S = 5.0  # the readers get going (and the cache gets some blocks) first
GAP_S = (1.5, 4.5)  # quiet time after one event heals and before the next


@dataclass(frozen=True)
class Event:
    at_s: float  # seconds after the readers start
    kind: str  # one of KINDS, or "eio" (the final phase)
    detail: str = ""  # the origin fault, the mode, ...
    hold_s: float = 0.0  # how long it lasts before it is healed (0: instant)
    times: int = 0  # origin faults: how many GETs it hits
    after_bytes: int = 0  # mid-body faults: body bytes sent first
    seconds: float = 0.0  # stalls: how long

    @property
    def name(self) -> str:
        """How the summary counts it: `kind` or `kind:detail`."""
        return f"{self.kind}:{self.detail}" if self.detail else self.kind


def eio_start_s(duration_s: float) -> float:
    """The final phase, the cache disk failing with EIO, takes the run's last
    sixth, at most a minute: long enough for reads to meet the lost blocks."""
    return duration_s - min(60.0, duration_s / 6)


def chaos_schedule(seed: int, duration_s: float) -> list[Event]:
    """Events at increasing times, none overlapping another's hold, every one
    healed before the EIO phase; the EIO phase last."""
    rng = random.Random(seed)
    eio_at = eio_start_s(duration_s)
    first_round = [(kind, "") for kind in KINDS if kind != "origin_fault"]
    first_round += [("origin_fault", fault) for fault in ORIGIN_FAULTS]
    rng.shuffle(first_round)
    events: list[Event] = []
    at = FIRST_EVENT_S
    while True:
        kind, fault = first_round.pop() if first_round else (rng.choices(
            KINDS, weights=[WEIGHTS[k] for k in KINDS])[0], "")
        event = _draw(rng, round(at, 1), kind, fault)
        if event.at_s + event.hold_s >= eio_at:
            break
        events.append(event)
        at = event.at_s + event.hold_s + rng.uniform(*GAP_S)
    events.append(Event(round(eio_at, 1), "eio"))
    return events


def _draw(rng: random.Random, at: float, kind: str, fault: str) -> Event:
    hold = round(rng.uniform(2.0, 5.0), 1)
    if kind == "origin_fault":
        fault = fault or rng.choice(ORIGIN_FAULTS)
        if fault in ("503_burst", "slow_down"):
            return Event(at, kind, fault, hold, times=rng.randint(3, 12))
        return Event(at, kind, fault, hold, times=rng.randint(1, 4),
                     after_bytes=rng.randrange(1, 768 * 1024),
                     seconds=round(rng.uniform(1.0, 5.0), 1) if fault == "stall_mid_body" else 0.0)
    if kind == "etag_flip":
        return Event(at, kind, hold_s=hold, times=rng.randint(1, 3))
    if kind == "origin_down":
        return Event(at, kind, rng.choice(("503", "reset")), hold)
    if kind == "mode":
        return Event(at, kind, rng.choice(MODES), hold)
    if kind == "disk_full":
        return Event(at, kind, hold_s=hold)
    if kind == "punch_holes":
        return Event(at, kind, times=rng.randint(2, 16))
    return Event(at, kind)  # kill, warm, slab_truncate: done at once
