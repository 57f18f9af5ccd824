"""The package's shape, checked from its source: no import cycle, and a reason beside every import made
inside a function. (Module boundaries follow concerns, not a line count: the 400-line cap is gone, issue 45.)

Conventions checked here:

- **Import cycles** count module-level imports: those at the top of a module, in its module-level
  ``if``/``try`` blocks and in class bodies (all run when the module is imported), and those under
  ``if TYPE_CHECKING:`` too (they never run, but a circle of types is a circle of concerns all the
  same: issue 45; a policy that needs a few members of the callback names them in a protocol,
  ``checkpoint/owner.py``). Imports inside a function run when it is called, so they do not count.
  ``import a.b.c`` and ``from a.b import c`` depend on ``a.b.c`` (when it is a module) and on
  ``a.b`` (``from a.b import name`` on ``a.b`` itself unless ``name`` is a submodule); a package's
  ``__init__`` counts as the module ``a.b``, and a module depends on its own enclosing package only
  when it imports it or a name from it.
- **Function-level imports** are allowed only for an optional dependency or a stated reason (keeping
  ``field --help`` or the pytest plugin free of torch, breaking an import-time dependency). The reason
  is a comment on the import statement's own line(s), or a comment line directly above it; one
  comment line above a run of consecutive import lines explains the whole run.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lightning_field"
# ---------------------------------------------------------------------------------------------- the checkers
def module_name(path: Path, root: Path) -> str:
    """The dotted name of ``path`` in the package at ``root`` (``root.name`` is the top package)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs when the module is imported, and every one a type checker reads (see the
    module docstring)."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):  # ``if TYPE_CHECKING:`` included
            pending += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending += [*node.body, *node.orelse, *node.finalbody]
            for handler in node.handlers:
                pending += handler.body
        elif isinstance(node, (ast.With, ast.ClassDef)):
            pending += node.body


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at module level (with their parent packages)."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for importer, path in paths.items():
        targets: set[str] = set()
        for node in module_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            else:
                module = _absolute(node, importer, path.name == "__init__.py")
                for alias in node.names:  # a submodule by name, else a name from the module itself
                    submodule = f"{module}.{alias.name}"
                    targets.add(submodule if submodule in paths else module)
        for target in targets:
            parts = target.split(".")
            for end in range(1, len(parts) + 1):  # importing a.b.c imports a and a.b first
                prefix = ".".join(parts[:end])
                # The importer's own enclosing packages are already being imported: only an explicit
                # import of one (``from pkg import sub`` inside ``pkg.sub.leaf``) is an edge back to it.
                enclosing = importer.startswith(prefix + ".") and prefix != target
                if prefix in paths and prefix != importer and not enclosing:
                    graph[importer].add(prefix)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

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
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def unexplained_function_imports(root: Path) -> list[str]:
    """``path:line`` of every import inside a function without a comment saying why (module docstring)."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        comments = {token.start[0] for token in tokens if token.type == tokenize.COMMENT}
        lines = source.splitlines()
        for function in ast.walk(ast.parse(source, str(path))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            imports = [node for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]
            explained_ends: set[int] = set()
            for node in sorted(imports, key=lambda node: node.lineno):
                end = node.end_lineno or node.lineno
                own = any(line in comments for line in range(node.lineno, end + 1))
                above = node.lineno - 1
                above_is_comment = above in comments and lines[above - 1].lstrip().startswith("#")
                if own or above_is_comment or above in explained_ends:
                    explained_ends.add(end)
                else:
                    problems.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(problems))  # a nested function's import is seen from its enclosing one too


# ---------------------------------------------------------------------------------------------- the package
def test_the_package_has_no_import_cycle() -> None:
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "module-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.slow
def test_every_function_level_import_says_why() -> None:
    problems = unexplained_function_imports(PACKAGE)
    assert not problems, "function-level imports without a reason (see this module's docstring):\n" + "\n".join(
        problems
    )


def test_the_package_keeps_no_formatter_exemptions() -> None:
    # Module boundaries follow concerns, not a line count: nothing is squeezed past the formatter.
    exempt = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip") or line.strip() in ("# fmt: off", "# fmt: on")
    ]
    assert not exempt, "formatter exemptions in the package:\n" + "\n".join(exempt)


# ---------------------------------------------------------------------------------------------- the checkers fail
def _tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_the_cycle_checker_finds_a_cycle_through_type_only_imports_and_ignores_deferred_ones(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "a.py": "from pkg.b import thing\n",
            "b.py": "from . import c\nthing = 1\n",
            "c.py": "import pkg.a\n",
            "d.py": "def later():\n    from pkg import e  # deferred\n",
            "e.py": "from pkg import d\n",
            "sub/__init__.py": "from pkg.sub.leaf import x\n",
            "sub/leaf.py": "x = 1\n",
        },
    )
    assert import_cycles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "c.py").write_text("import os\n")
    assert import_cycles(import_graph(package)) == []
    (package / "sub" / "leaf.py").write_text("from pkg import sub\nx = 1\n")  # through a package's __init__
    assert import_cycles(import_graph(package)) == [["pkg.sub", "pkg.sub.leaf"]]
    (package / "sub" / "leaf.py").write_text("x = 1\n")
    (package / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n")
    assert import_cycles(import_graph(package)) == [["pkg.d", "pkg.e"]]  # a circle of types is a circle


def test_the_import_checker_wants_a_reason_beside_each_function_level_import(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "m.py": (
                "import os\n"
                "def explained():\n"
                "    import json  # optional: only this command reads it\n"
                "    # keeps the CLI free of torch\n"
                "    from pathlib import (\n"
                "        Path,\n"
                "    )\n"
                "    import re\n"
                "\n"
                "    import shlex\n"
                "def bare():\n"
                "    x = 1  # a comment on the line above code does not count\n"
                "    import shutil\n"
                "    class Inner:\n"
                "        def method(self):\n"
                "            from typing import Any\n"
            )
        },
    )
    assert unexplained_function_imports(package) == [
        "pkg/m.py:10: import shlex",
        "pkg/m.py:13: import shutil",
        "pkg/m.py:16: from typing import Any",
    ]
