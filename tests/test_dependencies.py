"""Every import is a declared dependency: an undeclared one works only where it happens to be installed."""

import ast
import functools
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def distribution_names(requirements: list[str]) -> set[str]:
    return {Requirement(requirement).name.lower().replace("_", "-") for requirement in requirements}


def imported_top_level_names(path: Path) -> set[str]:
    """Absolute imports anywhere in a module (inside functions too: a lazy import is still an import)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@functools.cache
def _providers() -> dict[str, list[str]]:
    """Top-level module name -> distributions providing it. Read once: scanning every installed
    distribution takes a fifth of a second, and the runtime check asks once per source file."""
    return metadata.packages_distributions()


def undeclared_imports(paths: list[Path], declared: set[str]) -> dict[str, list[str]]:
    """Module name -> files importing it, for every import that is neither the standard library,
    dmlbench itself, nor provided by a declared distribution."""
    providers = _providers()
    found: dict[str, list[str]] = {}
    for path in paths:
        for name in imported_top_level_names(path):
            if name in sys.stdlib_module_names or name == "dmlbench" or name == "__future__":
                continue
            distributions = {distribution.lower().replace("_", "-") for distribution in providers.get(name, [])}
            if not distributions & declared:
                found.setdefault(name, []).append(path.name)
    return found


RUNTIME = distribution_names(PYPROJECT["project"]["dependencies"])
EXTRAS = set().union(*(distribution_names(group) for group in PYPROJECT["project"]["optional-dependencies"].values()))


def module_level_imports(path: Path) -> set[str]:
    """Top-level names imported outside function bodies (those run when the module is imported)."""
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(), filename=str(path))]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        pending.extend(ast.iter_child_nodes(node))
    return names


OPTIONAL = set().union(
    *(distribution_names(group) for name, group in PYPROJECT["project"]["optional-dependencies"].items() if name != "test")
)


def test_the_package_imports_only_runtime_dependencies() -> None:
    """Runtime dependencies anywhere; an optional extra's package only inside a function (the
    function tells the user which extra to install when it is missing)."""
    paths = sorted((REPO / "src" / "dmlbench").rglob("*.py"))
    assert undeclared_imports(paths, RUNTIME | OPTIONAL) == {}
    for path in paths:
        assert undeclared_imports([path], RUNTIME).keys().isdisjoint(module_level_imports(path)), path


def test_tests_and_benchmarks_import_only_declared_packages() -> None:
    # Helper modules beside the tests, and benchmark scripts that import each other.
    local = {path.stem for folder in ("tests", "benchmarks") for path in (REPO / folder).glob("*.py")}
    paths = sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "benchmarks").rglob("*.py"))
    undeclared = undeclared_imports(paths, RUNTIME | EXTRAS)
    assert {name: files for name, files in undeclared.items() if name not in local} == {}


def test_the_check_catches_an_undeclared_import(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("import os\nimport numpy\n\ndef lazy():\n    import click\n    from yaml import safe_load\n")
    assert set(undeclared_imports([module], {"numpy", "pyyaml"}).keys()) == {"click"}


@pytest.mark.parametrize("requirement", PYPROJECT["project"]["dependencies"])
def test_runtime_dependencies_have_tested_bounds(requirement: str) -> None:
    """A lower bound (tested, see README) and, unless pinned, an upper bound below the next major version."""
    specifier = Requirement(requirement).specifier
    operators = {spec.operator for spec in specifier}
    assert operators == {"=="} or {">=", "<"} <= operators, requirement
