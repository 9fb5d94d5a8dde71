"""The chaos soak's pure parts (tests/soak/): its schedule, the judging of an
answer against the truth (one version of an object, never a mix of two), and
the rule for memory or fds that grow without bound."""

from __future__ import annotations

import random

import pytest

from tests.soak.chaos import origin_fault
from tests.soak.judge import growth, verify
from tests.soak.schedule import KINDS, ORIGIN_FAULTS, chaos_schedule, eio_start_s

OLD = random.Random(1).randbytes(5000)
NEW = random.Random(2).randbytes(7000)


@pytest.mark.parametrize("minutes", [2, 5, 20])
def test_the_schedule_is_the_seeds_alone_and_its_events_never_overlap(minutes: int) -> None:
    duration = minutes * 60.0
    events = chaos_schedule(11, duration)
    assert events == chaos_schedule(11, duration)
    assert events != chaos_schedule(12, duration)
    *chaos, last = events
    assert (last.kind, last.at_s) == ("eio", round(eio_start_s(duration), 1))
    for event, following in zip(chaos, events[1:], strict=True):
        assert event.kind != "eio"
        # Healed before the next one starts, and all of them before the EIO phase.
        assert event.at_s + event.hold_s < following.at_s
        assert event.at_s + event.hold_s < last.at_s


def test_even_a_two_minute_run_meets_every_kind_of_event_and_every_origin_fault() -> None:
    events = chaos_schedule(20261124, 120.0)
    assert {event.kind for event in events} == {*KINDS, "eio"}
    assert {e.detail for e in events if e.kind == "origin_fault"} == set(ORIGIN_FAULTS)


def test_every_origin_fault_of_the_schedule_is_one_the_proxy_knows() -> None:
    for event in chaos_schedule(3, 1200.0):
        if event.kind == "origin_fault":
            fault = origin_fault(event)  # the proxy's Fault refuses kinds it does not know
            assert event.times >= 1
            assert fault.kind != "stall_mid_body" or fault.seconds > 0


def test_the_eio_phase_is_the_last_sixth_of_a_run_and_at_most_a_minute() -> None:
    assert eio_start_s(120.0) == 100.0
    assert eio_start_s(1200.0) == 1140.0


def test_an_exact_answer_is_ok_and_each_wrong_byte_is_counted() -> None:
    assert verify((OLD,), 206, 100, 199, OLD[100:200], "whole").outcome == "ok"
    damaged = bytearray(OLD[100:200])
    damaged[7] ^= 1
    damaged[50] ^= 1
    verdict = verify((OLD,), 206, 100, 199, bytes(damaged), "whole")
    assert (verdict.outcome, verdict.wrong_bytes, verdict.bytes_verified) == ("wrong", 2, 100)


def test_a_short_body_is_a_prefix_when_cut_or_stopped_but_wrong_when_it_claims_to_be_whole(
) -> None:
    assert verify((OLD,), 206, 10, None, OLD[10:510], "cut").outcome == "cut"
    assert verify((OLD,), 206, 10, None, OLD[10:510], "stopped").outcome == "ok"
    short = verify((OLD,), 206, 10, None, OLD[10:510], "whole")
    assert (short.outcome, short.wrong_bytes) == ("wrong", len(OLD) - 510)
    garbled_prefix = verify((OLD,), 206, 10, None, OLD[11:511], "cut")
    assert garbled_prefix.outcome == "wrong"


def test_an_object_rewritten_meanwhile_may_be_either_version_but_never_a_mix() -> None:
    both = (OLD, NEW)
    assert verify(both, 206, 0, 3999, OLD[:4000], "whole").outcome == "ok"
    assert verify(both, 206, 0, 3999, NEW[:4000], "whole").outcome == "ok"
    assert verify(both, 206, 0, None, NEW, "whole").outcome == "ok"
    mix = OLD[:2000] + NEW[2000:4000]
    verdict = verify(both, 206, 0, 3999, mix, "whole")
    assert verdict.outcome == "wrong"
    assert 0 < verdict.wrong_bytes <= 2000  # as far from the closer version
    assert verify(both, 206, 0, 3999, mix[:2500], "cut").outcome == "wrong"
    # The whole of one version's bytes, but as long as the other: not whole.
    assert verify(both, 206, 0, None, OLD + NEW[len(OLD):], "whole").outcome == "wrong"


def test_a_missing_object_may_be_404_and_nothing_else() -> None:
    assert verify((None,), 404, 0, None, b"", "whole").outcome == "ok"
    assert verify((OLD, None), 404, 0, None, b"", "whole").outcome == "ok"
    assert verify((OLD,), 404, 0, None, b"", "whole").outcome == "wrong_status"
    stale = verify((None,), 206, 0, None, OLD, "whole")
    assert (stale.outcome, stale.wrong_bytes) == ("wrong", len(OLD))


def test_a_200_to_a_range_is_judged_as_the_whole_object() -> None:
    assert verify((OLD,), 200, 100, 199, OLD, "whole").outcome == "ok"
    assert verify((OLD,), 200, 100, 199, OLD[100:200], "whole").outcome == "wrong"


MiB = 1024 * 1024


def series(duration: float, value: float | None = None, leak_per_s: float = 0.0
           ) -> list[tuple[float, int]]:
    rng = random.Random(5)
    return [(float(t), int((value or rng.uniform(90, 130)) * MiB + leak_per_s * t))
            for t in range(int(duration))]


def test_memory_that_goes_up_and_down_within_bounds_has_not_grown() -> None:
    judged = growth(series(1200.0), 1200.0, 1.25, 32 * MiB)
    assert not judged.grew and judged.first_window_peak > 0


def test_a_steady_leak_is_growth_without_bound() -> None:
    # 100 KiB a second: about 117 MiB over the 20 minutes, on 100 MiB.
    judged = growth(series(1200.0, 100.0, leak_per_s=100 * 1024), 1200.0, 1.25, 32 * MiB)
    assert judged.grew and judged.last_window_peak > judged.limit


def test_a_drop_after_a_restart_is_not_growth_and_a_run_too_short_is_not_judged() -> None:
    restarted = [(t, v // 2 if t > 600 else v) for t, v in series(1200.0)]
    assert not growth(restarted, 1200.0, 1.25, 32 * MiB).grew
    assert not growth([], 1200.0, 1.25, 32 * MiB).grew
