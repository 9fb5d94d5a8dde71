"""Suite-wide rules and fixtures: in CI a skipped test is a failure (it proves
nothing); one executor for code that takes one (the cache's disk work); the
hypothesis profiles (HYPOTHESIS_PROFILE): "suite" for `make test`, "fuzz" for
`make fuzz`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

# Hypothesis keeps caches (and by default its example database) in
# ./.hypothesis: outside the working tree instead, unless told where.
set_hypothesis_home_dir(os.environ.get(
    "HYPOTHESIS_STORAGE_DIRECTORY",
    str(Path(tempfile.gettempdir()) / f"hypothesis-kafka-cold-sidecar-{os.getuid()}")))

# `make test`: hypothesis' default number of examples, and no example database,
# so a run writes nothing into the working tree (the seeds that matter are kept
# in tests/fuzz/corpus and replayed by every run). No deadline: on a loaded
# machine a slow example is not a failing one.
settings.register_profile("suite", database=None, deadline=None, print_blob=True)
# `make fuzz`: many more examples, and the failures it finds remembered between
# runs outside the tree (a failing input worth keeping goes into the corpus).
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20000")), deadline=None,
    print_blob=True, suppress_health_check=[HealthCheck.too_slow],
    database=DirectoryBasedExampleDatabase(
        str(Path(os.environ.get("FUZZ_DATABASE", "test-artifacts/hypothesis")))),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


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
