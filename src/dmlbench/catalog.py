"""What is there to build: every registered component with its hyper-parameters, defaults and the
paper its docstring cites, plugins included (``dmlbench list``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

KINDS = ("losses", "miners", "samplers", "trunks", "datasets", "metrics")
# Set by the run, never by a config (``config.check_component_names`` refuses them there).
RUN_SET = {"self", "num_classes", "embedding_dim", "seed", "generator", "p_switch", "labels", "batch_size", "rank",
           "world_size", "pooling", "pretrained", "model_name"}
PREFIXES = {"losses": "pml:<ClassName> (any pytorch-metric-learning loss, extra 'pml')",
            "miners": "pml:<ClassName> (any pytorch-metric-learning miner, extra 'pml')",
            "trunks": "timm/<model> (any timm model, extra 'timm')"}


def components(kind: str) -> list[dict[str, Any]]:
    """One entry per component of ``kind`` (one of ``KINDS``): ``name``, ``aliases``, ``summary``
    (the docstring's first line), ``parameters`` (name -> default, ``None`` when required),
    ``required`` (the parameters without a default, and a file dataset's ``root``, which ``data.root``
    sets: told apart from a default of ``None``, which means the component chooses, e.g. emoji's
    ``vendors``: every vendor found) and ``source`` (``dmlbench`` or the plugin's module)."""
    if kind == "metrics":
        return _metrics()
    registry = _registry(kind)
    by_constructor: dict[int, dict[str, Any]] = {}
    for name, constructor in registry.items():
        entry = by_constructor.get(id(constructor))
        if entry is not None:
            entry["aliases"].append(name)
            continue
        by_constructor[id(constructor)] = {
            "name": name, "aliases": [], "summary": _summary(constructor), "parameters": _parameters(constructor),
            "required": _required(constructor, reads_root=kind == "datasets"), "source": _source(constructor),
        }
    return sorted(by_constructor.values(), key=lambda entry: entry["name"])


def _metrics() -> list[dict[str, Any]]:
    """The metric registry in its order (built-in first); a family such as ``recall_at_<k>`` as one entry."""
    from dmlbench.evaluation.metrics import METRICS

    entries = []
    for name in METRICS.listing():
        metric = METRICS.entry(name)
        summary = METRICS.family_summary(name) if metric is None else metric.summary
        source = "dmlbench" if metric is None else _source(metric.compute)
        entries.append({"name": name, "aliases": [], "summary": summary, "parameters": {}, "required": [], "source": source})
    return entries


def prefix_note(kind: str) -> str | None:
    """Names a bridge resolves rather than the registry lists."""
    return PREFIXES.get(kind)


def _registry(kind: str) -> Any:
    from dmlbench import data, losses, mining, sampling
    from dmlbench.models.trunks import TRUNKS

    return {"losses": losses.LOSSES, "miners": mining.MINERS, "samplers": sampling.SAMPLERS, "trunks": TRUNKS,
            "datasets": data.DATASETS}[kind]


def _summary(constructor: Callable[..., Any]) -> str:
    doc = inspect.getdoc(constructor) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _settable(constructor: Callable[..., Any]) -> list[inspect.Parameter]:
    """The constructor's parameters a config sets (not those the run sets, not ``*args``/``**kwargs``)."""
    return [parameter for parameter in inspect.signature(constructor).parameters.values()
            if parameter.name not in RUN_SET
            and parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]


def _parameters(constructor: Callable[..., Any]) -> dict[str, Any]:
    return {parameter.name: None if parameter.default is inspect.Parameter.empty else _plain(parameter.default)
            for parameter in _settable(constructor)}


def _required(constructor: Callable[..., Any], *, reads_root: bool = False) -> list[str]:
    """The parameters without a default; with ``reads_root`` also ``root``, whose ``None`` default only
    lets ``data.root`` arrive by keyword: a dataset that reads files refuses to build without it."""
    return [parameter.name for parameter in _settable(constructor)
            if parameter.default is inspect.Parameter.empty or (reads_root and parameter.name == "root")]


def _plain(value: Any) -> Any:
    """A default as JSON can hold it (anything else by its repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return repr(value)


def _source(constructor: Callable[..., Any]) -> str:
    """``dmlbench``, or the plugin as its records name it (a file's name, a module)."""
    from dmlbench import plugins

    module = getattr(constructor, "__module__", "") or ""
    if module.split(".")[0] == "dmlbench":
        return "dmlbench"
    for plugin in plugins.loaded():
        if plugin.module == module:
            return plugins.identity([plugin.record()])[0]["plugin"]
    return module
