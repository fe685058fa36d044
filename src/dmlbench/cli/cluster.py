"""The ``--slurm`` options of ``dmlbench benchmark`` and ``dmlbench train``: read, checked before anything
slow, and the benchmark's submission and its follow-up."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.files import received_signal
from dmlbench.protocol.layout import SLURM_DIR
from dmlbench.provenance import default_output

SLURM_HELP = ("Submit the workers (--jobs N of them) as one SLURM job array through submitit (the slurm extra) "
              "and return; the storage must be one every node reaches (PostgreSQL, or a journal file on a shared "
              "filesystem: the default, in DIR).")
PARTITION_HELP = "SLURM partition (default: the cluster's default partition)."
TIME_HELP = ("Each task's SLURM time limit (MINUTES, HOURS:MINUTES:SECONDS or DAYS-HOURS[:MINUTES]); a task "
             "warned of it stops its unit and is requeued.")
CPUS_HELP = ("CPUs per SLURM task; also the torch threads of a method with training.num_threads: auto.")
GPUS_HELP = "GPUs per SLURM task (#SBATCH --gpus-per-node)."
SBATCH_HELP = "A further sbatch option for every task, as --NAME=VALUE or --FLAG (repeatable): --sbatch=--qos=high."
WAIT_HELP = "With --slurm: follow the job's tasks until they end, then print the summary (exit codes as without --slurm)."
DEFAULT_TIME = "1:00:00"


def slurm_options(slurm: bool, partition: str | None, time_limit: str, cpus: int, gpus: int, sbatch: list[str] | None,
                  wait: bool, jobs: str) -> Any:
    """``dmlbench benchmark``'s ``SlurmOptions`` with ``--slurm`` (``None`` without it), checked against the
    cluster: one line and exit 2 before anything is submitted."""
    given = [flag for flag, value in (("--partition", partition), ("--time", time_limit != DEFAULT_TIME),
                                      ("--cpus-per-worker", cpus != 1), ("--gpus-per-worker", gpus != 0),
                                      ("--sbatch", sbatch), ("--wait", wait)) if value]
    if slurm and jobs == "auto":
        raise UserInputError("--jobs auto counts this machine's cores; with --slurm give the number of workers (--jobs N)")
    return _checked_options(slurm, given, partition, time_limit, cpus, gpus, sbatch)


def train_options(slurm: bool, *, nodes: int, gpus: int, tasks: int | None, partition: str | None, time_limit: str,
                  cpus: int, sbatch: list[str] | None, wait: bool) -> Any:
    """``dmlbench train``'s ``SlurmOptions`` with ``--slurm`` (``None`` without it), checked against the cluster."""
    given = [flag for flag, value in (("--nodes", nodes != 1), ("--gpus-per-node", gpus != 0), ("--tasks-per-node", tasks),
                                      ("--partition", partition), ("--time", time_limit != DEFAULT_TIME),
                                      ("--cpus-per-task", cpus != 1), ("--sbatch", sbatch), ("--wait", wait)) if value]
    if slurm and (nodes < 1 or (tasks is not None and tasks < 1)):
        raise UserInputError(f"--nodes and --tasks-per-node must be at least 1, got {nodes} and {tasks}")
    return _checked_options(slurm, given, partition, time_limit, cpus, gpus, sbatch)


def command_words(options: Any) -> list[str]:
    """The ``--slurm`` flags that ask for ``options`` again, with ``--wait`` (the command that continues a
    benchmark follows the job it submitted while that job is queued or running)."""
    words = ["--slurm", "--wait", "--time", str(options.time_minutes)]
    words += ["--partition", options.partition] if options.partition is not None else []
    words += ["--cpus-per-worker", str(options.cpus_per_task)] if options.cpus_per_task != 1 else []
    words += ["--gpus-per-worker", str(options.gpus_per_node)] if options.gpus_per_node else []
    return words + [f"--sbatch=--{name}" + ("" if value is True else f"={value}") for name, value in options.sbatch.items()]


