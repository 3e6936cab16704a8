"""The shape of the code, checked: the size rule and no import circles (docs/architecture.md).

Sizes are counted as the rule in docs/architecture.md says: the lines of a ``class`` or ``def``
statement's body, docstring included. A class over CLASS_LINES or a function over FUNCTION_LINES
must be listed in the doc's "The size rule" section, with a ceiling and its reason; a listing whose
code has shrunk under the rule, or grown over its ceiling, or gone, fails too, so the list stays true.
The package and the benchmarks are measured; the tests and the emulator are not.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "daytona_kernel"
MEASURED = (PACKAGE, REPO / "benchmarks")
CLASS_LINES = 280
FUNCTION_LINES = 50
# "- `daytona_kernel/cli.py::build_parser` (at most 100): the reason ..."
LISTED = re.compile(r"^- `(?P<path>[\w/]+\.py)::(?P<name>[\w.]+)` \(at most (?P<ceiling>\d+)\)")


@functools.cache
def measure() -> dict[str, tuple[int, int]]:
    """``path::qualified.name`` -> (body lines, the rule's limit) for every class and function."""
    sizes: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                limit = CLASS_LINES if isinstance(child, ast.ClassDef) else FUNCTION_LINES
                assert child.end_lineno is not None
                sizes[f"{path}::{name}"] = (child.end_lineno - child.body[0].lineno + 1, limit)
                visit(child, path, name + ".")
            else:
                visit(child, path, prefix)

    for root in MEASURED:
        for file in sorted(root.rglob("*.py")):
            visit(ast.parse(file.read_text(encoding="utf-8")), file.relative_to(REPO).as_posix(), "")
    return sizes


def listed() -> dict[str, int]:
    """The doc's exceptions to the size rule: ``path::name`` -> its ceiling."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## The size rule\n", 1)[1].split("\n## ", 1)[0]
    found = {m["path"] + "::" + m["name"]: int(m["ceiling"]) for m in map(LISTED.match, section.splitlines()) if m}
    assert found, "docs/architecture.md's size rule section lists no exception in the expected form"
    return found


def test_every_class_and_function_over_the_rule_is_listed_with_its_reason() -> None:
    sizes, exceptions = measure(), listed()
    unlisted = [
        f"{name}: {lines} lines (rule: {limit})"
        for name, (lines, limit) in sizes.items()
        if lines > limit and name not in exceptions
    ]
    assert not unlisted, (
        "Over the size rule and not listed in docs/architecture.md (The size rule): split it, or list it there "
        "as `- `path::name` (at most N): why it stays whole`:\n" + "\n".join(unlisted)
    )


def test_the_docs_list_of_exceptions_is_true() -> None:
    sizes, wrong = measure(), []
    for name, ceiling in listed().items():
        if name not in sizes:
            wrong.append(f"{name}: no such class or function (moved or renamed?)")
            continue
        lines, limit = sizes[name]
        if lines <= limit:
            wrong.append(f"{name}: {lines} lines, within the rule ({limit}) now: take it off the list")
        elif lines > ceiling:
            wrong.append(f"{name}: {lines} lines, over the ceiling the doc gives it ({ceiling})")
    assert not wrong, "docs/architecture.md's size rule section is out of date:\n" + "\n".join(wrong)


def _module_name(file: Path, root: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(package_dir: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, wherever the import stands (a lazy
    import in a function counts), except under ``if TYPE_CHECKING:``: an import for annotations only
    never runs, and the two modules may name each other's types."""
    files = {_module_name(file, package_dir.parent): file for file in package_dir.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, file in files.items():
        package = module if file.name == "__init__.py" else module.rpartition(".")[0]
        imported: set[str] = set()

        def visit(node: ast.AST, package: str = package, imported: set[str] = imported) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for statement in child.orelse:
                        visit(statement)
                    continue
                if isinstance(child, ast.Import):
                    imported.update(alias.name for alias in child.names if alias.name in files)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                    else:
                        base = child.module or ""
                    for alias in child.names:
                        if f"{base}.{alias.name}" in files:
                            imported.add(f"{base}.{alias.name}")
                        elif base in files:
                            imported.add(base)
                visit(child)

        visit(ast.parse(file.read_text(encoding="utf-8")))
        imported.discard(module)
        graph[module] = imported
    return graph


def test_the_import_graph_counts_lazy_imports_and_not_type_only_ones(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("def f():\n    from .one import x\n")
    (package / "sub" / "one.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import two\nx = 1\n")
    (package / "sub" / "two.py").write_text("from ..sub.one import x\nimport pkg.sub\n")
    graph = import_graph(package)
    assert graph["pkg.sub"] == {"pkg.sub.one"}
    assert graph["pkg.sub.one"] == set()
    assert graph["pkg.sub.two"] == {"pkg.sub.one", "pkg.sub"}


def test_no_import_circles() -> None:
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(
            "An import circle in daytona_kernel (an import under `if TYPE_CHECKING:` does not count): " + " -> ".join(exc.args[1])
        ) from None
