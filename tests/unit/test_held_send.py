"""The data port's send from the memory tier (sidecar.s3.held_send): the one
asyncio report of a hang-up during a sendfile wait is kept out of the error
log, and nothing else is."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.s3.held_send import is_sendfile_hangup_noise, quiet_sendfile_hangups


class Lost:
    """What the loop's handle of the failing callback prints as."""

    def __repr__(self) -> str:
        return "<Handle _SelectorSocketTransport._call_connection_lost(ConnectionResetError())>"


def test_only_the_doubly_resolved_sendfile_wait_is_noise() -> None:
    assert is_sendfile_hangup_noise({"exception": asyncio.InvalidStateError("invalid state"),
                                     "handle": Lost()})
    assert not is_sendfile_hangup_noise({"exception": RuntimeError("boom"), "handle": Lost()})
    assert not is_sendfile_hangup_noise({"exception": asyncio.InvalidStateError("x"),
                                         "handle": "<Handle other_callback()>"})
    assert not is_sendfile_hangup_noise({"message": "Task exception was never retrieved"})


def test_the_loop_logs_everything_else_as_before(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_sendfile_hangups(loop)
        with caplog.at_level(logging.DEBUG):
            loop.call_exception_handler({
                "message": "Exception in callback", "handle": Lost(),
                "exception": asyncio.InvalidStateError("invalid state")})
            loop.call_exception_handler({"message": "something else broke",
                                         "exception": RuntimeError("boom")})
    finally:
        loop.close()
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert [record.getMessage() for record in errors] == ["something else broke"]
    assert any(record.levelno == logging.DEBUG and "hung up" in record.getMessage()
               for record in caplog.records)
