"""``dmlbench benchmark`` and ``dmlbench search``: the fair protocol (seed 001 §3) over many methods."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import takewhile
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dmlbench.cli import cluster
from dmlbench.cli.common import (
    COMMAND_STARTED, OVERRIDES_HELP, QUIET_HELP, Command, checked_budget, config_and_overrides, require_yaml)
from dmlbench.errors import RunInterrupted, StorageFailed, UserInputError
from dmlbench.provenance import default_output
from dmlbench.protocol import layout
from dmlbench.protocol.queue.storage import DEFAULT_RETRY_SECONDS, redact

STORAGE_HELP = ("Optuna storage shared by every worker: postgresql://USER@HOST/DB (password from PGPASSWORD or "
                f"~/.pgpass, never in the URL), journal:///PATH or sqlite:///PATH (default: DIR/{layout.SQLITE_FILE}, "
                f"or DIR/{layout.JOURNAL_FILE} with --jobs > 1).")
SEARCH_STORAGE_HELP = ("Optuna storage shared by every worker: postgresql://USER@HOST/DB (password from PGPASSWORD or "
                       f"~/.pgpass, never in the URL), journal:///PATH or sqlite:///PATH (default: DIR/{layout.SQLITE_FILE}).")
JOBS_HELP = ("Worker processes on this machine, each with training.num_threads torch threads; auto: one per core "
             "(or per training.num_threads cores), at most as many as the search can keep busy.")
HEARTBEAT_HELP = "Seconds between a PostgreSQL worker's heartbeats; a worker silent for 3 of them is taken for dead."
ACCEPT_HELP = ("Continue although a plugin's code changed since the benchmark started; the change is recorded in "
               f"{layout.BENCHMARK_FILE}.")
ACCEPT_ANALYSIS_HELP = ("Continue although the config's `analysis` differs from the one declared when the benchmark "
                        f"started; the change is recorded in {layout.BENCHMARK_FILE} and the report.")
RETRY_FAILED_HELP = ("Run again, with the same parameters, every search trial and reproduction that failed (a plugin "
                     "that raised, a NaN loss), once its cause is fixed; the failed attempts stay recorded.")
BUDGET_HELP = ("A sequential study's wall time, every run of this command on the directory together (30m, 2h, 1h30m, "
               "90s): no round starts that its measured cost says cannot end within it; the same command with a larger "
               "budget continues the study.")
MAX_SEARCHES_HELP = ("A sequential study stops before a look that needs more than N searches of a method (the design's "
                     "protocol.max_searches, and so its boundaries, stay as declared).")
DB_RETRY_HELP = ("Seconds a worker waits for a database server that went away (a restart), retrying with a doubling "
                 "pause, before it stops with exit 1 (the same command continues later).")


# One worker by default: the results of --jobs auto depend on the machine's core count through the
# thread count, and on a protocol of seconds the extra processes cost more than they save
# (benchmarks/jobs.py; docs/protocol.md, "One machine, several processes").
DEFAULT_JOBS = "1"


def register(app: typer.Typer) -> None:
    app.command("benchmark", cls=Command)(benchmark_command)
    app.command("search", cls=Command)(search_command)


def benchmark_command(
    ctx: typer.Context,
    config_path: Annotated[Optional[Path], typer.Argument(metavar="CONFIG", help="Benchmark YAML (default: the built-in glyphs benchmark).", show_default=False)] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(metavar="OVERRIDES", help=OVERRIDES_HELP + " Applied to every method.", show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="DIR", help="Output directory (default: runs/benchmark-<time>); an existing one is resumed.", show_default=False)] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", metavar="URL", help=STORAGE_HELP, show_default=False)] = None,
    jobs: Annotated[str, typer.Option("--jobs", "-j", metavar="N|auto", help=JOBS_HELP)] = DEFAULT_JOBS,
    heartbeat: Annotated[int, typer.Option("--heartbeat", metavar="SECONDS", help=HEARTBEAT_HELP)] = 30,
    db_retry: Annotated[int, typer.Option("--db-retry", metavar="SECONDS", help=DB_RETRY_HELP)] = DEFAULT_RETRY_SECONDS,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the training runs and epochs the config implies and an estimate of their time; train nothing.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
    accept_plugin_changes: Annotated[bool, typer.Option("--accept-plugin-changes", help=ACCEPT_HELP)] = False,
    accept_analysis_change: Annotated[bool, typer.Option("--accept-analysis-change", help=ACCEPT_ANALYSIS_HELP)] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help=RETRY_FAILED_HELP)] = False,
    slurm: Annotated[bool, typer.Option("--slurm", help=cluster.SLURM_HELP)] = False,
    partition: Annotated[Optional[str], typer.Option("--partition", metavar="NAME", help=cluster.PARTITION_HELP, show_default=False)] = None,
    time_limit: Annotated[str, typer.Option("--time", metavar="LIMIT", help=cluster.TIME_HELP)] = cluster.DEFAULT_TIME,
    cpus_per_worker: Annotated[int, typer.Option("--cpus-per-worker", metavar="N", help=cluster.CPUS_HELP)] = 1,
    gpus_per_worker: Annotated[int, typer.Option("--gpus-per-worker", metavar="N", help=cluster.GPUS_HELP)] = 0,
    sbatch: Annotated[Optional[list[str]], typer.Option("--sbatch", metavar="OPTION", help=cluster.SBATCH_HELP, show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help=cluster.WAIT_HELP)] = False,
    budget: Annotated[Optional[str], typer.Option("--budget", metavar="TIME", help=BUDGET_HELP, show_default=False)] = None,
    max_searches: Annotated[Optional[int], typer.Option("--max-searches", metavar="N", help=MAX_SEARCHES_HELP, show_default=False)] = None,
) -> None:
    """Run the whole protocol: search, reproductions on new seeds, untrained baseline, paired tests, report.

    Every method gets the same trials, epochs and folds. Any number of workers (this command on
    other machines with the same CONFIG and --storage, or --jobs here) share the work; a worker that
    finds nothing left says so and exits 0. Exit codes: 0 every method completed, 1 some method
    failed (named on stderr) or a write failed for lack of space (the same command continues), 2 bad
    input, 130 interrupted by Ctrl-C and 143 by SIGTERM (the message prints the command that continues
    it; finished trials and runs are kept). With --slurm: 0 once submitted (with --wait, as above).
    """
    # The dry run counts the command's start in its estimate: the process's, when it runs this one command.
    started = ctx.obj.get(COMMAND_STARTED, time.monotonic()) if isinstance(ctx.obj, dict) else time.monotonic()
    config_path, overrides = config_and_overrides(config_path, overrides)
    _check_storage_options(heartbeat, db_retry)
    workers, asked_budget = _jobs(jobs), _budget_options(budget, max_searches)
    cluster_options = cluster.slurm_options(slurm, partition, time_limit, cpus_per_worker, gpus_per_worker, sbatch, wait, jobs)
    output_dir = output or default_output("benchmark")
    # Built before anything slow (the imports, the dataset): a stop at any moment names the command that continues.
    again = continue_command("benchmark", config_path, overrides, output_dir, redact(storage) if storage else None, jobs=jobs,
                             heartbeat=heartbeat, db_retry=db_retry, quiet=quiet, dry_run=dry_run, slurm=cluster_options,
                             budget=budget, max_searches=max_searches)
    with stops_explained(f"benchmark {output_dir}", again, dry_run=dry_run):
        from dmlbench.protocol.design.benchmark import load_spec

        spec = load_spec(config_path)  # the YAML read once, and a mistake in it said before torch is imported

        from dmlbench.protocol.design.prepare import prepare
        from dmlbench.report import write_report  # here, so that a dry run's measured start includes its import

        _quiet_optuna()
        prepared = prepare(spec, output_dir, overrides, storage, jobs=workers,
                           heartbeat=heartbeat, retry_seconds=db_retry, accept_plugin_changes=accept_plugin_changes,
                           accept_analysis_change=accept_analysis_change)
        rounds = checked_budget(prepared, asked_budget)  # its span starts here, for local workers and SLURM tasks alike
        if cluster_options is not None:
            if cluster.run_on_slurm(prepared, config_path, overrides, cluster_options, dry_run=dry_run, wait=wait,
                                    retry_failed=retry_failed, report=write_report, quiet=quiet, budget=rounds):
                _print_finished(output_dir, config_path, overrides, quiet)
            return
        _announce_workers(jobs, prepared.jobs, quiet)
        if dry_run:
            _print_dry_run(prepared, started, write_report)
            return
        if not quiet:
            typer.echo(f"output: {output_dir} ({layout.REPORT_FILE} and {layout.REPORT_HTML} at the end)", err=True)
        if retry_failed:
            from dmlbench.protocol.run.schedule import retry_failed_units

            typer.echo(f"--retry-failed: {retry_failed_units(prepared)} failed unit(s) to run again", err=True)
        outcome = _run_prepared(prepared, config_path, overrides, quiet, write_report, rounds)
    if outcome is None:
        typer.echo(f"done: every unit is finished and the report is written: {output_dir / layout.REPORT_FILE} "
                   f"(`dmlbench report {output_dir}` rebuilds it from the storage)")
        _exit_on_failures(_recorded_failures(output_dir))
        return
    _print_finished(output_dir, config_path, overrides, quiet, outcome.failed)


def _print_dry_run(prepared: Any, started: float, write_report: Any) -> None:
    """The dry run's estimate (with the real run's report writer, timed) and the power of its design."""
    from dmlbench.analysis.planning import dry_run_plan
    from dmlbench.protocol.dry_run.cost import dry_run as estimate

    typer.echo(estimate(prepared, started, report=write_report))
    typer.echo(dry_run_plan(prepared.spec.planned_family(), prepared.spec.analysis.planning_sd,
                             prepared.spec.analysis.planning_search_sd))


def _print_finished(output_dir: Path, config_path: Path | None, overrides: list[str], quiet: bool,
                    failed: dict[str, str] | None = None) -> None:
    """What a benchmark whose report is written prints: the report's summary and files, then each failed
    method (exit 1): ``failed``, or those ``results.json`` records (the workers ran elsewhere: SLURM tasks)."""
    if not quiet:
        typer.echo(report_summary((output_dir / layout.REPORT_FILE).read_text(), config_path, overrides))
    typer.echo(f"report: {output_dir / layout.REPORT_FILE} {output_dir / layout.REPORT_HTML}; "
               f"results: {output_dir / layout.RESULTS_CSV}")
    _exit_on_failures(_recorded_failures(output_dir) if failed is None else failed)


def _recorded_failures(output_dir: Path) -> dict[str, str]:
    """The methods that had failed when the report was written (``results.json``): finding the work
    done is no success for them."""
    results = output_dir / layout.RESULTS_FILE
    return dict(json.loads(results.read_text()).get("failed", {})) if results.is_file() else {}


def _exit_on_failures(failed: dict[str, str]) -> None:
    """Each failed method on stderr with the way to run its failed units again, then exit 1."""
    for name, reason in failed.items():
        print(f"dmlbench: error: method {name} failed: {reason}", file=sys.stderr)
    if failed:
        print("dmlbench: fix the cause, then run the same command with --retry-failed to run the failed units again",
              file=sys.stderr)
        raise typer.Exit(1)


def _run_prepared(prepared: Any, config_path: Path | None, overrides: list[str], quiet: bool, write_report: Any,
                  budget: Any) -> Any:
    """Run a prepared benchmark with its workers (``--jobs``), ``write_report`` and a sequential study's
    ``budget`` (``RoundBudget``); the ``BenchmarkOutcome``, or ``None`` when another worker wrote the report."""
    from dmlbench.protocol.run.schedule import run_benchmark

    if prepared.jobs > 1:
        from dmlbench.protocol.run.jobs import run_jobs

        return run_jobs(prepared, config_path, overrides, progress=not quiet, report=write_report, budget=budget)
    return run_benchmark(prepared, progress=not quiet, report=write_report, budget=budget)


def _budget_options(budget: str | None, max_searches: int | None) -> tuple[float | None, int | None]:
    """``--budget`` in seconds and ``--max-searches``, checked before anything slow is imported."""
    from dmlbench.validation import duration_seconds

    seconds = None
    if budget is not None:
        try:
            seconds = duration_seconds(budget)
        except ValueError as error:
            raise UserInputError(f"--budget {error}") from None
    if max_searches is not None and max_searches < 2:
        raise UserInputError(f"--max-searches must be at least 2 (a look needs two searches), got {max_searches}")
    return seconds, max_searches


SUMMARY_LINES = 12  # what a finished benchmark prints of its report; the whole report.md is hundreds of lines


def report_summary(report: str, config_path: Path | None = None, overrides: list[str] | None = None) -> str:
    """The lines of ``report.md`` a finished benchmark prints: its plain-language ``Summary`` section,
    or without one (no references to compare with) the leaderboard table; at most ``SUMMARY_LINES``.
    The report writes the command of a more decisive design with ``CONFIG`` (it does not know the
    file); here it becomes this command's config and overrides, to be run as printed."""
    lines = report.splitlines()
    if "## Summary" in lines:
        section = takewhile(lambda line: not line.startswith("## "), lines[lines.index("## Summary") + 1:])
        chosen = [line for line in section if line.strip()]
    else:
        first = next((index for index, line in enumerate(lines) if line.startswith("|")), len(lines))
        chosen = list(takewhile(lambda line: line.startswith("|"), lines[first:]))
    text = "\n".join(chosen[:SUMMARY_LINES])
    # The suggested command sets its own keys (protocol.reproductions, protocol.search_repeats): this run's
    # values of those are left out, the rest of its overrides kept.
    suggested = re.search(r"`dmlbench benchmark CONFIG ([^`]*)`", text)
    replaced = {item.split("=", 1)[0] for item in suggested.group(1).split() if "=" in item} if suggested else set()
    kept = [shlex.quote(item) for item in overrides or [] if item.split("=", 1)[0] not in replaced]
    command = " ".join(["dmlbench benchmark", *([shlex.quote(str(config_path))] if config_path else []), *kept])
    return text.replace("`dmlbench benchmark CONFIG", f"`{command}")


