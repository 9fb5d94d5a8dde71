"""The report directory is checked before Spark starts: what cannot take a report is named."""

from __future__ import annotations

import os
from pathlib import Path

from spark_warmup.writable import report_dir_problem


def test_a_writable_directory_or_one_that_can_be_made_there_is_fine(tmp_path: Path) -> None:
    assert report_dir_problem(tmp_path) is None
    assert report_dir_problem(tmp_path / "new" / "report") is None
    assert not (tmp_path / "new").exists()  # checked, not created


def test_a_file_where_the_directory_would_be_is_named(tmp_path: Path) -> None:
    taken = tmp_path / "report"
    taken.write_text("not a directory")
    assert report_dir_problem(taken) == "is not a directory"
    assert report_dir_problem(taken / "sub") == f"cannot be created: {taken} is not a directory"


def test_a_dangling_link_is_named(tmp_path: Path) -> None:
    link = tmp_path / "report"
    link.symlink_to(tmp_path / "gone")
    assert report_dir_problem(link / "run") == \
        f"cannot be created: {link} is a dangling symbolic link"


def test_a_directory_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    # /proc/self's directory entries cannot be made, whatever the user (root too).
    locked = Path("/proc/self")
    assert not os.access(locked, os.W_OK)
    assert report_dir_problem(locked / "report") == \
        f"cannot be created: {locked} is not writable"
