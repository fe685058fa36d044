"""``dmlbench data check`` and ``dmlbench data fetch``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command, require_creatable_directory
from dmlbench.errors import UserInputError

data_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")


@data_app.command("check", cls=Command)
def check_command(
    source: Annotated[str, typer.Argument(metavar="DATASET|CONFIG", help="A dataset name (glyphs, emoji, cub200, cars196, sop, inshop, folder, csv) or a run config (YAML), which checks exactly the data and splits that config trains on.", show_default=False)],
    options: Annotated[Optional[list[str]], typer.Argument(metavar="KEY=VALUE", help="Dataset options KEY=VALUE (e.g. image_size=24), or with a CONFIG, dotted overrides (e.g. data.options.max_classes=40).", show_default=False)] = None,
    root: Annotated[Optional[str], typer.Option(metavar="PATH", help="Dataset folder of a file format or of emoji (the CSV file for csv): the same path as data.root.", show_default=False)] = None,
    validation_fraction: Annotated[Optional[float], typer.Option(metavar="FRACTION", help="Share of training classes held out for validation (default 0.2, or the config's).", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option(metavar="N", help="Seed of the validation split (default 0, or the config's).", show_default=False)] = None,
    json_path: Annotated[Optional[str], typer.Option("--json", metavar="FILE", help="Also write the report as JSON to FILE ('-': print JSON instead of text).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Classes, images per class, splits, unreadable and duplicate images, leakage between splits and the content hash.

    Exit codes: 0 no problem found, 1 problems (listed), 2 bad input, 130 interrupted by Ctrl-C,
    143 by SIGTERM.
    """
    from dmlbench import config as config_module

    target = _json_target(json_path)
    # Paths first: a missing config or data folder is reported before torch is imported.
    is_config = source.endswith((".yaml", ".yml")) or Path(source).is_file()
    if is_config:
        config_module.read_yaml(Path(source), "config file")
    if root is not None and not Path(root).exists():
        raise UserInputError(f"--root {root} does not exist")
    from dmlbench import data as data_module
    from dmlbench.data.check import format_file_summary, format_summary, summarize, summarize_files
    from dmlbench.data.files import FileDataset
    from dmlbench.training.setup import load_dataset

    if is_config:
        overrides = list(options or []) + ([f"data.root={root}"] if root is not None else [])
        config = config_module.load(Path(source), overrides)
        dataset = load_dataset(config)
        fraction = config.data.validation_fraction if validation_fraction is None else validation_fraction
        split_seed = config.seed if seed is None else seed
    else:
        dataset_options: dict[str, Any] = {}
        for option in options or []:
            path, value = config_module.parse_override(option)
            if len(path) != 1:
                raise UserInputError(f"dataset option {option!r} must be key=value")
            dataset_options[path[0]] = value
        if data_module.dataset_source(source).takes_root:
            if root is None:
                raise UserInputError(f"dataset {source!r} reads files: give --root PATH")
            dataset_options["root"] = root
        elif root is not None:
            raise UserInputError(f"--root is for the datasets read from files ({', '.join(data_module.rooted_datasets())}), "
                                 f"not {source!r}")
        dataset = data_module.build(source, **dataset_options)
        fraction = 0.2 if validation_fraction is None else validation_fraction
        split_seed = 0 if seed is None else seed
    if isinstance(dataset, FileDataset):
        summary = summarize_files(dataset)
        text = format_file_summary(summary)
    else:
        summary = summarize(dataset, validation_fraction=fraction, seed=split_seed)
        text = format_summary(summary)
    if target == "-":
        typer.echo(json.dumps(summary, indent=2))
    elif target is not None:
        from dmlbench.files import atomic_write

        try:
            atomic_write(target, lambda stream: stream.write((json.dumps(summary, indent=2) + "\n").encode()))
        except OSError as error:
            raise UserInputError(f"cannot write --json {target}: {error.strerror or error}") from None
    if target != "-":
        typer.echo(text)
    if summary["problems"]:
        # Exit 1 (the data, not the command, is at fault), so that a script or CI can gate on it.
        raise typer.Exit(1)


