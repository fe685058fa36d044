"""Your own components beside the built-in ones: plugins that register losses, miners, samplers,
trunks, datasets and metrics.

A plugin is a Python module (``my_package.dml``) or a ``.py`` file, named in a config's
``plugins:`` list, with ``--plugin`` on any command, or installed under the entry-point group
``dmlbench.plugins``. Importing it runs its ``@dmlbench.register_loss("name")`` (and so on)
decorators; from then on its components are built from their names like the built-in ones. Each
plugin is recorded (module, file, installed version, sha256 of its source) in every run's
``run.json`` and in ``benchmark.json``, and a benchmark's config hash covers the source hashes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dmlbench.errors import UserInputError

if TYPE_CHECKING:  # importing data at module level would import torch with every command
    from dmlbench.data.base import DatasetSource

ENTRY_POINT_GROUP = "dmlbench.plugins"


@dataclass(frozen=True)
class Plugin:
    """One imported plugin, as the records name it."""

    plugin: str  # as given: a module name, a file path, or ``entry-point:NAME``
    module: str
    path: str | None
    version: str | None
    sha256: str | None

    def record(self) -> dict[str, Any]:
        return asdict(self)


_LOADED: dict[str, Plugin] = {}
_COMMAND_LINE: list[str] = []
_installed_loaded = False


def load(specs: Iterable[str], base: Path | None = None) -> list[Plugin]:
    """Import each plugin once (a module name, or a ``.py`` path relative to ``base``, default the
    working directory); a one-line ``UserInputError`` naming the plugin if one cannot be imported."""
    load_installed()
    return [_load_one(str(spec), base) for spec in specs]


def load_from_command_line(specs: Iterable[str]) -> None:
    """``--plugin`` arguments: imported like the others, and remembered for the command that continues the work."""
    specs = list(specs)
    load(specs)
    _COMMAND_LINE.extend(spec for spec in specs if spec not in _COMMAND_LINE)


def command_line() -> list[str]:
    """The ``--plugin`` arguments this command was given."""
    return list(_COMMAND_LINE)


def forget_command_line() -> None:
    """The command ended: its ``--plugin`` arguments stay imported but are no longer this process's
    (a caller that runs commands in one process, a test or a notebook, must not record them in the
    next command's runs)."""
    _COMMAND_LINE.clear()


def load_installed() -> None:
    """Import the plugins of installed packages (entry-point group ``dmlbench.plugins``), once."""
    global _installed_loaded
    if _installed_loaded:
        return
    _installed_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"entry-point:{entry.name}"
        if key in _LOADED:
            continue
        try:
            loaded = entry.load()
        except Exception as error:
            raise UserInputError(f"plugin {key} ({entry.value}) cannot be imported: {_reason(error)}") from None
        module = sys.modules.get(entry.module)
        if callable(loaded) and not isinstance(loaded, type(sys)):
            loaded()  # an entry point may name a function that registers the components
        version = entry.dist.version if entry.dist is not None else None
        _LOADED[key] = Plugin(key, entry.module, _module_file(module), version, _module_hash(module))


def loaded() -> list[Plugin]:
    """Every plugin imported in this process, in the order of import."""
    return list(_LOADED.values())


def used(specs: Iterable[str]) -> list[dict[str, Any]]:
    """The records of the plugins a run or a benchmark uses (``run.json`` and ``benchmark.json``):
    those its config names (``specs``), the command line's and the installed ones, in the order of
    import; not whatever else this process imported (another benchmark's, a notebook's)."""
    chosen = {id(plugin) for plugin in load([*specs, *_COMMAND_LINE])}
    chosen.update(id(plugin) for key, plugin in _LOADED.items() if key.startswith("entry-point:"))
    return [plugin.record() for plugin in _LOADED.values() if id(plugin) in chosen]


def identity(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a benchmark's config hash covers: each plugin's name (a file's name, not its path, so
    that workers on other machines agree) and source hash."""
    return [{"plugin": _display_name(entry), "sha256": entry.get("sha256")} for entry in entries]


def load_recorded(entries: Iterable[dict[str, Any]], owner: str) -> None:
    """Import the plugins a finished run recorded (``run.json``), so that the commands that open it
    (evaluate, embed, export, calibrate, query) need no ``--plugin`` again. ``owner`` names the run
    in the messages. A plugin already imported under the same name (``--plugin`` with the file's new
    place) stands in for the recorded one. A source that differs from the record is one warning line
    naming it; a recorded file that is gone is a ``UserInputError`` naming it and ``--plugin``."""
    load_installed()
    for entry in entries:
        name = _display_name(entry)
        plugin = _imported_as(name) or _import_recorded(entry, owner)
        recorded = entry.get("sha256")
        if recorded and plugin.sha256 != recorded:
            warnings.warn(f"plugin {plugin.path or plugin.plugin} changed since {owner} was trained (sha256 "
                          f"{str(recorded)[:12]} -> {str(plugin.sha256)[:12]}); its results may not reproduce",
                          stacklevel=2)


def _imported_as(name: str) -> Plugin | None:
    """The imported plugin that ``identity`` would name ``name`` (a file's name, a module, an entry point)."""
    return next((plugin for plugin in _LOADED.values() if _display_name(plugin.record()) == name), None)


def _import_recorded(entry: dict[str, Any], owner: str) -> Plugin:
    spec = str(entry["plugin"])
    if spec.startswith("entry-point:"):
        raise UserInputError(f"{owner} was trained with the installed plugin {spec} (module {entry.get('module')}), "
                             f"which is no longer installed: install it again, or give it with --plugin MODULE_OR_FILE")
    if str(entry.get("module", "")).startswith("dmlbench_plugin_") and entry.get("path"):
        path = Path(str(entry["path"]))
        if not path.is_file():
            raise UserInputError(f"{owner} was trained with the plugin file {path}, which no longer exists: "
                                 f"give it with --plugin FILE")
        return _load_one(str(path), None)
    try:
        return _load_one(spec, None)
    except UserInputError as error:
        raise UserInputError(f"{owner} was trained with the plugin {spec}: {error}; give it with --plugin "
                             f"MODULE_OR_FILE") from None


def _display_name(entry: dict[str, Any]) -> str:
    if str(entry.get("module", "")).startswith("dmlbench_plugin_") and entry.get("path"):
        return Path(str(entry["path"])).name
    return str(entry["plugin"]) if str(entry["plugin"]).startswith("entry-point:") else str(entry["module"])


def _load_one(spec: str, base: Path | None) -> Plugin:
    is_file = spec.endswith(".py") or "/" in spec or "\\" in spec
    key = str(((base or Path.cwd()) / spec).resolve()) if is_file else spec
    if key in _LOADED:
        return _LOADED[key]
    if is_file:
        path = Path(key)
        if not path.is_file():
            raise UserInputError(f"plugin {spec}: no such file {path}")
        name = f"dmlbench_plugin_{path.stem}_{hashlib.sha256(key.encode()).hexdigest()[:8]}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up here
        try:
            module_spec.loader.exec_module(module)
        except UserInputError as error:
            del sys.modules[name]
            raise UserInputError(f"plugin {spec}: {error}") from None
        except Exception as error:
            del sys.modules[name]
            raise UserInputError(f"plugin {spec} cannot be imported: {_reason(error)}") from None
    else:
        try:
            module = importlib.import_module(spec)
        except UserInputError as error:
            raise UserInputError(f"plugin {spec}: {error}") from None
        except Exception as error:
            raise UserInputError(f"plugin {spec} cannot be imported: {_reason(error)}") from None
    plugin = Plugin(spec, module.__name__, _module_file(module), _version(module.__name__), _module_hash(module))
    _LOADED[key] = plugin
    return plugin


def failure(error: BaseException) -> str | None:
    """One line for an exception raised in a plugin's code: the plugin, the exception (type and the
    first line of its message) and the deepest frame of its traceback in the plugin's source
    (``file:line in function``); ``None`` when no frame is a plugin's (an error of dmlbench itself)."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        plugin = _owner(frame.filename)
        if plugin is not None:
            return f"plugin {plugin.plugin} raised {_reason(error)} (at {frame.filename}:{frame.lineno} in {frame.name})"
    return None


def _owner(filename: str) -> Plugin | None:
    """The imported plugin whose source holds ``filename``: its file, or a file of its package."""
    path = Path(filename).resolve()
    for plugin in _LOADED.values():
        if plugin.path is None:
            continue
        source = Path(plugin.path)
        if path == source or (source.name == "__init__.py" and source.parent in path.parents):
            return plugin
    return None


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _module_file(module: Any) -> str | None:
    file = getattr(module, "__file__", None)
    return str(Path(file).resolve()) if file else None


def _module_hash(module: Any) -> str | None:
    """sha256 of the plugin's source: its file, or every ``.py`` file of its package in path order."""
    file = _module_file(module)
    if file is None:
        return None
    path = Path(file)
    sources = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for source in sources:
        digest.update(str(source.relative_to(path.parent)).encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


def _version(module_name: str) -> str | None:
    """The installed distribution's version, for a plugin that comes from an installed package."""
    top = module_name.split(".")[0]
    for distribution in metadata.packages_distributions().get(top, []):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def changed(recorded: Iterable[dict[str, Any]], current: Iterable[dict[str, Any]]) -> list[str]:
    """One line per plugin whose source differs from the record (or that is missing or new)."""
    before = {entry["plugin"]: entry for entry in recorded}
    now = {entry["plugin"]: entry for entry in current}
    lines = []
    for name in sorted(before.keys() | now.keys()):
        old, new = before.get(name), now.get(name)
        if old is None:
            lines.append(f"plugin {name} was not used when the benchmark started")
        elif new is None:
            lines.append(f"plugin {name} is no longer loaded")
        elif old.get("sha256") != new.get("sha256"):
            lines.append(f"plugin {name} changed since the benchmark started "
                         f"(sha256 {str(old.get('sha256'))[:12]} -> {str(new.get('sha256'))[:12]})")
    return lines


def _registrar(kind: str) -> Callable[..., Callable[[Callable[..., Any]], Callable[..., Any]]]:
    def register(name: str, *aliases: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        from dmlbench.losses.base import LOSSES
        from dmlbench.mining.base import MINERS
        from dmlbench.models.trunks import TRUNKS
        from dmlbench.sampling.base import SAMPLERS

        registry = {"loss": LOSSES, "miner": MINERS, "sampler": SAMPLERS, "trunk": TRUNKS}[kind]
        return registry.register(name, *aliases)

    register.__doc__ = (f"Decorator: register a {kind} constructor under ``name`` (and ``aliases``), built from "
                        f"configs like the built-in ones.")
    register.__name__ = f"register_{kind}"
    return register


register_loss = _registrar("loss")
register_miner = _registrar("miner")
register_sampler = _registrar("sampler")
register_trunk = _registrar("trunk")


def register_dataset(name: str, *aliases: str, source: DatasetSource | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register a dataset constructor under ``name`` (and ``aliases``), built from configs like the
    built-in ones; ``source`` (a ``dmlbench.data.DatasetSource``) says how it is read and fetched (default: made
    in memory, without ``data.root``)."""
    from dmlbench.data.base import MEMORY
    from dmlbench.data.base import register_dataset as register

    return register(name, source or MEMORY, *aliases)


def register_metric(
    name: str, *, title: str | None = None, neighbours: int | Callable[..., int] | None = None,
    higher_is_better: bool = True, clustering: bool = False,
) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Decorator: register a metric function under ``name``, computed by ``evaluate`` and by every run's
    validation and test when a config's ``evaluation.metrics`` names it (arguments:
    ``evaluation.metrics.MetricRegistry.register``)."""
    from dmlbench.evaluation.metrics import METRICS

    return METRICS.register(name, title=title, neighbours=neighbours, higher_is_better=higher_is_better,
                            clustering=clustering)
