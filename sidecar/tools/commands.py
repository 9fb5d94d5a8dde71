"""Commands as the tools print them: runnable as printed, from where they were printed.

One rule for every command a tool prints (the demos' banners, the warm-up
example): a program of this environment is named as a shell here would find it,
bare when PATH finds this very one, else by its path (`.venv/bin/sidecar` after
`make run`, which does not activate the venv). Spark jobs printed for a demo
turn their web UI off: a demo has no one to look at it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: What the printed Spark jobs add: no web UI for a demo's job.
DEMO_SPARK_CONF = "--conf spark.ui.enabled=false"


def program(name: str) -> str:
    """How to run this environment's `name` (e.g. "sidecar", "python") from here."""
    here = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found is not None and os.path.realpath(found) == os.path.realpath(here):
        return name
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


def python_module(module: str) -> str:
    """`python -m MODULE` with this environment's interpreter."""
    return f"{program('python')} -m {module}"
