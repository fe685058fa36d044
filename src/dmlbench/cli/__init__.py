"""The ``dmlbench`` command. Thin: parses arguments, loads configs and calls the library.

The CLI library (typer) handles usage errors itself: the usage hint, one error line, exit code 2.
Errors a user causes inside a command (``UserInputError``, a path that cannot be written) end as one
line on stderr and exit code 2. A full disk, an exceeded quota or an I/O error is no mistake of the
input: one line naming the path, exit code 1, and the same command continues the work. A stop signal
ends a run cleanly, marked ``interrupted``: exit 130 for SIGINT (Ctrl-C), 143 for SIGTERM (the
schedulers' stop). Command modules import the library (torch above all) only inside their
functions, so ``--help`` and usage errors answer at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from typing import Annotated, Any, Optional

import typer
import typer.core

from dmlbench import __version__, plugins
from dmlbench.cli.common import COMMAND_STARTED, PLUGIN_HELP, PLUGIN_SPECS, process_started
from dmlbench.download import OFFLINE_VARIABLE
from dmlbench.errors import PluginFailed, RunInterrupted, StorageFailed, UserInputError
from dmlbench.files import describe, install_stop_handlers, received_signal, storage_error

OFFLINE_HELP = (f"Download nothing (also {OFFLINE_VARIABLE}=1): a missing dataset file or pretrained weight "
                "file is an error that names the file to place by hand. Every command accepts it.")


class _Group(typer.core.TyperGroup):
    """The command group: a stop signal that reaches it outside a run still ends as an interruption
    (the CLI library would print "Aborted!" and exit 1)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise RunInterrupted("stopped before the command finished; run the same command again") from None


app = typer.Typer(
    cls=_Group,
    name="dmlbench",
    help="Train and fairly compare deep metric learning methods.\n\nEvery command also takes --plugin "
         "MODULE_OR_FILE (repeatable): code that registers your own losses, miners, samplers, trunks or "
         "datasets (docs/your-method.md), --offline (download nothing: datasets and pretrained weights must be "
         "in place; the message names the file) and -q/--quiet (no progress output).\n\nExit codes: 0 done, 1 the "
         "work failed (the reason on stderr), 2 bad input (one line on stderr), 130 interrupted by Ctrl-C, 143 "
         "by SIGTERM (the same command continues the work).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dmlbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version)
    ] = False,
    # Listed for --help only: main() takes every --plugin out of the arguments before they are parsed.
    plugin: Annotated[
        Optional[list[str]], typer.Option("--plugin", metavar="MODULE_OR_FILE", help=PLUGIN_HELP, show_default=False)
    ] = None,
    # Listed for --help only, like --plugin: main() takes it out and sets DMLBENCH_OFFLINE for the command.
    offline: Annotated[bool, typer.Option("--offline", help=OFFLINE_HELP)] = False,
) -> None:
    """Train and fairly compare deep metric learning methods."""


def _register_commands() -> None:
    """Add every command to ``app``, once per process: ``main`` called again from Python (a notebook,
    the tests) would otherwise append them again, and the CLI library rebuilds every registered
    command's parameters on each call, so each call grew slower than the one before."""
    if app.registered_commands or app.registered_groups:
        return
    from dmlbench.cli import benchmark, calibrate, catalog, data, deploy, evaluate, report, status, toy, train

    for module in (data, train, evaluate, calibrate, benchmark, report, status, toy, deploy, catalog):
        module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and of ``python -m dmlbench``."""
    # A console script's process runs this one command, so its start counts; a call from Python starts now.
    started = process_started() if argv is None else time.monotonic()
    _prefer_passive_waits()
    _register_commands()
    # The format, not the display: whoever records warnings (pytest, a caller) still receives them.
    previous_format, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    restore_handlers = install_stop_handlers()
    previous_offline = os.environ.get(OFFLINE_VARIABLE)
    try:
        argv, specs = _take_plugins(list(sys.argv[1:] if argv is None else argv))
        argv = _take_offline(argv)
        # The command imports them (and installed packages' plugins, so that every command, `list`
        # included, sees the same components) once its arguments parsed: `--help` answers at once.
        app(args=argv, prog_name="dmlbench", obj={PLUGIN_SPECS: specs, COMMAND_STARTED: started})
    except UserInputError as error:
        _fail(f"error: {error.as_options()}", 2)
    except (StorageFailed, PluginFailed) as error:
        _fail(f"error: {error}", 1)
    except RunInterrupted as error:
        signum = received_signal()
        _fail(f"interrupted ({signal.Signals(signum).name}): {error}", 128 + signum)
    except Exception as error:
        full = storage_error(error)
        if full is not None:
            # The disk, not the input: nothing was stored as a failure; the same command continues.
            _fail(f"error: {describe(full)}; free space (or fix the device) and run the same command again "
                  "to continue", 1)
        if not isinstance(error, OSError):
            raise
        # A path the user named could not be read or written (a read-only directory, a file where a
        # directory should be): one line naming it, not a traceback.
        where = f": {error.filename}" if error.filename else ""
        _fail(f"error: {error.strerror or error}{where}", 2)
    finally:
        _restore_variable(OFFLINE_VARIABLE, previous_offline)
        restore_handlers()
        warnings.formatwarning = previous_format
        plugins.forget_command_line()


def _prefer_passive_waits() -> None:
    """OpenMP threads that wait by spinning take the cores from any other job on the machine: beside
    another two-thread torch process a training step took 5x as long as with sleeping waits
    (``benchmarks/oversubscription.py``), which cost about a tenth on a quiet machine. So commands
    wait passively unless the user sets ``OMP_WAIT_POLICY``; it must be set before torch loads its
    OpenMP runtime, and the workers of ``--jobs`` inherit it. Results are the same either way."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _take_plugins(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--plugin MODULE_OR_FILE`` (repeatable, before or after the command's name) taken out of
    ``argv``: every command accepts it, and the plugins are imported before the command parses its
    config. Arguments after ``--`` are left alone."""
    rest: list[str] = []
    specs: list[str] = []
    position = 0
    while position < len(argv):
        argument = argv[position]
        if argument == "--":
            rest += argv[position:]
            break
        if argument == "--plugin":
            if position + 1 >= len(argv):
                raise UserInputError("--plugin needs a module name or a .py file")
            specs.append(argv[position + 1])
            position += 2
            continue
        if argument.startswith("--plugin="):
            specs.append(argument.split("=", 1)[1])
        else:
            rest.append(argument)
        position += 1
    return rest, specs


def _take_offline(argv: list[str]) -> list[str]:
    """``argv`` without ``--offline`` (before or after the command's name, not after ``--``); when
    present, ``DMLBENCH_OFFLINE=1`` for this command and the worker processes it starts."""
    end = argv.index("--") if "--" in argv else len(argv)
    if "--offline" not in argv[:end]:
        return argv
    os.environ[OFFLINE_VARIABLE] = "1"
    return [argument for argument in argv[:end] if argument != "--offline"] + argv[end:]


def _restore_variable(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
    """A warning as the user reads it: one line, without Python's source line."""
    return f"dmlbench: warning: {message}\n"


def _fail(message: str, code: int) -> None:
    print(f"dmlbench: {message}", file=sys.stderr)
    sys.exit(code)
