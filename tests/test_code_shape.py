"""The library's own size rules: a module holds one idea (under ~400 lines), a function fits a
screen (under ~60 lines, docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method of `source` longer than `limit` lines."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_function_check_counts_lines():
    short = "def f():\n    return 1\n"
    long = "def g():\n" + "    x = 1\n" * 70
    assert long_functions(short, 60) == []
    assert long_functions(long, 60) == [("g", 71)]


def test_no_module_of_src_is_over_the_limit():
    over = {
        str(p.relative_to(SRC)): n
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert not over, f"modules over {MAX_FILE_LINES} lines (split them by idea): {over}"


def test_no_function_of_src_is_over_the_limit():
    over = [
        f"{p.relative_to(SRC)}: {name} ({n} lines)"
        for p in sorted(SRC.rglob("*.py"))
        for name, n in long_functions(p.read_text(encoding="utf-8"), MAX_FUNCTION_LINES)
    ]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)
