"""``dmlbench data check``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import Command
from dmlbench.errors import UserInputError

data_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")


@data_app.command("check", cls=Command)
def check_command(
    source: Annotated[str, typer.Argument(metavar="DATASET|CONFIG", help="A dataset name (e.g. glyphs) or a run config (YAML), which checks exactly the data and splits that config trains on.", show_default=False)],
    options: Annotated[Optional[list[str]], typer.Argument(metavar="OPTIONS", help="Dataset options KEY=VALUE (e.g. image_size=24), or with a CONFIG, dotted overrides (e.g. data.options.max_classes=40).", show_default=False)] = None,
    validation_fraction: Annotated[Optional[float], typer.Option(help="Share of training classes held out for validation (default 0.2, or the config's).", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the validation split (default 0, or the config's).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Class counts, split sizes, broken items, leakage between splits and the content hash."""
    from dmlbench import config as config_module
    from dmlbench import data as data_module
    from dmlbench.data.check import format_summary, summarize

    if source.endswith((".yaml", ".yml")) or Path(source).is_file():
        config = config_module.load(Path(source), options)
        dataset_name, dataset_options = config.data.name, config.data.options
        fraction = config.data.validation_fraction if validation_fraction is None else validation_fraction
        split_seed = config.seed if seed is None else seed
    else:
        dataset_name, dataset_options = source, {}
        for option in options or []:
            path, value = config_module.parse_override(option)
            if len(path) != 1:
                raise UserInputError(f"dataset option {option!r} must be key=value")
            dataset_options[path[0]] = value
        fraction = 0.2 if validation_fraction is None else validation_fraction
        split_seed = 0 if seed is None else seed
    dataset = data_module.build(dataset_name, **dataset_options)
    summary = summarize(dataset, validation_fraction=fraction, seed=split_seed)
    typer.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))
