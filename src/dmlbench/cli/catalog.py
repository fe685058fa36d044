"""``dmlbench list``: the components there are to build, with their hyper-parameters."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command
from dmlbench.errors import UserInputError


def register(app: typer.Typer) -> None:
    app.command("list", cls=Command)(list_command)


def list_command(
    kind: Annotated[Optional[str], typer.Argument(metavar="KIND", help="losses, miners, samplers, trunks, datasets or metrics (default: all).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document (for scripts) instead of the text listing.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Each component with its hyper-parameters and defaults and the paper it cites; plugins
    (--plugin, or installed ones) included.

    Exit codes: 0 listed, 2 unknown KIND, 130 interrupted by Ctrl-C, 143 by SIGTERM.
    """
    from dmlbench.catalog import KINDS, components, prefix_note

    if kind is not None and kind not in KINDS:
        raise UserInputError(f"unknown kind {kind!r}; choose one of: {', '.join(KINDS)}")
    kinds = [kind] if kind else list(KINDS)
    listing = {name: components(name) for name in kinds}
    if as_json:
        typer.echo(json.dumps(listing if kind is None else listing[kind], indent=2))
        return
    for name in kinds:
        typer.echo(f"{name}:")
        for entry in listing[name]:
            aliases = f" (also {', '.join(entry['aliases'])})" if entry["aliases"] else ""
            source = "" if entry["source"] == "dmlbench" else f" [plugin {entry['source']}]"
            typer.echo(f"  {entry['name']}{aliases}{source}: {entry['summary']}".rstrip(": "))
            if entry["parameters"]:
                typer.echo("      " + ", ".join(f"{key}={'required' if key in entry['required'] else value}"
                                                 for key, value in entry["parameters"].items()))
        note = prefix_note(name)
        if note:
            typer.echo(f"  also: {note}")
