"""``dmlbench data check``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from dmlbench import data as data_module
from dmlbench.config import parse_override
from dmlbench.errors import UserInputError

data_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")


@data_app.command("check")
def check_command(
    dataset: Annotated[str, typer.Argument(help="Dataset name, e.g. glyphs.")],
    options: Annotated[Optional[list[str]], typer.Argument(metavar="[OPTIONS]...", help="Dataset options, e.g. image_size=24.")] = None,
    validation_fraction: Annotated[float, typer.Option(help="Share of training classes held out for validation.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the validation split.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Class counts, split sizes, broken items, leakage between splits and the content hash."""
    from dmlbench.data.check import format_summary, summarize

    parsed = {}
    for option in options or []:
        path, value = parse_override(option)
        if len(path) != 1:
            raise UserInputError(f"dataset option {option!r} must be key=value")
        parsed[path[0]] = value
    dataset_object = data_module.build(dataset, **parsed)
    summary = summarize(dataset_object, validation_fraction=validation_fraction, seed=seed)
    typer.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))
