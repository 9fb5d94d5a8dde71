"""The house rules of docs/ARCHITECTURE.md, read from the code's own imports.

Every `import` and `from ... import` statement of every module under sidecar/
counts, also those under `if TYPE_CHECKING:` and inside functions: a cycle that
only type checking sees is still a cycle in the design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sidecar"

# Decisions without I/O: no sockets, files, clocks of their own, threads or logs.
PURE = (
    "sidecar.model", "sidecar.blocks", "sidecar.layout", "sidecar.errors", "sidecar.tally",
    "sidecar.aligned", "sidecar.prefetch.streams", "sidecar.prefetch.planner",
    "sidecar.s3.ranges", "sidecar.s3.preconditions", "sidecar.s3.sigv4",
    "sidecar.s3.addressing", "sidecar.s3.errors", "sidecar.s3.operations", "sidecar.s3.payload",
    "sidecar.s3.aws_chunked", "sidecar.http_fields", "sidecar.numerals",
    "sidecar.cache.slot_fifo", "sidecar.cache.index", "sidecar.cache.ident", "sidecar.cache.errors",
    "sidecar.cache.index", "sidecar.cache.slot_fifo",
    "sidecar.cache.slot_format", "sidecar.cache.outcomes", "sidecar.cache.tier_regions",
    "sidecar.origin.policy", "sidecar.isolation.lanes", "sidecar.bucket_names",
)
IO_MODULES = frozenset({
    "asyncio", "socket", "os", "io", "mmap", "select", "selectors", "ssl", "threading",
    "subprocess", "random", "logging", "pathlib", "shutil", "tempfile",
    "aiohttp", "aiobotocore", "botocore", "boto3", "psutil", "prometheus_client",
    "urllib.request", "http", "concurrent",
})
# `time` converts dates purely (strftime, gmtime); reading the clock is what is not pure.
CLOCK_READS = ("time.time(", "time.monotonic(", "time.perf_counter(", "time.sleep(",
               "datetime.now(", "datetime.utcnow(")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(path: Path, name: str) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from sidecar.admin import ui` imports the module sidecar.admin.ui.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def project_graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {imported for imported in imports_of(path, name)
               if imported in known and imported != name}
        for name, path in known.items()
    }


def assert_acyclic(graph: dict[str, set[str]], what: str) -> None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail(f"{what}: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_there_is_no_import_cycle_inside_sidecar() -> None:
    graph = project_graph()
    # Package __init__ files are parents, not peers: `sidecar.cache` -> its own
    # submodules is how a package presents itself, not a cycle of the design.
    for name, edges in graph.items():
        graph[name] = {e for e in edges if not e.startswith(name + ".")}
    assert_acyclic(graph, "import cycle")


def room_of(module: str) -> str:
    """The room a module lives in: its package under sidecar/, or itself at the top."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def test_rooms_import_downhill_only() -> None:
    # Between rooms, every arrow points one way: no room imports a room that imports
    # it back, directly or through others (a helper two rooms share lives below both).
    rooms: dict[str, set[str]] = {}
    for name, edges in project_graph().items():
        rooms.setdefault(room_of(name), set()).update(
            room_of(edge) for edge in edges if room_of(edge) != room_of(name))
    for edges in list(rooms.values()):
        for edge in edges:
            rooms.setdefault(edge, set())
    assert_acyclic(rooms, "rooms that import each other")


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_nothing_with_io(name: str) -> None:
    path = modules()[name]
    imported = set(imports_of(path, name))
    io = {m for m in imported if m in IO_MODULES or m.split(".")[0] in IO_MODULES}
    assert not io, sorted(io)
    source = path.read_text(encoding="utf-8")
    assert not [read for read in CLOCK_READS if read in source], "reads a clock of its own"
    internal = {imported for imported in imports_of(path, name)
                if imported.startswith("sidecar.") and imported in modules()}
    assert internal <= set(PURE), sorted(internal - set(PURE))


def test_the_cache_knows_nothing_of_http_or_the_origin() -> None:
    graph = project_graph()
    for name in graph:
        if name.startswith("sidecar.cache"):
            outside = {m for m in graph[name] if not m.startswith("sidecar.cache")}
            assert outside <= {"sidecar.aligned", "sidecar.blocks", "sidecar.errors",
                               "sidecar.model"}, \
                (name, sorted(outside))


def test_only_the_engine_starts_fetches() -> None:
    """The prefetch planner returns blocks; it holds no origin and no tasks."""
    graph = project_graph()
    for name in graph:
        if name.startswith("sidecar.prefetch"):
            assert not any(m.startswith(("sidecar.origin", "sidecar.engine"))
                           for m in graph[name]), (name, sorted(graph[name]))
    planner = (PACKAGE / "prefetch" / "planner.py").read_text(encoding="utf-8")
    assert "create_task" not in planner and "async def" not in planner
