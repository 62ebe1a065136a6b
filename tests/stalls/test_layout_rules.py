"""Issue 28's size limits on the stall capability, read from the source with ast: no module in
src/recperf/stalls over 400 lines, no function (or method) over 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STALLS = Path(__file__).resolve().parents[2] / "src" / "recperf" / "stalls"
MODULES = sorted(STALLS.rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` longer than ``limit`` lines."""
    return [
        (node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > limit
    ]


def test_the_checker_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    assert long_functions(f"def f():\n{body}\n\ndef g():\n    pass\n", 60) == [("f", 62)]


def test_the_subpackages_are_there() -> None:
    names = {p.relative_to(STALLS).parts[0] for p in MODULES}
    assert {"trace", "run", "model", "cost"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(STALLS)))
def test_module_and_function_sizes(path: Path) -> None:
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES
    assert long_functions(source, MAX_FUNCTION_LINES) == []
