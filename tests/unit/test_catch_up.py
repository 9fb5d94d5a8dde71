"""The catch-up consumer's arguments: refused before it connects to anything; a
broker that does not answer: a clear error within the catch-up's own time."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.tools.catch_up import CatchUpError, catch_up
from sidecar.tools.ports import free_port


@pytest.fixture()
def bootstrap() -> Iterator[tuple[str, socket.socket]]:
    """A listening port no broker answers on: a connection to it would show."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        yield f"127.0.0.1:{listener.getsockname()[1]}", listener


@pytest.mark.parametrize(("arguments", "message"), [
    # A NaN timeout is never passed: a partition that lags would be waited for forever.
    ({"timeout_s": math.nan}, "timeout_s"),
    ({"timeout_s": 0.0}, "timeout_s"),
    ({"count": -1}, "count"),
    ({"start": {1: -1}}, "start offsets"),
    ({"partitions": []}, "no partition"),
])
def test_arguments_that_could_not_end_or_check_nothing_are_refused_before_connecting(
        bootstrap: tuple[str, socket.socket], arguments: dict[str, Any], message: str,
) -> None:
    address, listener = bootstrap
    called: dict[str, Any] = {"partitions": [0, 1], "count": 10, **arguments}
    with pytest.raises(ValueError, match=message):
        catch_up(address, "orders", **called)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected


def test_no_broker_answering_is_a_clear_error_within_the_catch_ups_time() -> None:
    # Nothing listens there: kafka-python alone would try for 30 s, then raise its
    # own KafkaTimeoutError, whatever timeout_s said.
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(CatchUpError, match=f"^no Kafka broker answered at {address} within 2s$"):
        catch_up(address, "orders", [0], 10, timeout_s=2)
    assert time.monotonic() - started < 10
