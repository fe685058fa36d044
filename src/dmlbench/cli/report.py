"""``dmlbench report``, ``audit``, ``plan`` and ``rejudge``: read a benchmark directory or config, train nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command, config_and_overrides, require_directory, require_yaml
from dmlbench.errors import UserInputError
from dmlbench.protocol.layout import BENCHMARK_FILE, COMPARISONS_CSV, RUNS_CSV

STORAGE_HELP = (f"Read this storage URL instead of the one DIR/{BENCHMARK_FILE} records (password from PGPASSWORD or "
                "~/.pgpass).")


def register(app: typer.Typer) -> None:
    app.command("report", cls=Command)(report_command)
    app.command("audit", cls=Command)(audit_command)
    app.command("plan", cls=Command)(plan_command)
    app.command("rejudge", cls=Command)(rejudge_command)


def _require_benchmark(directory: Path) -> None:
    """Before optuna, matplotlib and torch are imported: the message of the library's own check."""
    if not (directory / BENCHMARK_FILE).is_file():
        raise UserInputError(f"{directory} holds no benchmark study (no {BENCHMARK_FILE})")


def report_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A benchmark output directory.", show_default=False)],
    storage: Annotated[Optional[str], typer.Option("--storage", metavar="URL", help=STORAGE_HELP, show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="DIR", help="Write the report files here instead of DIR (a folder to publish: no checkpoints, no database).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Rebuild report.md, report.html, results.csv, runs.csv, comparisons.csv, the claim CSVs, the plots and results.tex from storage.

    Exit codes: 0 written, 1 a write failed for lack of space, 2 no benchmark study in DIR (or its
    storage cannot be read), 130 interrupted by Ctrl-C, 143 by SIGTERM.
    """
    _require_benchmark(directory)
    from dmlbench.report import write_report

    paths = write_report(directory, storage, output)
    for path in paths.values():
        typer.echo(str(path))


def audit_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A benchmark output directory.", show_default=False)],
    storage: Annotated[Optional[str], typer.Option("--storage", metavar="URL", help=STORAGE_HELP, show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Check every record: no search run saw a test class, no checkpoint was selected with test data,
    train/validation/test classes disjoint in every run, the same budget for every method.

    Exit codes: 0 the audit passed, 1 problems (each offending run named), 2 no benchmark study in DIR
    (or its storage cannot be read), 130 interrupted by Ctrl-C, 143 by SIGTERM.
    """
    _require_benchmark(directory)
    from dmlbench.protocol.inspection.audit import audit

    problems = audit(directory, storage)
    if problems:
        for problem in problems:
            print(f"dmlbench: audit: {problem}", file=sys.stderr)
        raise typer.Exit(1)
    typer.echo(f"audit passed: {directory}")


def _sequential_plan(spec: Any, pilot: Any, search_sd: Any, source: str) -> str:
    """The stopping time of a sequential design, simulated at a pilot's means and spreads."""
    if pilot is None or search_sd is None:
        return ("sequential design: its stopping time is simulated at a pilot's means and spreads; give --pilot DIR "
                "(with repeated searches, or with --search-sd X)")
    from dmlbench.analysis.sequential_simulation import pilot_model, plan_text
    from dmlbench.protocol.run.rounds import declared_design

    endpoint = (spec.analysis.primary.mode, spec.analysis.primary.metric)
    methods = [method.name for method in spec.methods]
    scores = {method: pilot.get(endpoint, {}).get(method, {}) for method in methods}
    missing = [method for method, values in scores.items() if len(values) < 2]
    if missing:
        return (f"sequential design: the pilot has fewer than 2 reproductions of {missing[0]!r} on {endpoint[0]} "
                f"{endpoint[1]}: its stopping time is not simulated")
    model = pilot_model(scores, search_sd, spec.protocol.reproductions)
    design, comparisons = declared_design(spec.protocol, spec.analysis, methods)
    return plan_text(model, comparisons, design, f"the pilot's means and seed SDs, search SD from {source}")


def plan_command(
    config_path: Annotated[Optional[Path], typer.Argument(metavar="CONFIG", help="Benchmark YAML (default: the built-in benchmark, as for benchmark).", show_default=False)] = None,
    overrides: Annotated[Optional[list[str]], typer.Argument(metavar="OVERRIDES", help="protocol.KEY=VALUE or analysis.KEY=VALUE, as for benchmark (protocol.reproductions=20).", show_default=False)] = None,
    pilot: Annotated[Optional[Path], typer.Option("--pilot", metavar="DIR", help="A finished benchmark whose paired differences give each comparison's SD.")] = None,
    sd: Annotated[Optional[float], typer.Option("--sd", metavar="X", help="The SD of the paired differences, in score units (0.008 = 0.8 points).")] = None,
    search_sd: Annotated[Optional[float], typer.Option("--search-sd", metavar="X", help="A method's search-luck SD, in score units: also plan searches and seeds (default: measured on a --pilot with repeated searches).")] = None,
    search_sd_at: Annotated[Optional[list[str]], typer.Option("--search-sd-at", metavar="TRIALS=X", help="The search SD measured with TRIALS trials per search (repeatable): also choose the trials per search.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Print, for every declared comparison, the power of the paired t-test and of TOST at the config's
    reproductions and margin, and the reproductions needed for 80% power after Holm; with a search SD
    (--search-sd, or a pilot that repeated its searches) also the cheapest design of searches and seeds
    for verdicts about the methods, and with --search-sd-at the cheapest over trials per search too;
    train nothing.

    Exit codes: 0 printed, 2 bad input (neither or both of --pilot and --sd, no runs.csv in the pilot,
    a --search-sd-at that is not TRIALS=X or lacks the config's own search SD), 130 interrupted by
    Ctrl-C, 143 by SIGTERM.
    """
    if (pilot is None) == (sd is None):
        raise UserInputError("plan needs one of --pilot DIR (a finished benchmark) or --sd X (a stated SD)")
    # Paths first: a missing one is reported before the config's plugins (and torch with them) are imported.
    if pilot is not None:
        require_directory(pilot, "--pilot")
    if sd is not None and not 0.0 < sd < 1.0:
        raise UserInputError(f"--sd must lie strictly between 0 and 1 (score units), got {sd}")
    if search_sd is not None and not 0.0 <= search_sd < 1.0:
        raise UserInputError(f"--search-sd must lie in [0, 1) (score units), got {search_sd}")
    other_trials = _search_sds_at(search_sd_at or [])
    config_path, overrides = config_and_overrides(config_path, overrides)
    if config_path is not None:
        require_yaml(config_path, "benchmark config")
    from dmlbench.analysis import planning
    from dmlbench.protocol.design.benchmark import apply_spec_overrides, load_spec
    from dmlbench.protocol.units.results import read_runs

    spec, others = apply_spec_overrides(load_spec(config_path), list(overrides or []))
    if others:  # a run setting cannot change a power calculation: say so rather than ignore it
        raise UserInputError(f"plan takes protocol.* and analysis.* overrides only; got {others[0]!r}")
    family = spec.planned_family()
    source, bound = "--search-sd", None
    planned: float | dict[str, float] | None = search_sd  # one SD for every method, or a pilot's per method
    if search_sd is None and pilot is not None:
        from dmlbench.report.committed import pilot_search_sd

        measured = pilot_search_sd(pilot, family.endpoint, [method.name for method in spec.methods])
        if measured is not None:
            planned, bound, source = measured
    # Refused before anything is printed: a plan cut off by its error would read as a whole one.
    if other_trials and planned is None:
        raise UserInputError("--search-sd-at compares with the config's own trials per search, whose search SD is "
                             "--search-sd X or a --pilot that repeated its searches")
    if family.trials in other_trials:
        raise UserInputError(f"--search-sd-at {family.trials}=...: {family.trials} is the config's own protocol.trials, "
                             "whose search SD is --search-sd or the pilot's")
    if pilot is not None:
        sds = planning.pilot_sds(read_runs(pilot, "pilot"), family)
        typer.echo(planning.plan_text(family, sds, f"measured in {pilot} per comparison"))
    else:
        sds = {pair: sd for pair in family.comparisons}
        typer.echo(planning.plan_text(family, sds, f"{100 * sd:.2f} points (--sd)"))
    if planned is not None:
        typer.echo(planning.search_plan_text(family, sds, planned, source, search_sd_bound=bound, other_trials=other_trials))
    if spec.protocol.sequential:
        typer.echo(_sequential_plan(spec, read_runs(pilot, "pilot") if pilot is not None else None, planned, source))
    if pilot is not None:
        from dmlbench.report.committed import pilot_range_notes

        for note in pilot_range_notes(pilot):
            typer.echo(f"search ranges: {note}")

def _search_sds_at(values: list[str]) -> dict[int, float]:
    """``--search-sd-at TRIALS=X`` values as trials per search -> search SD (score units)."""
    parsed: dict[int, float] = {}
    for value in values:
        trials, _, sd = value.partition("=")
        try:
            count, spread = int(trials), float(sd)
        except ValueError:
            raise UserInputError(f"--search-sd-at takes TRIALS=X (4=0.0146), got {value!r}") from None
        if count < 1 or not 0.0 <= spread < 1.0 or count in parsed:
            raise UserInputError(f"--search-sd-at {value!r}: TRIALS must be a new count >= 1 and X in [0, 1) (score units)")
        parsed[count] = spread
    return parsed


def rejudge_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help=f"A benchmark or report folder with {RUNS_CSV} and {BENCHMARK_FILE}.", show_default=False)],
    write: Annotated[bool, typer.Option("--write", help=f"Rewrite the verdict files that differ ({COMPARISONS_CSV}, ...); without it nothing is written.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Compare only and write nothing (the default; kept for scripts).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """Re-judge a committed study from its runs.csv and benchmark.json alone (no storage, no checkpoints) by
    today's rules and compare with its comparisons.csv, claim_comparisons.csv and (searches repeated)
    method_comparisons.csv; --write rewrites those that differ.

    A runs.csv with fewer scores than results.csv and benchmark.json record (cut short, partial) is
    refused before anything is judged. Exit codes: 0 the same (or, with --write, written), 1 a verdict
    file differs (without --write) or a write failed for lack of space, 2 no runs.csv or benchmark.json
    in DIR, a partial runs.csv, or --write with --check, 130 interrupted by Ctrl-C, 143 by SIGTERM.
    """
    if write and check:
        raise UserInputError("--write and --check exclude each other: --check compares only")
    _require_benchmark(directory)
    from dmlbench.report.committed import rejudge

    outcome = rejudge(directory, write=write)
    typer.echo(outcome.summary)
    if not write and outcome.changed:
        raise typer.Exit(1)
