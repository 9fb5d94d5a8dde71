"""A pure module, imported on its own, loads no module with I/O.

The import rules (test_architecture.py) read each module's own imports; this
imports each pure module in a fresh interpreter and looks at everything that
came with it, package ``__init__`` files included: importing
``sidecar.cache.ident`` must not load the store and the slab through
``sidecar/cache/__init__.py`` (the capacity analysis ships pure modules to
executors that have none of the sidecar's dependencies).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.test_architecture import PURE, ROOT

# Modules of the sidecar that do I/O, and the HTTP libraries.
IO_MODULES = ("sidecar.cache.store", "sidecar.cache.slab", "sidecar.engine",
              "sidecar.s3.dataport", "sidecar.server", "aiohttp", "aiobotocore")
# Whole packages that do I/O (their pure modules, as the origin's retry
# policy, excepted).
IO_PACKAGES = ("sidecar.origin.", "sidecar.admin.")


def loaded_with(name: str) -> list[str]:
    script = f"import json, sys, {name}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    modules: list[str] = json.loads(result.stdout)
    return modules


@pytest.mark.parametrize("name", sorted(set(PURE)))
def test_a_pure_module_loads_no_module_with_io(name: str) -> None:
    loaded = loaded_with(name)
    io = [m for m in loaded
          if m in IO_MODULES or m.startswith(tuple(f"{p}." for p in IO_MODULES))
          or (m.startswith(IO_PACKAGES) and m not in PURE)]
    assert not io, io
