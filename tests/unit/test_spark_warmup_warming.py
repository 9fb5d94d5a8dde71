"""Warm calls from an executor: retries, backoff, a node that is down, bounded concurrency."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

import pytest

from spark_warmup.warming import (
    NodeBatch,
    PlannedSegment,
    WarmCallError,
    _json_object,
    call_timeout,
    warm_call,
    warm_node,
)

MIB = 1024 * 1024
OK: dict[str, object] = {"requested_blocks": 2, "already_cached": 0, "fetched": 2, "failed": 0,
      "bytes_fetched": 2 * MIB}


def segment(i: int, size: int = 2 * MIB) -> PlannedSegment:
    return PlannedSegment("orders", 0, f"orders-id/0/{i:020d}-seg.log", size, "a")


def batch(count: int = 1, **changes: object) -> NodeBatch:
    settings: dict[str, object] = dict(
        node="a", url="http://127.0.0.1:1", bucket="tiered",
        segments=tuple(segment(i) for i in range(count)), ttl_s=600.0, token=None,
        concurrency=2, retries=3, block_size=MIB,
    )
    settings.update(changes)
    return NodeBatch(**settings)  # type: ignore[arg-type]


class ScriptedSidecar:
    """Answers each call from a script: an (status, body) pair or an OSError to raise."""

    def __init__(self, *script: tuple[int, dict[str, object]] | OSError,
                 delay: float = 0.0) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, dict[str, object], dict[str, str]]] = []
        self.delay = delay
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def __call__(self, url: str, body: bytes, headers: Mapping[str, str],
                 timeout: float) -> tuple[int, bytes]:
        with self._lock:
            self.calls.append((url, json.loads(body), dict(headers)))
            step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        time.sleep(self.delay)
        with self._lock:
            self.running -= 1
        if isinstance(step, OSError):
            raise step
        status, answer = step
        return status, json.dumps(answer).encode()


def test_one_call_per_segment_with_the_whole_object() -> None:
    sidecar = ScriptedSidecar((200, OK))
    counts = warm_call(sidecar, batch(token="s3cret"), segment(7), sleep=lambda s: None)
    assert counts == OK
    [(url, body, headers)] = sidecar.calls
    assert url == "http://127.0.0.1:1/api/v1/warm"
    assert body == {"objects": [{"bucket": "tiered", "key": segment(7).key, "start": 0,
                                 "end": None}], "ttl_s": 600.0}
    assert headers["Authorization"] == "Bearer s3cret"


def test_a_segments_manifest_and_indexes_are_warmed_in_its_call() -> None:
    sidecar = ScriptedSidecar((200, OK))
    log = segment(7)
    siblings = (log.key[:-3] + "indexes", log.key[:-3] + "rsm-manifest")
    with_siblings = replace(log, companions=((siblings[0], 800), (siblings[1], 300)))
    warm_call(sidecar, batch(), with_siblings, sleep=lambda s: None)
    [(_, body, _)] = sidecar.calls
    assert [item["key"] for item in body["objects"]] == [log.key, *siblings]
    assert with_siblings.bytes == log.size + 1100
    assert all(item["start"] == 0 and item["end"] is None for item in body["objects"])


def test_transient_failures_are_retried_with_growing_backoff() -> None:
    sleeps: list[float] = []
    sidecar = ScriptedSidecar(ConnectionRefusedError("refused"), (503, {"error": "busy"}),
                              (200, OK))
    assert warm_call(sidecar, batch(), segment(0), sleep=sleeps.append) == OK
    assert len(sidecar.calls) == 3
    assert sleeps == [0.25, 0.5]


def test_retries_run_out() -> None:
    sleeps: list[float] = []
    sidecar = ScriptedSidecar(ConnectionRefusedError("refused"))
    with pytest.raises(WarmCallError) as caught:
        warm_call(sidecar, batch(retries=2), segment(0), sleep=sleeps.append)
    assert caught.value.transient and "sidecar a unreachable: refused" in str(caught.value)
    assert len(sidecar.calls) == 3 and sleeps == [0.25, 0.5]


def test_a_rejected_call_is_not_retried() -> None:
    sidecar = ScriptedSidecar((400, {"error": "no such key: s3://tiered/k"}))
    with pytest.raises(WarmCallError) as caught:
        warm_call(sidecar, batch(), segment(0), sleep=lambda s: None)
    assert not caught.value.transient
    assert str(caught.value) == "sidecar a answered 400: no such key: s3://tiered/k"
    assert len(sidecar.calls) == 1


def test_rows_carry_the_sidecars_counts() -> None:
    sidecar = ScriptedSidecar((200, {**OK, "already_cached": 1, "fetched": 1,
                                     "bytes_fetched": MIB}))
    rows = warm_node(batch(3), post=sidecar, sleep=lambda s: None)
    assert [r.key for r in rows] == [segment(i).key for i in range(3)]
    assert all(r.ok and (r.blocks, r.already_cached, r.fetched, r.bytes_fetched)
               == (2, 1, 1, MIB) and r.node == "a" and r.bytes == 2 * MIB for r in rows)


def test_a_node_that_is_down_fails_fast_after_two_segments() -> None:
    sidecar = ScriptedSidecar(ConnectionRefusedError("refused"))
    rows = warm_node(batch(10, concurrency=1, retries=1), post=sidecar, sleep=lambda s: None)
    assert all(not r.ok for r in rows)
    assert len(sidecar.calls) == 2 * 2  # two segments, each with one retry; the rest skipped
    assert "taken as down" in (rows[-1].error or "")
    # Failed blocks are counted at the plan's block size (nobody answered).
    assert all(r.blocks == 2 and r.failed == 2 for r in rows)


def test_a_partial_failure_is_reported_not_retried() -> None:
    sidecar = ScriptedSidecar((200, {**OK, "fetched": 1, "failed": 1}))
    [row] = warm_node(batch(1), post=sidecar, sleep=lambda s: None)
    assert not row.ok and row.failed == 1 and row.error is None
    assert len(sidecar.calls) == 1


def test_calls_per_sidecar_are_bounded() -> None:
    sidecar = ScriptedSidecar((200, OK), delay=0.02)
    rows = warm_node(batch(12, concurrency=3), post=sidecar)
    assert len(rows) == 12 and len(sidecar.calls) == 12
    assert 1 < sidecar.most_running <= 3


@pytest.mark.parametrize("garbage", [
    b"<html>proxy error</html>", b"[1, 2]", b'{"fetched": "many"}', b'{"fetched": true}',
    b"\xff\xfe", b'{"fetched": 1e400}',
])
def test_a_200_that_is_not_the_warm_apis_json_fails_its_row_only(garbage: bytes) -> None:
    answers = iter([(200, garbage), (200, json.dumps(OK).encode())])

    def post(url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> tuple[int, bytes]:
        return next(answers)

    rows = warm_node(batch(2, concurrency=1), post=post, sleep=lambda s: None)
    assert rows[0].error is not None and "not the warm API's answer" in rows[0].error
    assert rows[0].failed == 2
    assert rows[1].error is None and rows[1].fetched == 2


@pytest.mark.parametrize("answer", [
    {"error": "mode cache-only: warm-up is paused", "mode": "cache-only"},
    # A sidecar from before the answer's "mode" field names it in its message.
    {"error": "mode cache-only: warm-up is paused"},
])
def test_a_sidecar_paused_by_its_mode_gets_no_retry_and_no_more_calls(
        answer: dict[str, object]) -> None:
    sleeps: list[float] = []
    sidecar = ScriptedSidecar((503, answer))
    rows = warm_node(batch(5, concurrency=1, retries=3), post=sidecar, sleep=sleeps.append)
    assert len(sidecar.calls) == 1 and sleeps == []
    first = rows[0].error or ""
    assert first.startswith("sidecar a is in cache-only mode, which pauses warm-up "
                            "(it answered 503; not retried")
    assert all("is in cache-only mode" in (r.error or "") for r in rows)
    assert all("no more calls to it this run" in (r.error or "") for r in rows[1:])
    assert not any("unreachable" in (r.error or "") or "down" in (r.error or "")
                   for r in rows)
    assert all(r.failed == r.blocks == 2 for r in rows)


def test_a_bypass_mode_503_is_named_too() -> None:
    sidecar = ScriptedSidecar((503, {"error": "mode bypass: warm-up is paused",
                                     "mode": "bypass"}))
    with pytest.raises(WarmCallError) as caught:
        warm_call(sidecar, batch(), segment(0), sleep=lambda s: None)
    assert caught.value.mode == "bypass" and not caught.value.transient
    assert "is in bypass mode" in str(caught.value)


@pytest.mark.parametrize("answer", [
    {"error": "origin unavailable: s3://tiered/k: origin answered 500"},
    {"error": "busy", "mode": "normal"},  # not a mode that pauses warm-up
    {"error": "mode cache-only: warm-up is paused, and more"},
    ["mode", "cache-only"],
])
def test_any_other_503_is_retried_as_before(answer: object) -> None:
    sleeps: list[float] = []
    sidecar = ScriptedSidecar((503, answer), (200, OK))  # type: ignore[arg-type]
    assert warm_call(sidecar, batch(), segment(0), sleep=sleeps.append) == OK
    assert sleeps == [0.25]


def test_a_proxys_503_page_is_retried_as_before() -> None:
    answers = iter([(503, b"<html>503 Service Unavailable</html>"),
                    (200, json.dumps(OK).encode())])

    def post(url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> tuple[int, bytes]:
        return next(answers)

    assert warm_call(post, batch(), segment(0), sleep=lambda s: None) == OK


def test_a_node_whose_origin_stays_unavailable_is_given_up_without_calling_it_down() -> None:
    sleeps: list[float] = []
    sidecar = ScriptedSidecar((503, {"error": "origin unavailable: timed out"}))
    rows = warm_node(batch(5, concurrency=1, retries=1), post=sidecar, sleep=sleeps.append)
    assert len(sidecar.calls) == 2 * 2 and sleeps == [0.25, 0.25]
    assert rows[0].error == "sidecar a answered 503: origin unavailable: timed out"
    assert all((r.error or "").startswith("sidecar a answered 503: origin unavailable")
               for r in rows)
    assert all(r.error == ("sidecar a answered 503: origin unavailable: timed out (so for 2 "
                           "segments in a row, each after its retries: no more calls to it "
                           "this run)") for r in rows[2:])
    assert not any("unreachable" in (r.error or "") or "taken as down" in (r.error or "")
                   for r in rows)


def test_a_refused_segment_does_not_stop_the_nodes_other_calls() -> None:
    sidecar = ScriptedSidecar((400, {"error": "no such key: s3://tiered/k"}),
                              (400, {"error": "no such key: s3://tiered/k"}), (200, OK))
    rows = warm_node(batch(4, concurrency=1), post=sidecar, sleep=lambda s: None)
    assert [r.error for r in rows[:2]] == ["sidecar a answered 400: no such key: s3://tiered/k"] * 2
    assert all(r.ok for r in rows[2:]) and len(sidecar.calls) == 4


def test_a_calls_timeout_counts_every_object_it_warms() -> None:
    log = segment(0, size=100 * MIB)
    assert call_timeout(log) == 30.0 + 100.0
    # The log with its indexes and manifest: their bytes, and a little for each.
    with_siblings = replace(log, companions=(("k.indexes", 20 * MIB), ("k.rsm-manifest", 1024)))
    assert call_timeout(with_siblings) == pytest.approx(
        30.0 + 2 * 2.0 + (100 * MIB + 20 * MIB + 1024) / MIB)
    # However large, an hour at most.
    assert call_timeout(segment(0, size=10 * 1024 * MIB)) == 3600.0


def test_the_call_is_sent_with_that_timeout() -> None:
    sidecar = ScriptedSidecar((200, OK))
    timeouts: list[float] = []

    def post(url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> tuple[int, bytes]:
        timeouts.append(timeout)
        return sidecar(url, body, headers, timeout)

    with_index = replace(segment(0, size=8 * MIB), companions=(("k.indexes", 4 * MIB),))
    warm_call(post, batch(), with_index, sleep=lambda s: None)
    assert timeouts == [30.0 + 2.0 + 12.0]


@pytest.mark.parametrize(("answer", "expected"), [
    (b'{"mode": "bypass", "error": "x"}', {"mode": "bypass", "error": "x"}),
    (b"{}", {}),
    (b"[1, 2]", None), (b'"mode"', None), (b"null", None), (b"7", None),
    (b"<html>502 Bad Gateway</html>", None), (b'{"mode": "by', None), (b"\xff\xfe", None),
    (b"", None),
])
def test_one_parse_reads_every_answer_the_sidecar_may_send(
        answer: bytes, expected: dict[str, object] | None) -> None:
    """The readiness check, the 503's mode, the 200's counts and an error's text
    all read the answer through this one parse: a JSON object or nothing."""
    assert _json_object(answer) == expected
