"""No import cycles inside genlab, except the known ones listed here until they are gone.

The graph is read from the source with `ast`, nothing is imported: an edge A -> B for every `import` statement
of module A that names module B, wherever it stands (top level or inside a function, where most of genlab's
imports of torch-heavy modules live). `from genlab.x import y` points at genlab.x.y when y is a submodule, else
at genlab.x; relative imports are resolved. Importing genlab.x.y also runs genlab/x/__init__.py first, so it is
an edge to the package genlab.x too, unless the importer lives inside genlab.x (that package is then already being
imported). Imports by string (`importlib.import_module`, as registry.py does on purpose to stay out of cycles) are
not edges.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"

# Today's cycles, each as the one import (importer, imported) that closes it, with the cycle it closes. A new
# cycle fails the test, and so does an entry that no longer closes one (delete it when its cycle is gone). A new
# cycle that runs through one of these imports is not seen until that import goes: shrink the list to empty.
KNOWN: set = set()  # every cycle is gone; keep it that way


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, name: str, is_package: bool, modules: set[str]):
    """Every genlab module that `name`'s import statements name (resolved to the longest existing module)."""
    def known(mod: str) -> str | None:
        while mod and mod not in modules:
            mod = mod.rpartition(".")[0]
        return mod or None

    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..x import y`: level 1 is this module's package
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] == "genlab" and (m := known(t)):
                # importing genlab.x.y first runs genlab/x/__init__.py, unless the importer lives inside genlab.x
                # (then that package is already being imported: a sibling import is no cycle)
                parts = m.split(".")
                for target in (".".join(parts[:i]) for i in range(2, len(parts) + 1)):
                    if target != name and not name.startswith(target + "."):
                        yield target


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, frozenset[str]]:
    paths = sorted((SRC / "genlab").rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {}
    for p in paths:
        name = module_name(p)
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        graph[name] = frozenset(imported_modules(tree, name, p.name == "__init__.py", modules))
    return graph


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit); components of one module without a self-edge are left out."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    found.append(sorted(comp))
    return found


def cycle_through(graph: dict[str, set[str]], start: str, component: list[str]) -> list[str]:
    """A shortest import path start -> ... -> start inside one component (breadth first)."""
    members, parent, frontier = set(component), {start: None}, [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle of {component}")


def without(graph, edges):
    return {m: {t for t in targets if (m, t) not in edges} for m, targets in graph.items()}


def test_genlab_has_no_import_cycle_beyond_the_known_ones():
    graph = import_graph()
    cycles = [cycle_through(graph, comp[0], comp) for comp in strongly_connected_components(without(graph, KNOWN))]
    assert not cycles, "new import cycle(s):\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


def test_every_known_cycle_still_exists():
    """An entry whose import is gone, or no longer closes a cycle, is to be deleted from KNOWN."""
    graph = import_graph()
    stale = []
    for a, b in sorted(KNOWN):
        rest = without(graph, KNOWN - {(a, b)})
        if b not in rest.get(a, ()) or not any(a in comp and b in comp for comp in strongly_connected_components(rest)):
            stale.append(f"{a} -> {b}")
    assert not stale, "KNOWN lists imports that close no cycle any more, delete them: " + ", ".join(stale)


def test_imports_resolve_relative_names_submodules_and_enclosing_packages():
    modules = {"genlab", "genlab.a", "genlab.a.b", "genlab.a.c", "genlab.x", "genlab.x.y", "genlab.x.z"}
    code = "from . import c\ndef f():\n    from ..x import y, thing\n    import genlab.x.z.attr\nimport numpy\n"
    found = set(imported_modules(ast.parse(code), "genlab.a.b", False, modules))
    # genlab.a is not an edge: b lives inside it; genlab.x is, as its __init__ runs before genlab.x.y
    assert found == {"genlab.a.c", "genlab.x", "genlab.x.y", "genlab.x.z"}


def test_a_cycle_is_reported_as_its_import_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    components = strongly_connected_components(graph)
    assert components == [["a", "b", "c"], ["e"]]
    assert cycle_through(graph, "b", components[0]) == ["b", "c", "a", "b"]
