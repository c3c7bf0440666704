"""The floors of src/genlab (docs/architecture.md): code imports only from its own floor and the floors below it.

Every import statement counts, top level or inside a function (the graph comes from tests/unit/core/test_imports.py, read
from the source with `ast`, nothing imported). A folder is a top-level package (`genlab.runtime`), or one family
(`genlab.families.world`); folders on one floor may import each other but never in a cycle.

KNOWN lists today's upward imports as (importer, imported): the move to floors is not finished until it is
empty. A new upward import fails, and so does an entry that no longer exists (delete it when its import goes).
"""
from __future__ import annotations

import ast
from collections import Counter

from test_imports import SRC, import_graph, module_name, strongly_connected_components

# lowest first; folders on one line share a floor
FLOORS = [
    ["core"],
    ["config"],
    ["runtime"],
    ["nn", "optim", "data"],
    ["sampling"],
    ["eval"],
    ["families"],
    ["training"],
    ["runs"],
    ["lab"],
    ["cli", "__main__"],
    ["<genlab>"],  # genlab/__init__.py: the lazy public API
]
RANK = {folder: i for i, names in enumerate(FLOORS) for folder in names}

KNOWN: set[tuple[str, str]] = set()


def folder(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "<genlab>"
    if parts[0] == "families" and len(parts) > 1 and (SRC / "genlab" / "families" / parts[1]).is_dir():
        return "families." + parts[1]
    return parts[0]


def floor(module: str) -> int:
    top = folder(module).split(".")[0]
    assert top in RANK, f"{module}: folder '{top}' has no floor in FLOORS (add it, docs/architecture.md too)"
    return RANK[top]


def upward_imports() -> set[tuple[str, str]]:
    return {(a, b) for a, targets in import_graph().items() for b in targets if floor(b) > floor(a)}


def test_every_module_has_a_floor():
    for m in import_graph():
        floor(m)


def test_no_import_runs_upward():
    found = upward_imports()
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert not new, "imports from a higher floor (move the code, or pass what it needs down): " + "; ".join(f"{a} -> {b}" for a, b in new)
    assert not gone, "these KNOWN upward imports are gone: delete them from the list: " + "; ".join(f"{a} -> {b}" for a, b in gone)


def test_no_cycle_between_folders():
    graph: dict[str, set[str]] = {}
    for a, targets in import_graph().items():
        graph.setdefault(folder(a), set())
        for b in targets:
            if folder(b) != folder(a) and (folder(a), folder(b)) not in {(folder(x), folder(y)) for x, y in KNOWN}:
                graph[folder(a)].add(folder(b))
                graph.setdefault(folder(b), set())
    cycles = strongly_connected_components(graph)
    assert not cycles, f"folders that import each other: {cycles}"


def function_level_imports() -> Counter:
    """Internal (genlab) imports by where they stand: 'module' level or inside a 'function'."""
    counts = Counter()
    for path in sorted((SRC / "genlab").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
        for node in ast.walk(tree):
            mod = node.module if isinstance(node, ast.ImportFrom) else (
                node.names[0].name if isinstance(node, ast.Import) else None)
            if mod and mod.split(".")[0] == "genlab":
                counts["function" if id(node) in inner else "module"] += 1
    return counts


def test_function_level_imports_are_the_exception():
    """Imports inside functions only keep the CLI start fast or guard optional/heavy dependencies: a bounded share."""
    c = function_level_imports()
    share = c["function"] / max(1, c["function"] + c["module"])
    assert share <= BUDGET_FUNCTION_IMPORTS, f"{c['function']} of {c['function'] + c['module']} internal imports sit in functions ({share:.0%})"


# imports inside functions keep the CLI start fast or guard an optional library: at most 10% of internal imports
BUDGET_FUNCTION_IMPORTS = 0.10


def test_module_names_resolve():
    # the helper this test builds on maps files to dotted names the way Python does
    assert module_name(SRC / "genlab" / "__init__.py") == "genlab"


def test_imports_left_in_functions_say_why():
    """Outside cli/ (whose commands import their work lazily so `genlab --help` starts fast), an internal import
    inside a function carries a one-line reason on its line."""
    silent = []
    for path in sorted((SRC / "genlab").rglob("*.py")):
        if path.relative_to(SRC / "genlab").parts[0] == "cli":
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for f in ast.walk(ast.parse(text)):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(f):
                    mod = node.module if isinstance(node, ast.ImportFrom) else (
                        node.names[0].name if isinstance(node, ast.Import) else None)
                    if mod and mod.split(".")[0] == "genlab" and "#" not in lines[node.lineno - 1]:
                        silent.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not silent, "imports inside functions without a reason (hoist them, or say why on the line): " + ", ".join(silent)
