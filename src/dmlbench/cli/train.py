"""``dmlbench train``."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import CONFIG_HELP, OVERRIDES_HELP, QUIET_HELP, Command, config_and_overrides, require_run_dir
from dmlbench.errors import UserInputError


def register(app: typer.Typer) -> None:
    app.command("train", cls=Command)(train_command)


def train_command(
    config_path: Annotated[Optional[Path], typer.Argument(metavar="CONFIG", help=CONFIG_HELP + " Omit with --resume.", show_default=False)] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(metavar="OVERRIDES", help=OVERRIDES_HELP, show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="RUN", help="Run directory (default: runs/<loss>-<time>).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --output from its last checkpoint.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
) -> None:
    """Train one model on one split; select the checkpoint on validation MAP@R only.

    Started by torchrun (torchrun --nproc_per_node=N -m dmlbench train ...), it trains data-parallel
    with the configured batch as the global batch; rank 0 writes the run directory.

    Exit codes: 0 trained (or already complete), 1 the run failed (e.g. the loss became NaN),
    2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM (both resumable with --resume).
    """
    from dmlbench import config as config_module

    config_path, overrides = config_and_overrides(config_path, overrides)
    # Paths and arguments first: a mistake is reported before torch is imported.
    if resume:
        if output is None:
            raise UserInputError("--resume needs --output RUN_DIR")
        require_run_dir(output)
        if config_path is not None or overrides:
            raise UserInputError("--resume continues the run with its stored config; give no CONFIG or overrides")
    elif config_path is None:
        raise UserInputError("missing CONFIG (a YAML file, e.g. configs/glyphs.yaml)")
    else:
        if config_path.is_dir():
            from dmlbench.training import records  # only on this mistake: the package imports torch

            if records.is_run_dir(config_path):
                raise UserInputError(f"config file {config_path} is a directory, not a YAML file (a run directory? "
                                     "continue it with: dmlbench train --resume -o DIR)")
        config_module.read_yaml(config_path, "config file")
    from dmlbench.training import TrainingDiverged, distributed, records, train

    if resume:
        assert output is not None  # checked above
        records.require_run_dir(output)
        config = config_module.load(output / records.CONFIG_FILE)
    else:
        config = config_module.load(config_path, overrides)
    started_group = distributed.init_from_environment(config.training.device)
    try:
        group = distributed.current()
        # Every rank must use rank 0's directory name (the clocks of the ranks may differ).
        run_dir = distributed.broadcast(
            output or Path("runs") / f"{config.loss.name}-{datetime.now():%Y%m%d-%H%M%S}", group
        )
        try:
            result = train(config, run_dir, resume=resume, progress=not quiet)
        except TrainingDiverged as error:
            if group.is_main:
                print(f"dmlbench: error: training diverged ({error}); run {run_dir} marked failed", file=sys.stderr)
            raise typer.Exit(1) from None
    finally:
        if started_group:
            import torch.distributed

            torch.distributed.destroy_process_group()
    if not group.is_main:
        return
    best = result.best_validation or {}
    summary = ", ".join(f"{key} {value:.4f}" for key, value in best.items() if key in ("precision_at_1", "map_at_r"))
    if result.already_complete:
        typer.echo(f"run {result.run_dir} is already complete: best epoch {result.best_epoch} ({summary}); nothing was trained")
        return
    typer.echo(f"run {result.run_dir}: best epoch {result.best_epoch} ({summary})")
