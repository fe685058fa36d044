"""What every command shares: ``CONFIG [OVERRIDES]...``, the help layout, plugins loaded once the
arguments parsed, and the cheap checks of paths that run before any heavy import (torch)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer.core

from dmlbench.errors import UserInputError

# The CLI library's usage-error class (click's ``UsageError``, vendored by newer typer releases):
# reached through the public ``typer.BadParameter`` so that both layouts work.
USAGE_ERROR: type[Exception] = typer.BadParameter.__bases__[0]

CONFIG_HELP = "YAML config file."
QUIET_HELP = "No progress output."
# Commands that show no progress accept -q too, so that a script can pass it to every command.
QUIET_SILENT_HELP = "No progress output (this command shows none)."
# main() takes --plugin out of the arguments (it may come before or after the command's name) and
# hands the specs on in the context object; Command imports them once the arguments parsed.
PLUGIN_SPECS = "dmlbench.plugin_specs"
# ... and when the command started (``process_started`` for the console script, the call otherwise),
# which ``benchmark --dry-run`` counts in its estimate.
COMMAND_STARTED = "dmlbench.command_started"
PLUGIN_OPTION = "--plugin MODULE_OR_FILE"
PLUGIN_HELP = ("Import your own losses, miners, samplers, trunks or datasets from this module or .py file first "
               "(repeatable; docs/your-method.md).")

OVERRIDES_HELP = "Dotted overrides KEY=VALUE, e.g. training.epochs=3 loss.name=contrastive."


def config_and_overrides(config_path: Path | None, overrides: list[str] | None) -> tuple[Path | None, list[str]]:
    """``CONFIG`` is optional: a first argument that looks like ``key=value`` and is no file is an override."""
    overrides = list(overrides or [])
    if config_path is not None and "=" in config_path.name and not config_path.exists():
        return None, [str(config_path), *overrides]
    return config_path, overrides


class Command(typer.core.TyperCommand):
    """A command whose parse errors all print its usage hint: the parser raises some (an option
    missing its value) without the command's context, and those would print the error line alone."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except USAGE_ERROR as error:
            if getattr(error, "ctx", None) is None:
                error.ctx = ctx  # type: ignore[attr-defined]
                error.cmd = ctx.command  # type: ignore[attr-defined]
            raise

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # An option declared without a placeholder gets its name in capitals (--seed SEED), not the
        # CLI library's type (<int>, INTEGER: it differs between releases).
        for param in self.params:
            if param.param_type_name == "option" and param.metavar is None and not (param.is_flag or param.count):
                param.metavar = str(param.name).upper()

    def invoke(self, ctx: Any) -> Any:
        """Plugins are imported here, after parsing: ``--help`` and usage errors answer without them."""
        from dmlbench import plugins

        specs = ctx.obj.get(PLUGIN_SPECS, []) if isinstance(ctx.obj, dict) else []
        plugins.load_from_command_line(specs)
        return super().invoke(ctx)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """``[OPTIONS] CONFIG [OVERRIDES]...``: the placeholders as the help lists them, whatever the
        CLI library's release writes by default (``{CONFIG}``, ``<path>``)."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = placeholder(param) if param.required else f"[{placeholder(param)}]"
                pieces.append(name + ("..." if param.nargs == -1 else ""))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Arguments by their placeholder alone, the options with theirs, and ``--plugin`` (taken by
        ``main`` before the command parses) listed before ``--help``."""
        arguments: list[tuple[str, str]] = []
        options: list[tuple[str, str]] = []
        help_option = self.get_help_option(ctx)
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if param.param_type_name == "argument":
                text = record[1] if record else getattr(param, "help", None) or ""
                arguments.append((placeholder(param) + ("..." if param.nargs == -1 else ""), text))
                continue
            if param is help_option:
                options.append((PLUGIN_OPTION, PLUGIN_HELP))
            if record is not None:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def placeholder(param: Any) -> str:
    """An argument's placeholder: its ``metavar`` (``CONFIG``, ``DIR``, ``RUN``), else its name in capitals."""
    return str(param.metavar or param.name.upper())


def require_file(path: Path, what: str) -> None:
    """A one-line error unless ``path`` is a file; for the checks that must come before importing torch."""
    if path.is_dir():
        raise UserInputError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise UserInputError(f"{what} {path} does not exist")


def require_yaml(path: Path, what: str) -> None:
    """``path`` is a readable YAML file (``config.read_yaml`` says what is wrong; it imports no torch)."""
    from dmlbench import config

    config.read_yaml(path, what)


def require_directory(path: Path, what: str) -> None:
    """A one-line error unless ``path`` is a directory (``what``: "run directory", "--images")."""
    if not path.exists():
        raise UserInputError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise UserInputError(f"{what} {path} is not a directory")


def require_run_dir(run: Path) -> None:
    """The cheap part of ``training.records.require_run_dir`` (which imports torch with its package)."""
    require_directory(run, "run directory")


def require_creatable_directory(path: Path, option: str) -> None:
    """``path`` is a directory or can become one: its nearest existing ancestor is a directory."""
    if path.exists() and not path.is_dir():
        raise UserInputError(f"{option} {path} is a file, not a directory")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserInputError(f"{option} {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK):
        raise UserInputError(f"{option} {path}: {ancestor} is not writable")


def process_started() -> float:
    """``time.monotonic()`` when this process started (Linux: from ``/proc/self/stat``, to the clock's
    tick), so that the interpreter's start and the CLI's imports count; elsewhere now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()
    return time.monotonic() - max(age, 0.0)


def rerank_option(kind: str | None, params: list[str] | None) -> dict[str, Any] | None:
    """``--rerank KIND --rerank-param NAME=VALUE ...`` as ``{"kind": ..., "params": {...}}`` (values read as
    YAML), checked by ``evaluation.rerank.build``; ``None`` when not given."""
    from dmlbench.config import parse_override
    from dmlbench.evaluation.rerank import build

    if kind is None:
        if params:
            raise UserInputError("--rerank-param goes with --rerank KIND")
        return None
    values: dict[str, Any] = {}
    for text in params or []:
        path, value = parse_override(text)
        if len(path) != 1:
            raise UserInputError(f"--rerank-param {text!r} must be NAME=VALUE, e.g. k1=20")
        values[path[0]] = value
    build(kind, **values)
    return {"kind": kind, "params": values}


def checked_budget(prepared: Any, options: tuple[float | None, int | None]) -> Any:
    """The command's ``RoundBudget`` for ``prepared`` from ``--budget`` (seconds) and ``--max-searches``: refused for
    a study that is not sequential; without ``--budget``, the config's ``protocol.budget``. A new id, shared by
    the command's workers."""
    import uuid

    from dmlbench.protocol.dry_run.cost import estimate_round
    from dmlbench.protocol.run.rounds import RoundBudget
    from dmlbench.validation import duration_seconds

    seconds, max_searches = options
    protocol = prepared.spec.protocol
    given = [option for option, value in (("--budget", seconds), ("--max-searches", max_searches)) if value is not None]
    if given and not protocol.sequential:
        raise UserInputError(f"{' and '.join(given)} {'spend' if len(given) > 1 else 'spends'} a sequential study's "
                             "rounds: the config needs protocol.sequential: true (or leave the option out)")
    if seconds is None and protocol.budget is not None:
        seconds = duration_seconds(protocol.budget)
    return RoundBudget(seconds, max_searches, uuid.uuid4().hex, time.time(), estimate_round)