def search_command(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG", help="A benchmark YAML, or a run config with a `search:` space (and optional `protocol:`).", show_default=False)],
    overrides: Annotated[Optional[list[str]], typer.Argument(metavar="OVERRIDES", help=OVERRIDES_HELP, show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="DIR", help="Output directory (default: runs/search-<time>); an existing one is resumed.", show_default=False)] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", metavar="URL", help=SEARCH_STORAGE_HELP, show_default=False)] = None,
    heartbeat: Annotated[int, typer.Option("--heartbeat", metavar="SECONDS", help=HEARTBEAT_HELP)] = 30,
    db_retry: Annotated[int, typer.Option("--db-retry", metavar="SECONDS", help=DB_RETRY_HELP)] = DEFAULT_RETRY_SECONDS,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
    accept_plugin_changes: Annotated[bool, typer.Option("--accept-plugin-changes", help=ACCEPT_HELP)] = False,
    accept_analysis_change: Annotated[bool, typer.Option("--accept-analysis-change", help=ACCEPT_ANALYSIS_HELP)] = False,
) -> None:
    """Run the search stage alone: Bayesian optimisation with class-disjoint k-fold cross-validation.

    Other workers share the work as in `benchmark` (this command with the same CONFIG and --storage
    on other machines); `benchmark` continues a finished search into the whole protocol.

    Exit codes: 0 done, 1 a method has no completed trial or a write failed for lack of space, 2 bad
    input, 130 interrupted by Ctrl-C, 143 by SIGTERM (the message prints the command that continues it).
    """
    config_path, overrides = config_and_overrides(config_path, overrides)
    require_yaml(config_path, "config")  # before optuna and torch are imported
    _check_storage_options(heartbeat, db_retry)
    from dmlbench.protocol.design.benchmark import load_search_spec
    from dmlbench.protocol.design.prepare import prepare
    from dmlbench.protocol.run.schedule import run_search_stage

    _quiet_optuna()
    spec = load_search_spec(config_path)
    output_dir = output or default_output("search")
    prepared = prepare(spec, output_dir, overrides, storage, heartbeat=heartbeat, retry_seconds=db_retry,
                       accept_plugin_changes=accept_plugin_changes, accept_analysis_change=accept_analysis_change)
    again = continue_command("search", config_path, overrides, output_dir, prepared.redacted if storage else None,
                             heartbeat=heartbeat, db_retry=db_retry, quiet=quiet)
    with stops_explained(f"search {output_dir}", again):
        results = run_search_stage(prepared, progress=not quiet)
    failed = False
    for name, result in results.items():
        if result.best_params is None:
            print(f"dmlbench: error: method {name} failed: no search trial completed", file=sys.stderr)
            failed = True
        else:
            typer.echo(f"{name}: best fold-mean validation MAP@R {result.best_value:.4f} with {result.best_params}")
    typer.echo(f"search: {output_dir / layout.SEARCH_FILE}")
    if failed:
        raise typer.Exit(1)


