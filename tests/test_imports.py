"""The import graph of raystream: the layers written as import-linter contracts (pyproject.toml's
[tool.importlinter]) hold, run as `lint-imports` from the repository's root; no module cycle (in-function imports
included, so a cycle cannot hide in a function), and raystream.data's rooms point one way (stream -> videos ->
decode, stream -> decode, demo; that data knows nothing above it, Ray and MLflow included, is a contract). The rest
is a static read of the source with ast: nothing is imported, so it is fast and exact; each file is read and parsed
once for the whole module."""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1] / "raystream"


def _lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`lint-imports` (import-linter, the dev extra) run in `cwd` on the package found there, its cache off."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports not found: install the dev extra (pip install -e '.[dev]'), which brings import-linter"
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([exe, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_layers_hold():
    """Every contract in pyproject.toml is kept: no upward import between raystream's packages, no circle, the pure
    packages free of Ray and MLflow, MLflow recording free of data, eval and models."""
    done = _lint_imports(ROOT.parent)
    assert done.returncode == 0, "import-linter contracts broken (pyproject.toml [tool.importlinter]):\n" + \
        done.stdout[done.stdout.find("Broken contracts"):] + done.stderr


def test_the_layers_contract_sees_an_upward_import_inside_a_function(tmp_path):
    """The same kind of contract on a two-layer package whose lower layer imports the upper one only inside a
    function: lint-imports fails and names the import."""
    pkg = tmp_path / "house"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from house.low import floor\n")
    (pkg / "low" / "floor.py").write_text("def up():\n    from house import high  # lazy\n    return high\n")
    (tmp_path / ".importlinter").write_text(textwrap.dedent("""\
        [importlinter]
        root_package = house
        [importlinter:contract:layers]
        name = house layers
        type = layers
        containers = house
        layers =
            high
            low
        """))
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    assert "house.low.floor -> house.high" in done.stdout


@functools.lru_cache(maxsize=None)
def _sources() -> Dict[Path, tuple]:
    """{path: (its lines, its ast)} of every module of raystream, read and parsed once for all the tests here (each
    test parsing the package again cost a second or two)."""
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        text = p.read_text()
        out[p] = (text.splitlines(), ast.parse(text, str(p)))
    return out


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lazy_exports(tree: ast.Module) -> Dict[str, str]:
    """A package's `_EXPORTS = {name: submodule}` (names its __getattr__ imports on first use), else {}."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


@functools.lru_cache(maxsize=None)
def _import_graph() -> Dict[str, frozenset]:
    trees = {_module_of(p): (p, tree) for p, (_, tree) in _sources().items()}
    exports = {m: _lazy_exports(t) for m, (p, t) in trees.items() if p.name == "__init__.py"}
    graph: Dict[str, frozenset] = {}
    for mod, (path, tree) in trees.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: Set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.split(".")[0] == "raystream")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                if base.split(".")[0] != "raystream":
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in trees:
                        out.add(sub)
                    elif a.name in exports.get(base, {}):
                        out.add(f"{base}.{exports[base][a.name]}")
                    else:
                        out.add(base)
        graph[mod] = frozenset(m for m in out if m in trees and m != mod)
    return graph


def import_graph() -> Dict[str, Set[str]]:
    """{module: raystream modules it imports anywhere in its source}; `from pkg import name` points at
    pkg.name when that is a module or a lazy export of pkg, else at pkg. Built once; each call gets its own copy."""
    return {m: set(targets) for m, targets in _import_graph().items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_a_cycle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _a_cycle(graph: Dict[str, Set[str]], component: Set[str]) -> List[str]:
    """A shortest path from the first module of `component` back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(component)  # unreachable: a component of 2+ modules holds a cycle through each of them


def test_raystream_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (in-function imports included):\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# what each part of raystream.data may import inside raystream (besides itself and raystream.data's errors)
ROOMS = {
    "raystream.data.decode": set(),
    "raystream.data.videos": {"raystream.data.decode", "raystream.uris"},
    "raystream.data.demo": set(),
    "raystream.data.stream": {"raystream.data.videos", "raystream.data.decode", "raystream.data.demo"},
}


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_data_rooms_point_one_way(room):
    allowed = ROOMS[room] | {room, "raystream.data", "raystream.data.errors"}
    graph = import_graph()
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() if m == room or m.startswith(room + ".")
                   for t in targets if not any(t == a or t.startswith(a + ".") for a in allowed))
    assert not wrong, f"{room} imports outside its arrows:\n" + "\n".join(wrong)


def _in_function_imports(path: Path):
    """(line, source) of each import inside a function of `path`, with whether a comment on it or on the line
    above says why it is there."""
    lines, tree = _sources()[path]
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    said = any("#" in lines[i] for i in range(node.lineno - 1, node.end_lineno)) or \
                        lines[node.lineno - 2].lstrip().startswith("#")
                    yield node.lineno, lines[node.lineno - 1].strip(), said


def test_imports_sit_at_the_top_unless_a_comment_says_why():
    """Across the whole package: an import inside a function is a deliberate lazy one (Ray or MLflow kept out of
    the CLI's light commands, the probe child process, an optional or private module), and says so."""
    wrong = sorted({f"{p.relative_to(ROOT.parent)}:{line}: {text}" for p in _sources()
                    for line, text, said in _in_function_imports(p) if not said})
    assert not wrong, "imports inside functions without a comment saying why:\n" + "\n".join(wrong)


def test_config_values_are_read_from_the_schema_not_with_a_default():
    """`getattr(cfg, key, default)` hides a key missing from the typed schema; every value is read as cfg.key."""
    wrong = []
    for p, (_, tree) in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) == 3 \
                    and "cfg" in ast.unparse(node.args[0]).lower():
                wrong.append(f"{p.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_dynamo_or_inductor_when_it_is_imported():
    """torch._dynamo takes 2-4 s to import (3.6 of `import raystream.cli`'s 8.5 s on the 2-core machine, 2026-11-27)
    and torch loads it on first use: every driver, Ray worker and CLI call would pay it, compiled step or not."""
    found = []
    for path, (_, tree) in _sources().items():
        for node in tree.body:  # module level only: a function may import it
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT.parent)}:{node.lineno} {n}" for n in names
                      if n.split(".")[:2] in (["torch", "_dynamo"], ["torch", "_inductor"])]
    assert found == []
