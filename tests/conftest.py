"""Suite-wide rules and fixtures: in CI a skipped test is a failure (it proves
nothing); one executor for code that takes one (the cache's disk work)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    """A small pool, as the sidecar's disk executor; shut down after the test."""
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-io") as pool:
        yield pool


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure: {report.longrepr}"
