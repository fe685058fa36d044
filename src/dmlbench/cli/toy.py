"""``dmlbench toy``: the 2-D rho-regularisation toy example (Roth et al. 2020 Fig. 6, supp. G / Fig. 12).

torch, matplotlib and ``dmlbench.toy`` are imported inside the command only, so ``--help`` answers at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.cli.common import QUIET_HELP, Command, require_creatable_directory
from dmlbench.errors import UserInputError

SWEEP_TEXT = "0,0.001,0.01,0.1,0.3"  # dmlbench.toy.SWEEP, kept here so that --help needs no torch


def register(app: typer.Typer) -> None:
    app.command("toy", cls=Command)(toy_command)


def toy_command(
    output: Annotated[Path, typer.Option("--output", "-o", metavar="DIR", help="Directory for toy.json and toy.png.", show_default=False)],
    variant: Annotated[str, typer.Option("--variant", metavar="VARIANT", help="diagonal (Fig. 6), axes (supp. Fig. 12) or both.")] = "both",
    seeds: Annotated[int, typer.Option("--seeds", metavar="N", help="Seeds 0..N-1 per model (N >= 2 for the 95% intervals).")] = 10,
    p_switch: Annotated[Optional[str], typer.Option("--p-switch", metavar="P[,P...]", help="p_switch of the regularised model, or a comma list of them (one model each). [default: 0.001]", show_default=False)] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help=f"Regularised models for p_switch = {SWEEP_TEXT} (instead of --p-switch).")] = False,
    iterations: Annotated[int, typer.Option("--iterations", metavar="N", help="Training iterations per model (the paper: 200).")] = 200,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
) -> None:
    """Train the 2-D toy example with and without rho-regularisation; write DIR/toy.json and DIR/toy.png.

    The paper's settings (Roth et al. 2020 supp. G), the choices it leaves open and what is
    reported: docs/usage.md, "The toy example".

    Exit codes: 0 trained, 1 a write failed for lack of space, 2 bad input, 130 interrupted by
    Ctrl-C, 143 by SIGTERM.
    """
    require_creatable_directory(output, "--output")  # before torch is imported
    import torch

    from dmlbench import toy

    if sweep and p_switch is not None:
        raise UserInputError("give --p-switch or --sweep, not both")
    p_switches = toy.SWEEP if sweep else toy.parse_p_switches(p_switch if p_switch is not None else str(toy.DEFAULT_P_SWITCH))
    variants = toy.parse_variants(variant)
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest and leaves the other cores free
    result = toy.run(
        output, variants=variants, seeds=seeds, p_switches=p_switches, iterations=iterations,
        progress=None if quiet else lambda message: typer.echo(message, err=True),
    )
    typer.echo(toy.format_summary(result.summary))
    typer.echo(f"wrote {output / toy.JSON_FILE} and {output / toy.FIGURE_FILE}")
