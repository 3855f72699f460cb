"""No module under ``src/`` imports itself through others: every import statement counts — at
module level, inside functions and under ``TYPE_CHECKING`` — so no pair of modules leans on
each other, not even at call time.

The graph is read from the source with :mod:`ast`, not by importing it. Each import statement
becomes edges to the modules of the tree it runs: ``import a.b`` and ``from a.b import name`` to
``a.b`` (a package means its ``__init__``), ``from a import b`` to the submodule ``a.b`` when
there is one, relative imports resolved against the importing module, and a name that a package
exports lazily (``openenv._lazy.lazy_exports``) to the module that defines it. Parent packages
that Python runs first are not edges: they never depend on the order of a cycle. Imports whose
module is computed at run time (``importlib.import_module(variable)``) cannot be read.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``importer`` runs ``imported`` and takes ``name`` from it."""

    importer: str
    imported: str
    name: str
    line: int


def modules_under(src: Path) -> Dict[str, Path]:
    """Every module of the tree below ``src``, by dotted name (a package by its ``__init__``)."""
    found: Dict[str, Path] = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(part.isidentifier() for part in parts):
            found[".".join(parts)] = path
    return found


class ImportGraph:
    """The import edges among the modules below one source root."""

    def __init__(self, src: Path) -> None:
        self.paths = modules_under(src)
        self._trees = {module: ast.parse(path.read_text(), str(path)) for module, path in self.paths.items()}
        self._lazy: Dict[str, Dict[str, str]] = {}
        self._names: Dict[str, Dict[str, Any]] = {}

    def _package_of(self, module: str) -> str:
        return module if self.paths[module].name == "__init__.py" else module.rpartition(".")[0]

    def _absolute(self, module: str, level: int, name: Optional[str]) -> str:
        if not level:
            return name or ""
        parts = self._package_of(module).split(".")
        base = ".".join(parts[: len(parts) - (level - 1)])
        return f"{base}.{name}" if name else base

    # -- lazy exports: a package's table of name -> defining module, read without running it

    def _module_names(self, module: str) -> Dict[str, Any]:
        """The literal values a module binds at its top level (lists, dicts, their updates)."""
        if module in self._names:
            return self._names[module]
        names: Dict[str, Any] = {}
        self._names[module] = names
        for statement in self._trees[module].body:
            if isinstance(statement, ast.ImportFrom):
                source = self._absolute(module, statement.level, statement.module)
                for alias in statement.names:
                    if source in self.paths and alias.name != "*":
                        value = self._module_names(source).get(alias.name)
                        if value is not None:
                            names[alias.asname or alias.name] = value
            elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target = statement.targets[0]
                value = _literal(statement.value, names)
                if isinstance(target, ast.Name) and value is not None:
                    names[target.id] = value
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                call = statement.value
                func = call.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr == "update"
                    and isinstance(func.value, ast.Name)
                    and isinstance(names.get(func.value.id), dict)
                    and len(call.args) == 1
                ):
                    update = _literal(call.args[0], names)
                    if isinstance(update, dict):
                        names[func.value.id].update(update)
        return names

    def lazy_exports(self, package: str) -> Dict[str, str]:
        """The names ``package`` exports through ``lazy_exports``, each to its module."""
        if package not in self._lazy:
            table: Dict[str, str] = {}
            names = self._module_names(package)
            for node in ast.walk(self._trees[package]):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
                    for argument in [*node.args[1:], *(keyword.value for keyword in node.keywords)]:
                        exports = _literal(argument, names)
                        for name, where in (exports or {}).items():
                            level = len(where) - len(where.lstrip("."))
                            table[name] = self._absolute(package, level, where.lstrip(".") or None)
            self._lazy[package] = table
        return self._lazy[package]

    # -- the edges

    def _name_edges(self, importer: str, package: str, name: str, line: int) -> Iterator[Import]:
        """``from package import name``: the submodule, or the package and what it lends."""
        if f"{package}.{name}" in self.paths:
            yield Import(importer, f"{package}.{name}", name, line)
            return
        seen = set()
        while package in self.paths and package not in seen:
            seen.add(package)
            yield Import(importer, package, name, line)
            package = self.lazy_exports(package).get(name, package)

    def imports_of(self, module: str) -> Iterator[Import]:
        """Every edge of every import statement in ``module``, wherever the statement stands."""
        for node in ast.walk(self._trees[module]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in self.paths:
                        target = target.rpartition(".")[0]
                    if target:
                        yield Import(module, target, alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node.level, node.module)
                for alias in node.names:
                    yield from self._name_edges(module, source, alias.name, node.lineno)

    def edges(self) -> Dict[Tuple[str, str], List[Import]]:
        """Each importer -> imported pair of the tree (self-imports left out), with its imports."""
        found: Dict[Tuple[str, str], List[Import]] = {}
        for module in self.paths:
            for edge in self.imports_of(module):
                if edge.imported != edge.importer:
                    found.setdefault((edge.importer, edge.imported), []).append(edge)
        return found


def _literal(node: ast.expr, names: Dict[str, Any]) -> Any:
    """The value of a constant expression, a bound name, ``sorted``/``list`` of one, or a dict
    comprehension giving every name of a bound list one constant; None for anything else."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("sorted", "list") and len(node.args) == 1:
        value = _literal(node.args[0], names)
        return sorted(value) if isinstance(value, (list, dict)) else None
    if isinstance(node, ast.DictComp) and len(node.generators) == 1:
        loop = node.generators[0]
        keys = _literal(loop.iter, names)
        key_is_loop_name = isinstance(node.key, ast.Name) and node.key.id == getattr(loop.target, "id", None)
        if isinstance(keys, list) and key_is_loop_name and isinstance(node.value, ast.Constant):
            return {key: node.value.value for key in keys}
    return None


def strongly_connected(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node, each sorted (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def cycles_of(import_graph: ImportGraph) -> List[str]:
    """Each cycle of the tree, told as its file -> file edges and the names they take."""
    edges = import_graph.edges()
    graph: Dict[str, Set[str]] = {}
    for importer, imported in edges:
        graph.setdefault(importer, set()).add(imported)
    told = []
    for component in strongly_connected(graph):
        members = set(component)
        lines = [f"cycle of {len(component)} modules:"]
        for (importer, imported), found in sorted(edges.items()):
            if importer in members and imported in members:
                names = ", ".join(sorted({f"{edge.name} (line {edge.line})" for edge in found}))
                shown = [_shown(import_graph.paths[module]) for module in (importer, imported)]
                lines.append(f"  {shown[0]} -> {shown[1]}: {names}")
        told.append("\n".join(lines))
    return told


def test_no_module_of_src_imports_itself_through_others() -> None:
    graph = ImportGraph(SRC)
    assert ("openenv.core.env_client", "openenv.core.spaces") in graph.edges()  # read inside from_env
    cycles = cycles_of(graph)
    assert not cycles, "import cycles in src/:\n" + "\n".join(cycles)


def test_the_finder_reads_every_kind_of_import_and_tells_the_cycle(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": (
            "from ._lazy import lazy_exports\n"
            "_EXPORTS = {'Late': '.late'}\n"
            "__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)\n"
        ),
        "pkg/_lazy.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "pkg/b.py": "def f():\n    from . import c\n",
        "pkg/c.py": "def g():\n    from pkg import Late\n",
        "pkg/late.py": "import pkg.sub.d\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/d.py": "from ..a import A\n",
        "pkg/alone.py": "import pkg.a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = ImportGraph(tmp_path)
    assert strongly_connected({m: {t for (i, t) in graph.edges() if i == m} for m in graph.paths}) == [
        ["pkg.a", "pkg.b", "pkg.c", "pkg.late", "pkg.sub.d"]
    ]
    assert ("pkg.c", "pkg") in graph.edges()  # the package's __init__ runs too
    (told,) = cycles_of(graph)
    assert f"{tmp_path}/pkg/c.py -> {tmp_path}/pkg/late.py: Late (line 2)" in told
    assert f"{tmp_path}/pkg/a.py -> {tmp_path}/pkg/b.py: B (line 3)" in told


def test_the_cycle_finder_finds_a_cycle_and_leaves_out_what_only_leads_into_it() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
