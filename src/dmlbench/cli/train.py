"""``dmlbench train``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli import cluster
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
    slurm: Annotated[bool, typer.Option("--slurm", help="Submit the run to SLURM through submitit (the slurm extra): --nodes x --tasks-per-node processes, data-parallel as under torchrun.")] = False,
    nodes: Annotated[int, typer.Option("--nodes", metavar="K", help="With --slurm: nodes.")] = 1,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", metavar="G", help="With --slurm: GPUs per node, one process each.")] = 0,
    tasks_per_node: Annotated[Optional[int], typer.Option("--tasks-per-node", metavar="N", help="With --slurm: processes per node (default: --gpus-per-node, or 1 without GPUs; on the CPU, gloo).", show_default=False)] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", metavar="NAME", help=cluster.PARTITION_HELP, show_default=False)] = None,
    time_limit: Annotated[str, typer.Option("--time", metavar="LIMIT", help=cluster.TIME_HELP.replace("stops its unit", "resumes from its last epoch"))] = cluster.DEFAULT_TIME,
    cpus_per_task: Annotated[int, typer.Option("--cpus-per-task", metavar="N", help="With --slurm: CPUs per process.")] = 1,
    sbatch: Annotated[Optional[list[str]], typer.Option("--sbatch", metavar="OPTION", help=cluster.SBATCH_HELP, show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With --slurm: wait for the job to end (exit 1 if it failed).")] = False,
) -> None:
    """Train one model on one split; select the checkpoint on validation MAP@R only.

    Started by torchrun (torchrun --nproc_per_node=N -m dmlbench train ...), it trains data-parallel
    with the configured batch as the global batch; rank 0 writes the run directory.

    With --slurm it is submitted as one SLURM job of --nodes x --tasks-per-node processes (the ranks are
    SLURM's tasks); a task warned of its time limit requeues the job, which resumes from the last epoch.

    Exit codes: 0 trained (or already complete; with --slurm: submitted), 1 the run failed (e.g. the loss
    became NaN), 2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM (both resumable with --resume).
    """
    from dmlbench import config as config_module

    config_path, overrides = config_and_overrides(config_path, overrides)
    cluster_options = cluster.train_options(slurm, nodes=nodes, gpus=gpus_per_node, tasks=tasks_per_node, partition=partition,
                                            time_limit=time_limit, cpus=cpus_per_task, sbatch=sbatch, wait=wait)
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
    from dmlbench.training import records
    from dmlbench.training.launch import train_ranks

    if resume:
        assert output is not None  # checked above
        records.require_run_dir(output)
        config = config_module.load(output / records.CONFIG_FILE)
    else:
        config = config_module.load(config_path, overrides)
    if cluster_options is not None:
        cluster.submit_training_run(config, output, cluster_options, nodes=nodes, tasks_per_node=tasks_per_node or max(gpus_per_node, 1),
                                    resume=resume, wait=wait, quiet=quiet)
        return
    outcome = train_ranks(config, output, resume=resume, progress=not quiet)
    if outcome.result is None:
        if outcome.group.is_main:
            print(f"dmlbench: error: {outcome.divergence}", file=sys.stderr)
        raise typer.Exit(1)
    if not outcome.group.is_main:
        return
    result = outcome.result
    best = result.best_validation or {}
    summary = ", ".join(f"{key} {value:.4f}" for key, value in best.items() if key in ("precision_at_1", "map_at_r"))
    if result.already_complete:
        typer.echo(f"run {result.run_dir} is already complete: best epoch {result.best_epoch} ({summary}); nothing was trained")
        return
    typer.echo(f"run {result.run_dir}: best epoch {result.best_epoch} ({summary})")
