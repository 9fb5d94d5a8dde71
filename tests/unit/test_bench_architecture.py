"""bench/ is shaped like the product: no import cycle among its modules.

Every `import` and `from ... import` statement of every module under bench/
counts, also those under `if TYPE_CHECKING:` and inside functions, as in
tests/unit/test_architecture.py for sidecar/.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bench"
# Generated data and results are not the harness's code.
SKIPPED = ("data", "results")


def bench_modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] in SKIPPED:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(path: Path, name: str) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            # `from bench import cpu` imports the module bench.cpu.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def bench_graph() -> dict[str, set[str]]:
    known = bench_modules()
    return {name: {imported for imported in imported_names(path, name)
                   if imported in known and imported != name
                   # a package's __init__ is its parent, not a peer
                   and not imported.startswith(name + ".") and imported != "bench"}
            for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read_from_every_module_of_bench() -> None:
    graph = bench_graph()
    assert {"bench.run", "bench.harness", "bench.report", "bench.cost"} <= set(graph)
    assert "bench.harness" in graph["bench.cost"]
    # The check finds a cycle where there is one.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_there_is_no_import_cycle_inside_bench() -> None:
    cycle = find_cycle(bench_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_harness_knows_no_scenario_and_no_scenario_the_entry_point() -> None:
    graph = bench_graph()
    assert not {"bench.run", "bench.__main__"} & {
        imported for name, edges in graph.items() if name not in ("bench.__main__",)
        for imported in edges}
    scenarios = {"bench.cold_1p", "bench.four_partitions", "bench.warm_ranges",
                 "bench.restart", "bench.cost", "bench.isolation", "bench.warmup",
                 "bench.broker"}
    assert not graph["bench.harness"] & scenarios