@data_app.command("fetch", cls=Command)
def fetch_command(
    source: Annotated[str, typer.Argument(metavar="DATASET", help="The dataset to download: cub200, cars196, sop, inshop (their official archives, docs/datasets.md) or emoji (npm packages).", show_default=False)],
    root: Annotated[str, typer.Option(metavar="DIR", help="Folder to unpack into: the dataset lands in a folder of its own under DIR (data.root; emoji: DIR itself).", show_default=False)],
    mirror: Annotated[Optional[str], typer.Option(metavar="URL", help="Look the same file names up under this base address or folder instead of the official hosts (default: $DMLBENCH_MIRROR); the pinned sums are checked all the same.", show_default=False)] = None,
    vendors: Annotated[Optional[list[str]], typer.Option(metavar="VENDOR[,VENDOR...]", help="emoji: vendors, comma-separated or repeated: apple, google, twitter, facebook (default: all four).", show_default=False)] = None,
    tarballs: Annotated[Optional[str], typer.Option(metavar="DIR", help="emoji: folder of the npm tarballs: used when there, downloaded into otherwise (default: a temporary folder).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Download a dataset, check its pinned sums, unpack it where its reader looks, print its terms and citation, then the report of `data check`.

    An interrupted download resumes where it stopped (HTTP range requests), and nothing half-unpacked is
    left where the reader would take it for data. --offline (or DMLBENCH_OFFLINE=1) downloads nothing
    and names the file to place by hand. Exit codes: 0 fetched and checked, 1 npm is not on PATH
    (emoji), a full disk (free space and run the same command again) or problems found by the check,
    2 bad input, a failed or broken download or a sum other than the pinned one (the same command
    again finishes the job), 130 interrupted by Ctrl-C, 143 by SIGTERM.
    """
    # Paths first: one that cannot become a folder is reported before torch is imported.
    require_creatable_directory(Path(root).expanduser(), "--root")
    if tarballs is not None:
        require_creatable_directory(Path(tarballs).expanduser(), "--tarballs")
    from dmlbench.data import dataset_source

    if dataset_source(source).fetch != "npm":
        if vendors or tarballs:
            raise UserInputError("--vendors and --tarballs are for emoji")
        _fetch_archives(source, Path(root).expanduser(), mirror, quiet)
        return
    if mirror is not None:
        raise UserInputError("--mirror is for cub200, cars196, sop and inshop; emoji comes from the npm registry")
    from dmlbench.data.emoji import VENDORS, parse_vendors
    from dmlbench.data.emoji_fetch import NpmMissing, fetch

    chosen = parse_vendors(",".join(vendors)) if vendors else VENDORS
    try:
        fetch(Path(root).expanduser(), chosen or VENDORS, tarballs=None if tarballs is None else Path(tarballs).expanduser(),
              report=typer.echo)
    except NpmMissing as missing:
        typer.echo(str(missing), err=True)
        raise typer.Exit(1) from None


def _fetch_archives(source: str, root: Path, mirror: str | None, quiet: bool) -> None:
    """``data fetch`` of a dataset with official archives, then its terms, citation and ``data check`` report."""
    from dmlbench.data.fetch import fetch
    from dmlbench.download import mirror_base

    fetched = fetch(source, root, mirror=mirror_base(mirror), quiet=quiet, report=typer.echo)
    state = "already fetched" if fetched.action == "present" else "downloaded, checked and unpacked"
    typer.echo(f"{source}: {state} in {fetched.folder} (data.root; record: {fetched.folder / 'dmlbench-fetch.json'})")
    typer.echo(f"terms: {fetched.record['terms']}")
    typer.echo(f"cite: {fetched.record['citation']}")
    check_command(source, None, root=str(fetched.folder), validation_fraction=None, seed=None, json_path=None, quiet=quiet)


def _json_target(value: str | None) -> Path | str | None:
    """``'-'``, a writable file path, or ``None``; checked before any work."""
    if value is None or value == "-":
        return value
    path = Path(value)
    if path.is_dir():
        raise UserInputError(f"--json {path} is a directory")
    if not path.parent.is_dir():
        raise UserInputError(f"--json {path}: folder {path.parent} does not exist")
    return path
