"""The layout rules of docs/architecture.md, checked on the source: no import cycle (function-level
imports included), packages in one direction and protocol/'s rooms too, no function over 80 lines, no
module state in training/ or protocol/."""

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


def test_training_and_the_protocol_keep_no_state_in_their_modules() -> None:
    """Where a worker trains (device, threads) is a ``training.placement.Placement`` passed along, not a
    module global that one worker sets and the next caller in the process inherits."""
    rooms = ("training", "protocol")
    found = [f"{path.relative_to(PACKAGE)}:{node.lineno} global {', '.join(node.names)}"
             for name, path in MODULES.items() if name.split(".")[1:2] and name.split(".")[1] in rooms
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Global)]
    assert found == []


# The rooms of protocol/, lowest first: each imports only rooms before it (and protocol.layout).
PROTOCOL_ROOMS = ("queue", "design", "units", "run", "dry_run", "inspection")


def test_the_rooms_of_the_protocol_import_downwards_only() -> None:
    upward = []
    for name, path in MODULES.items():
        parts = name.split(".")
        if parts[1:2] != ["protocol"] or len(parts) < 4:
            continue
        room = PROTOCOL_ROOMS.index(parts[2])
        for imported in imported_modules(path):
            other = imported.split(".")
            if other[1:2] == ["protocol"] and len(other) >= 4 and PROTOCOL_ROOMS.index(other[2]) > room:
                upward.append(f"{name} -> {imported}")
    assert upward == []


def test_no_function_is_longer_than_80_lines() -> None:
    long = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION]
    assert long == []


def step_calls() -> list[tuple[str, str, str, list[str]]]:
    """Every ``X.step(...)`` call of the package: its module, the innermost function around it, ``X``
    and the arguments, as source text."""
    found = []

    def visit(node: ast.AST, module: str, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "step":
                found.append((module, inner, ast.unparse(child.func.value), [ast.unparse(arg) for arg in child.args]))
            visit(child, module, inner)

    for name, path in MODULES.items():
        visit(ast.parse(path.read_text()), name, "<module>")
    return found


def calls_of(function: str) -> set[str]:
    """The modules that call ``function`` by name."""
    return {name for name, path in MODULES.items() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function}


def test_one_place_steps_an_optimiser() -> None:
    """An optimiser is stepped (through the gradient scaler) in ``training.step.apply_gradients``
    alone: the training loop (image batches and cached features), the dry run's timing (through
    that loop) and the toy's own loop all go through it. An optimiser step is a ``.step`` call on,
    or given, something named an optimiser or a scaler; a protocol unit's ``step()`` is none."""
    def names_an_optimiser(text: str) -> bool:
        return "optim" in text.lower() or "scaler" in text.lower()

    optimiser_steps = [(module, function) for module, function, receiver, arguments in step_calls()
                       if names_an_optimiser(receiver) or any(map(names_an_optimiser, arguments))]
    assert optimiser_steps == [("dmlbench.training.step", "apply_gradients")]
    assert calls_of("apply_gradients") == {"dmlbench.training.loop", "dmlbench.toy.experiment"}


# The modules that own the names of a benchmark's files and folders and of a run directory's files.
NAME_OWNERS = ("dmlbench.protocol.layout", "dmlbench.training.records")
# The run-directory names the layout builds from a number: ``fold_K``, ``trial_SSSS``, ``reproduction_RR``.
RUN_DIRECTORY_PREFIXES = ("fold_", "trial_", "reproduction_")


def owned_file_names() -> set[str]:
    """Every file name the owners define: their module-level string constants that name a file (a dot in them:
    ``benchmark.json``, ``run.lock``, ``.work-lock``). Folder names that are plain words (``trunks``,
    ``features``, ``tensorboard``) are left out, since the same words name other things."""
    names = set()
    for module in NAME_OWNERS:
        tree = ast.parse(MODULES[module].read_text())
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and "." in node.value.value):
                names.add(node.value.value)
    return names


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def spelled_names(path: Path, names: set[str]) -> list[str]:
    """Where ``path`` spells an owned name: a string constant (an f-string's literal parts included) that
    holds one of ``names`` as a whole name, or a run directory's prefix followed by a number or a glob."""
    import re

    tree = ast.parse(path.read_text())
    skipped = docstrings(tree)
    pattern = re.compile("|".join(rf"(?<![\w.-]){re.escape(name)}(?![\w-])" for name in sorted(names)))
    prefixes = tuple(RUN_DIRECTORY_PREFIXES)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for part, following in zip(parts, [*parts[1:], None]):
                if (isinstance(part, ast.Constant) and isinstance(following, ast.FormattedValue)
                        and part.value.endswith(prefixes)):
                    found.append(f"{path.relative_to(PACKAGE)}:{part.lineno} {part.value!r}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            text = node.value
            if pattern.search(text) or any(f"{prefix}*" in text or f"{prefix}{{" in text for prefix in prefixes):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text[:60]!r}")
    return found


def test_only_layout_and_records_spell_the_names_of_a_benchmarks_and_a_runs_files() -> None:
    """docs/architecture.md: ``protocol.layout`` names every file and folder of a benchmark directory and
    ``training.records`` every file of a run directory; everyone else uses their constants and helpers.

    The rule, on the AST of every module of src/dmlbench but those two: no string constant holds an
    owned file name (one of the owners' module-level constants with a dot in it, matched as a whole
    name, so ``results.csv`` but not ``my_results.csv``), and no f-string puts a number after a run
    directory's prefix (``f"fold_{k}"``) nor a glob holds one (``"*/fold_*"``). Docstrings may name the
    files, and so may messages, as long as they build the name from the constant (``f"no {RUN_FILE}"``).
    Comments are not string constants, so they may too."""
    names = owned_file_names()
    assert {"benchmark.json", "results.csv", "runs.csv", "report.md", "report.html", "run.json", "config.yaml",
            "metrics.jsonl", "checkpoint_best.pt", "error.log", "benchmark.lock", "study.journal"} <= names
    spelled = [line for module, path in sorted(MODULES.items()) if module not in NAME_OWNERS
               for line in spelled_names(path, names)]
    assert spelled == []


def _message_start(call: ast.Call) -> str:
    """The literal text an error message starts with (an f-string's first literal part)."""
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    if isinstance(first, ast.JoinedStr) and first.values and isinstance(first.values[0], ast.Constant):
        return str(first.values[0].value)
    return ""


def test_library_errors_name_parameters_not_command_line_options() -> None:
    """Outside cli/, a bad value is a ``ParameterError`` naming the parameter (the CLI shows it as its
    option); an error message that starts with ``--flag`` would tie the library to one command line."""
    found = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for name, path in MODULES.items() if not name.startswith("dmlbench.cli")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
             and getattr(node.func, "id", "") in ("UserInputError", "ParameterError") and _message_start(node).startswith("--")]
    assert found == []


def test_no_module_of_training_or_protocol_fills_a_container_of_its_own() -> None:
    """Module-level state in disguise: an empty set, list or dict at module level that the process
    fills as it runs (what a worker remembers belongs to a value it passes, as ``Context`` does)."""
    empty_containers = ("set", "list", "dict")
    found = []
    for name, path in MODULES.items():
        if name.split(".")[1:2] not in (["training"], ["protocol"]):
            continue
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            empty = (isinstance(value, (ast.List, ast.Dict, ast.Set)) and not getattr(value, "elts", getattr(value, "keys", None))
                     or isinstance(value, ast.Call) and getattr(value.func, "id", "") in empty_containers and not value.args)
            if empty:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
