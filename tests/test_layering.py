"""The package's declared layering, read from the source (no import runs).

Layers, top down; a module may import its own layer and the ones below:
  entry points   graphmod (the public names), graphmod.verification, graphmod.cli.*
  hooks          graphmod.hooks.* (hooks/)
  rules          graphmod.rewrite_rules.* (rewrite_rules/)
  core           every other graphmod module
and no import circle among graphmod's modules, imports inside functions
counted: an import deferred to run time is still a dependency.
"""
import ast
import os
from typing import Dict, List, Set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Source folders and the package each is importable as (hooks/ and
# rewrite_rules/ are linked into graphmod/; read once, from their own folders).
FOLDERS = {"graphmod": "graphmod", "hooks": "graphmod.hooks",
           "rewrite_rules": "graphmod.rewrite_rules"}
ENTRY_POINTS = ("graphmod", "graphmod.__main__", "graphmod.verification", "graphmod.cli")
LAYERS = ["entry points", "hooks", "rules", "core"]


def layer_of(module: str) -> str:
    if module in ENTRY_POINTS or module.startswith("graphmod.cli."):
        return "entry points"
    if module.startswith("graphmod.hooks"):
        return "hooks"
    if module.startswith("graphmod.rewrite_rules"):
        return "rules"
    return "core"


def modules() -> Dict[str, str]:
    """Module name -> source file."""
    found = {}
    for folder, package in FOLDERS.items():
        top = os.path.join(ROOT, folder)
        for directory, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs
                          if d != "__pycache__" and not os.path.islink(os.path.join(directory, d))]
            for f in files:
                if f.endswith(".py"):
                    parts = os.path.relpath(os.path.join(directory, f), top)[:-3].split(os.sep)
                    name = ".".join([package] + [p for p in parts if p != "__init__"])
                    found[name] = os.path.join(directory, f)
    return found


def imports(module: str, path: str, known: Set[str]) -> Set[str]:
    """The graphmod modules `module` imports (`from pkg import sub` counts
    as an import of pkg.sub where that is a module)."""
    named = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
                package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{package}.{base}" if base else package
            named.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                         for a in node.names)
    found = set()
    for name in named:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward(graph: Dict[str, Set[str]]) -> List[str]:
    return sorted(f"{m} ({layer_of(m)}) imports {d} ({layer_of(d)})"
                  for m, deps in graph.items() for d in deps
                  if LAYERS.index(layer_of(d)) < LAYERS.index(layer_of(m)))


def package_graph() -> Dict[str, Set[str]]:
    known = modules()
    return {m: imports(m, path, set(known)) for m, path in known.items()}


def test_the_package_has_no_import_circle_and_no_upward_import():
    graph = package_graph()
    # The reading itself works: the package is read whole and known edges are seen.
    assert len(graph) > 60 and "graphmod.rewrite_rules.ps_shards" in graph
    assert "graphmod.checkpoint.parts" in graph["graphmod.checkpoint.saver"]
    assert "graphmod.hooks.graph_modifier" in graph["graphmod.verification"]
    assert circles(graph) == []
    assert upward(graph) == []


def test_the_checks_see_a_circle_and_an_upward_import():
    graph = package_graph()
    graph["graphmod.checkpoint.parts"].add("graphmod.checkpoint.saver")
    graph["graphmod.embeddings.table"].add("graphmod.rewrite_rules.gather_to_lookup")
    assert any({"graphmod.checkpoint.parts", "graphmod.checkpoint.saver"} <= set(c)
               for c in circles(graph))
    assert upward(graph) == ["graphmod.embeddings.table (core) imports "
                             "graphmod.rewrite_rules.gather_to_lookup (rules)"]


def test_the_wheel_ships_every_package():
    """setup.py lists packages by hand: a new folder left out installs a
    graphmod that cannot import (the editable install of the tests hides it)."""
    setup = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    listed, = [ast.literal_eval(k.value) for node in ast.walk(setup) if isinstance(node, ast.Call)
               for k in node.keywords if k.arg == "packages"]
    packages = {m for m, path in modules().items() if path.endswith("__init__.py")}
    assert "graphmod.ps" in packages and "graphmod.hooks" in packages
    assert sorted(listed) == sorted(packages)