def continue_command(command: str, config_path: Path | None, overrides: list[str], output_dir: Path,
                     storage: str | None, *, jobs: str = DEFAULT_JOBS, heartbeat: int = 30,
                     db_retry: int = DEFAULT_RETRY_SECONDS, quiet: bool = False, dry_run: bool = False,
                     slurm: Any = None, budget: str | None = None, max_searches: int | None = None) -> str:
    """The command line that continues this benchmark: the same config and overrides, with ``-o``
    (a run without it would start a new directory) and the storage without its password; a stopped
    ``--dry-run`` is repeated as one; with ``slurm`` (its ``SlurmOptions``), submitted again or followed."""
    from dmlbench import plugins

    words = ["dmlbench", command, *([str(config_path)] if config_path else []), *overrides, "-o", str(output_dir)]
    for plugin in plugins.command_line():
        words += ["--plugin", plugin]
    if storage:
        words += ["--storage", storage]
    if jobs != DEFAULT_JOBS:
        words += ["--jobs", jobs]
    if heartbeat != 30:
        words += ["--heartbeat", str(heartbeat)]
    if db_retry != DEFAULT_RETRY_SECONDS:
        words += ["--db-retry", str(db_retry)]
    if budget is not None:
        words += ["--budget", budget]
    if max_searches is not None:
        words += ["--max-searches", str(max_searches)]
    if quiet:
        words.append("-q")
    if dry_run:
        words.append("--dry-run")
    if slurm is not None:
        words += cluster.command_words(slurm)
    return shlex.join(words)


