"""Whether a report directory can be written, asked before Spark starts.

Both jobs write their report only at the end, after the warm-up or the analysis
ran: a directory that cannot take it would otherwise be found out only then,
with the work done and its results lost. Nothing is created here (a run refused
later, e.g. for its plan, leaves no empty directory behind).
"""

from __future__ import annotations

import os
from pathlib import Path


def report_dir_problem(directory: Path) -> str | None:
    """Why `directory` cannot take a report (a short reason), or None when it can:
    an existing writable directory, or one that can be created in the nearest
    existing writable directory above it."""
    existing = directory
    # lexists: a dangling symbolic link is there (mkdir would fail on it), not missing.
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        reason = "a dangling symbolic link" if existing.is_symlink() else "not a directory"
    # os.access also answers EROFS (a read-only mount) for root, whom modes do not stop.
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = "not writable"
    else:
        return None
    return f"is {reason}" if existing == directory else \
        f"cannot be created: {existing} is {reason}"
