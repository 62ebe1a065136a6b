"""Issue 28's layout rules on the stall capability, read from the source with ast: no module in
src/recperf/stalls over 400 lines, no function (or method) over 60, and no ``dict[str, Any]``
(or ``Mapping[str, Any]``) in a public signature but at the JSON boundary."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

STALLS = Path(__file__).resolve().parents[2] / "src" / "recperf" / "stalls"
MODULES = sorted(STALLS.rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
LOOSE = re.compile(r"\b(dict|Dict|Mapping|MutableMapping)\[str, Any\]")
"""A loose JSON-shaped object in an annotation (nested ones too: ``list[dict[str, Any]]``)."""
JSON_BOUNDARY = frozenset({"to_json", "from_json"})
"""Methods that turn a typed result into its JSON object and back: dicts by definition."""
ALLOWED = {
    ("cost/inputs.py", "ProfileSummary.from_mapping"): "reads a summary.json object (from_json)",
    ("run/ranktrace.py", "check_trace"): "checks a raw recperf rank trace JSON document",
    ("run/ranktrace.py", "load_trace"): "reads a raw recperf rank trace JSON document",
    ("run/ranktrace.py", "read_rank_run"): "turns a raw rank trace document into a typed RankRun",
    ("run/hook.py", "Profiler.trace"): "builds the rank's Chrome trace JSON document",
    ("run/hook.py", "Profiler.write_trace"): "meta: the user's own keys, written into the trace",
    ("run/hook.py", "kineto_events"): "builds Chrome trace events (JSON objects)",
    ("trace/files.py", "read_trace"): "reads a raw Chrome/Kineto trace JSON document",
    ("trace/kineto.py", "normalise"): "turns a raw Kineto trace document into a typed RankTrace",
}
"""(module under stalls/, function or Class.method) -> why it may take or return a dict."""


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` longer than ``limit`` lines."""
    return [
        (node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > limit
    ]


def _loose(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
    notes = [p.annotation for p in params if p is not None and p.annotation is not None]
    notes += [fn.returns] if fn.returns is not None else []
    return any(LOOSE.search(ast.unparse(n)) for n in notes)


def loose_signatures(source: str) -> list[str]:
    """Public functions and public classes' public methods (``Class.method``) in ``source``
    whose parameter or return annotations hold a loose JSON-shaped object, but ``to_json`` and
    ``from_json``."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [node.name] if not node.name.startswith("_") and _loose(node) else []
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            found += [
                f"{node.name}.{m.name}"
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                and not m.name.startswith("_")
                and m.name not in JSON_BOUNDARY
                and _loose(m)
            ]
    return found


def test_the_checker_finds_a_loose_signature() -> None:
    source = """
def public(x: int, *, opts: Mapping[str, Any] | None = None) -> int: ...
def rows() -> list[dict[str, Any]]: ...
def _private(x: dict[str, Any]) -> None: ...
def typed(x: dict[str, float]) -> Mapping[str, int]: ...
class Result:
    def to_json(self) -> dict[str, Any]: ...
    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Result: ...
    def details(self, **kw: Any) -> 'dict[str, Any]': ...
    def _helper(self) -> dict[str, Any]: ...
class _Hidden:
    def shown(self) -> dict[str, Any]: ...
"""
    assert loose_signatures(source) == ["public", "rows", "Result.details"]


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


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(STALLS)))
def test_no_loose_dict_in_a_public_signature(path: Path) -> None:
    module = path.relative_to(STALLS).as_posix()
    found = [f for f in loose_signatures(path.read_text()) if (module, f) not in ALLOWED]
    assert found == [], "give these a typed frozen dataclass (with to_json where written)"


def test_every_allowed_signature_still_exists() -> None:
    """An allow-list entry whose function went typed (or away) is removed, not kept."""
    for module, name in ALLOWED:
        assert name in loose_signatures((STALLS / module).read_text()), (module, name)