@contextmanager
def stops_explained(what: str, again: str, *, dry_run: bool = False) -> Iterator[None]:
    """A stop signal or a full disk ends with the exact command that continues the work (a dry run stores
    nothing: it is run again, not continued)."""
    from dmlbench.files import describe, storage_error

    try:
        yield
    except (RunInterrupted, KeyboardInterrupt):  # a stop before the run started (imports, the dataset) too
        if dry_run:
            raise RunInterrupted(f"the dry run of {what} stopped; it stored nothing, so there is nothing to "
                                 f"continue; run it again with: {again}") from None
        raise RunInterrupted(f"{what} stopped; continue it with: {again}") from None
    except Exception as error:  # a full disk in a training run names that run's resume: name this command
        full = storage_error(error)
        if full is None:
            raise
        raise StorageFailed(f"{describe(full)}; nothing was stored as a failure; free space, "
                            f"then continue it with: {again}") from error


def _announce_workers(asked: str, jobs: int, quiet: bool) -> None:
    """The workers ``--jobs`` (``asked``) became where that is not the number given (``auto``, one for SQLite);
    and one line when they are more than the cores this process may use: they take turns on the cores, and
    each run then takes longer than alone."""
    from dmlbench.training.threads import available_cores

    if asked != str(jobs) and not quiet:
        typer.echo(f"--jobs {asked}: {jobs} worker process(es)", err=True)
    cores = available_cores()
    if jobs > cores:
        print(f"dmlbench: warning: --jobs {jobs} starts {jobs} workers on the {cores} core(s) this process may use; "
              f"they share the cores and the benchmark takes longer than with --jobs {cores} (or --jobs auto)",
              file=sys.stderr, flush=True)


def _check_storage_options(heartbeat: int, db_retry: int) -> None:
    """``--heartbeat`` and ``--db-retry``, checked before anything is read."""
    if heartbeat < 1:
        raise UserInputError(f"--heartbeat must be a positive number of seconds, got {heartbeat}")
    if db_retry < 0:
        raise UserInputError(f"--db-retry must be a number of seconds >= 0, got {db_retry}")


def _jobs(jobs: str) -> int | str:
    """``--jobs``: a positive number of worker processes, or ``auto``, as ``prepare`` takes it."""
    if jobs == "auto":
        return jobs
    if jobs.isdigit() and int(jobs) >= 1:
        return int(jobs)
    raise UserInputError(f"--jobs must be a positive integer or auto, got {jobs!r}")


def _quiet_optuna() -> None:
    import logging

    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
