"""``dmlbench calibrate``: a verification threshold chosen on validation classes, measured on test classes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dmlbench.cli.common import QUIET_SILENT_HELP, Command, require_creatable_directory, require_file, require_run_dir
from dmlbench.errors import UserInputError


def register(app: typer.Typer) -> None:
    app.command("calibrate", cls=Command)(calibrate_command)


def calibrate_command(
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="A completed training run directory.", show_default=False)] = None,
    fmr: Annotated[str, typer.Option("--fmr", metavar="RATE[,RATE...]", help="Target false match rates, e.g. 1e-3,1e-4.", show_default=False)] = "",
    output: Annotated[Optional[Path], typer.Option("-o", "--output", metavar="FILE", help="The calibration.json to write.", show_default=False)] = None,
    embeddings: Annotated[Optional[Path], typer.Option("--embeddings", metavar="FILE", help="Calibration embeddings CAL.npy [N, D] (instead of RUN).", show_default=False)] = None,
    labels: Annotated[Optional[Path], typer.Option("--labels", metavar="FILE", help="Their integer labels [N] (.npy).", show_default=False)] = None,
    test_embeddings: Annotated[Optional[Path], typer.Option("--test-embeddings", metavar="FILE", help="Test embeddings T.npy (other classes).", show_default=False)] = None,
    test_labels: Annotated[Optional[Path], typer.Option("--test-labels", metavar="FILE", help="Their integer labels (.npy).", show_default=False)] = None,
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the pair sample (beyond 2 million pairs) and of the class bootstrap.")] = 0,
    replicates: Annotated[int, typer.Option(metavar="N", min=1, help="Class-bootstrap replicates of the 95% intervals.")] = 1000,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_SILENT_HELP)] = False,
) -> None:
    """For each target FMR: the threshold chosen on the validation classes only, the test FMR and FNMR
    it gives with class-bootstrap 95% intervals, and the in-sample optimum on the test pairs.

    Exit codes: 0 written, 1 a write failed for lack of space, 2 bad input (nothing written), 130
    interrupted by Ctrl-C, 143 by SIGTERM.
    """
    target = _checked_output(output)
    file_options = (embeddings, labels, test_embeddings, test_labels)
    if run is not None and any(option is not None for option in file_options):
        raise UserInputError("give either a RUN directory or --embeddings/--labels/--test-embeddings/--test-labels, not both")
    # Paths first: a missing one is reported before torch is imported.
    if run is not None:
        require_run_dir(run)
    for path, what in zip(file_options, ("embeddings file", "labels file", "test embeddings file", "test labels file")):
        if path is not None:
            require_file(path, what)
    from dmlbench import files
    from dmlbench.deploy import calibration

    targets = calibration.parse_targets(fmr)
    if run is not None:
        document = calibration.calibrate_run(run, targets, seed=seed, replicates=replicates)
    elif all(option is not None for option in file_options):
        document = calibration.calibrate_files(*file_options, targets, seed=seed, replicates=replicates)  # type: ignore[arg-type]
    else:
        raise UserInputError("give a RUN directory, or all of --embeddings, --labels, --test-embeddings and --test-labels")
    target.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(target, document)
    _print(document)
    typer.echo(f"calibration: {target}")


def _checked_output(output: Path | None) -> Path:
    """``-o`` is required and names a file whose folder exists or can be made; said before any work,
    which writes nothing until the calibration is complete."""
    if output is None:
        raise UserInputError("-o calibration.json is required")
    if output.is_dir():
        raise UserInputError(f"-o {output} is a directory")
    require_creatable_directory(output.parent, "-o")
    return output


def _print(document: dict[str, Any]) -> None:
    def span(values: list[float] | None) -> str:
        return "[n/a]" if values is None else f"[{values[0]:.4g}, {values[1]:.4g}]"

    typer.echo(f"{'target FMR':>10}  {'threshold':>9}  {'test FMR (95% CI)':>28}  {'test FNMR (95% CI)':>28}  {'in-sample threshold':>19}")
    for point in document["targets"]:
        typer.echo(
            f"{point['target_fmr']:>10g}  {point['threshold']:>9.4f}  "
            f"{point['test_fmr']:>8.4g} {span(point['test_fmr_ci']):>19}  "
            f"{point['test_fnmr']:>8.4g} {span(point['test_fnmr_ci']):>19}  {point['in_sample_threshold']:>19.4f}"
        )
    test = document["test"]
    typer.echo(f"test equal error rate {document['equal_error_rate']:.4f} over {test['classes']} classes, "
               f"{test['positive_pairs']:,} genuine and {test['negative_pairs']:,} impostor pairs"
               + (" (sampled)" if test["sampled"] else ""))
