"""The HEAD memo: remembered answers, one HEAD at a time, stale-if-error, forget."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from sidecar.errors import ObjectNotFound, OriginUnavailable
from sidecar.model import ObjectInfo
from sidecar.origin.heads import HeadMemo
from tests.support.clock import FakeClock


def info(etag: str) -> ObjectInfo:
    return ObjectInfo("b", "k", 10, etag, datetime(2026, 1, 1, tzinfo=UTC))


class ScriptedHead:
    """Answers HEADs from a script; `gate` holds them until set."""

    def __init__(self, *answers: ObjectInfo | Exception) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> ObjectInfo:
        self.asked += 1
        await self.gate.wait()
        answer = self.answers[min(self.asked, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def memo(clock: FakeClock) -> HeadMemo:
    return HeadMemo(ttl_s=30.0, stale_if_error_s=600.0, clock=clock)


async def test_an_answer_is_remembered_for_its_ttl() -> None:
    clock = FakeClock()
    heads, ask = memo(clock), ScriptedHead(info('"a"'), info('"b"'))
    assert (await heads.get("b", "k", ask)).etag == '"a"'
    clock.advance(29)
    assert (await heads.get("b", "k", ask)).etag == '"a"' and ask.asked == 1
    clock.advance(2)
    assert (await heads.get("b", "k", ask)).etag == '"b"' and ask.asked == 2


async def test_readers_arriving_meanwhile_share_one_head() -> None:
    heads, ask = memo(FakeClock()), ScriptedHead(info('"a"'))
    ask.gate.clear()
    waiting = [asyncio.ensure_future(heads.get("b", "k", ask)) for _ in range(5)]
    await asyncio.sleep(0)
    ask.gate.set()
    assert {answer.etag for answer in await asyncio.gather(*waiting)} == {'"a"'}
    assert ask.asked == 1


async def test_the_last_answer_stands_in_while_the_origin_fails() -> None:
    clock = FakeClock()
    heads = memo(clock)
    await heads.get("b", "k", ScriptedHead(info('"a"')))
    clock.advance(60)  # past the TTL
    down = ScriptedHead(OriginUnavailable("down"))
    assert (await heads.get("b", "k", down)).etag == '"a"'
    clock.advance(600)  # past stale-if-error too
    with pytest.raises(OriginUnavailable):
        await heads.get("b", "k", down)


async def test_a_404_is_an_answer_never_papered_over() -> None:
    clock = FakeClock()
    heads = memo(clock)
    await heads.get("b", "k", ScriptedHead(info('"a"')))
    clock.advance(60)
    with pytest.raises(ObjectNotFound):
        await heads.get("b", "k", ScriptedHead(ObjectNotFound("gone")))
    with pytest.raises(OriginUnavailable):  # and the old answer is forgotten
        await heads.get("b", "k", ScriptedHead(OriginUnavailable("down")))


async def test_forget_during_a_head_hands_it_on_but_never_remembers_it() -> None:
    heads, ask = memo(FakeClock()), ScriptedHead(info('"old"'), info('"new"'))
    ask.gate.clear()
    waiting = asyncio.ensure_future(heads.get("b", "k", ask))
    await asyncio.sleep(0)
    heads.forget("b", "k")  # a write went through meanwhile
    ask.gate.set()
    assert (await waiting).etag == '"old"'
    assert (await heads.get("b", "k", ask)).etag == '"new"' and ask.asked == 2


async def test_the_reader_asking_being_cancelled_leaves_the_others_their_answer() -> None:
    heads, ask = memo(FakeClock()), ScriptedHead(info('"a"'))
    ask.gate.clear()
    first = asyncio.ensure_future(heads.get("b", "k", ask))
    await asyncio.sleep(0)
    others = [asyncio.ensure_future(heads.get("b", "k", ask)) for _ in range(3)]
    await asyncio.sleep(0)
    first.cancel()  # its client went away while the HEAD was on its way
    with pytest.raises(asyncio.CancelledError):
        await first
    ask.gate.set()
    assert {answer.etag for answer in await asyncio.gather(*others)} == {'"a"'}
    assert ask.asked == 1
    # The answer is remembered, and no HEAD is left running.
    assert (await heads.get("b", "k", ask)).etag == '"a"' and ask.asked == 1
    assert not heads._running
