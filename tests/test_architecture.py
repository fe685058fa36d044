"""The layout rules of docs/architecture.md, checked on the source: no import cycle (function-level
imports included), packages in one direction, no function over 80 lines."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "dmlbench"
LONGEST_FUNCTION = 80


def module_name(path: Path) -> str:
    parts = ("dmlbench", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The dmlbench modules ``path`` imports anywhere; ``from package import submodule`` names the submodule."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("dmlbench"):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES.keys()
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in MODULES}
    return found & MODULES.keys()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back() -> None:
    graph = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
    assert cycles(graph) == []


def test_packages_depend_in_one_direction() -> None:
    """Between the top-level packages and modules, too: protocol never imports report, the
    components never import training or the protocol."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        top = name.split(".")[1] if "." in name else name
        graph.setdefault(top, set()).update(
            target.split(".")[1] for target in imported_modules(path) if "." in target and target.split(".")[1] != top)
    assert cycles(graph) == []
    assert "report" not in graph["protocol"]
    for component in ("data", "sampling", "models", "mining", "losses", "evaluation"):
        assert not graph[component] & {"training", "protocol", "report", "cli", "deploy"}, component


def test_no_function_is_longer_than_80_lines() -> None:
    long = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION]
    assert long == []