def _checked_options(slurm: bool, given: list[str], partition: str | None, time_limit: str, cpus: int, gpus: int,
                     sbatch: list[str] | None) -> Any:
    """The ``SlurmOptions`` (``None`` without ``--slurm``, where ``given`` SLURM options are refused), checked
    against the cluster."""
    from dmlbench import slurm as slurm_module

    if not slurm:
        if given:
            raise UserInputError(f"{given[0]} is an option of --slurm; add --slurm or leave it out")
        return None
    options = slurm_module.SlurmOptions(partition, slurm_module.parse_time(time_limit), cpus, gpus,
                                        slurm_module.parse_sbatch_options(sbatch or []))
    slurm_module.require_cluster(partition)
    return options


def submit_training_run(config: Any, output: Path | None, options: Any, *, nodes: int, tasks_per_node: int,
                        resume: bool, wait: bool, quiet: bool) -> None:
    """``train --slurm``: submit the run (``output``, or ``runs/<loss>-<time>``), and with ``wait`` follow it
    (exit 1 unless it completed)."""
    from dmlbench.training.slurm import submit_training

    run_dir = output or default_output(config.loss.name)
    job = submit_training(config, run_dir, options, nodes=nodes, tasks_per_node=tasks_per_node, resume=resume)
    typer.echo(f"submitted SLURM job {job.job_id}: {nodes} node(s) x {tasks_per_node} process(es); run {job.run_dir}; "
               f"logs: {job.folder}", err=True)
    if wait and not job.wait(progress=not quiet):
        raise typer.Exit(1)


def run_on_slurm(prepared: Any, config_path: Path | None, overrides: list[str], options: Any, *, dry_run: bool,
                 wait: bool, retry_failed: bool, report: Any, quiet: bool, budget: Any) -> bool:
    """Submit the benchmark's workers (or follow the job still queued or running for this directory);
    with ``wait``, follow it to its end; with ``dry_run``, print the sbatch script and submit nothing.
    ``budget``: a sequential study's, for every task (its span counts from the submission). Whether the report
    is written (``False`` without ``wait``)."""
    from dmlbench.protocol.run import slurm

    if dry_run:
        typer.echo(slurm.submission_script(prepared, options))
        return False
    if retry_failed:
        from dmlbench.protocol.run.schedule import retry_failed_units

        typer.echo(f"--retry-failed: {retry_failed_units(prepared)} failed unit(s) to run again", err=True)
    output_dir = prepared.output_dir
    live = [job for job in slurm.recorded_jobs(output_dir) if any(task.live for task in slurm.states(output_dir, job))]
    if live:
        job = live[-1]
        typer.echo(f"SLURM job {job.job_id} of {output_dir} is still queued or running: nothing submitted", err=True)
    else:
        job = slurm.submit_workers(prepared, config_path, overrides, options, report=report, budget=budget)
        typer.echo(f"submitted SLURM job {job.job_id} ({job.tasks} worker task(s)); logs: {output_dir / SLURM_DIR}", err=True)
    if not wait:
        typer.echo(f"follow it with: dmlbench status {output_dir}")
        return False
    try:
        written = slurm.follow(output_dir, job, progress=not quiet)
    except (RunInterrupted, KeyboardInterrupt):
        print(f"dmlbench: stopped following SLURM job {job.job_id}; its tasks run on: follow them with "
              f"`dmlbench status {output_dir}`, cancel them with `scancel {job.job_id}`", file=sys.stderr)
        raise typer.Exit(128 + received_signal()) from None
    if not written:
        print(f"dmlbench: error: the tasks of SLURM job {job.job_id} ended before the benchmark was done; their logs "
              f"are in {output_dir / SLURM_DIR}; the same command submits workers for the work left", file=sys.stderr)
        raise typer.Exit(1)
    return True
