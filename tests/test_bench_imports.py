"""bench/'s scripts import one another without going round in a circle (a script run as
__main__ that another imports back is loaded twice), and their functions fit a screen."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
LONGEST = 80  # lines of a function, CONTRIBUTING.md's "fits a screen"


def trees() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(BENCH.glob("*.py"))}


def bench_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The bench modules `tree` imports, anywhere in it (inside functions too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & modules


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every edge is followed
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_direct_and_ring_imports():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_bench_modules_import_no_circle():
    parsed = trees()
    modules = set(parsed)
    graph = {name: bench_imports(tree, modules) - {name} for name, tree in parsed.items()}
    assert graph["bench_vs_fairseq"], "no bench imports found: the parsing is broken"
    cycle = find_cycle(graph)
    assert cycle is None, "bench/ modules import each other in a circle: " + " -> ".join(cycle)


def test_bench_functions_fit_a_screen():
    long = [
        f"{name}.py:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for name, tree in trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > LONGEST
    ]
    assert not long, f"functions over {LONGEST} lines in bench/: " + "; ".join(long)
