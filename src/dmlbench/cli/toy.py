"""``dmlbench toy``: the 2-D rho-regularisation toy example (Roth et al. 2020 Fig. 6, supp. G / Fig. 12).

torch, matplotlib and ``dmlbench.toy`` are imported inside the command only, so ``--help`` answers at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dmlbench.errors import UserInputError

SWEEP_TEXT = "0,0.001,0.01,0.1,0.3"  # dmlbench.toy.SWEEP, kept here so that --help needs no torch


def register(app: typer.Typer) -> None:
    app.command("toy")(toy_command)


def toy_command(
    output: Annotated[Path, typer.Option("--output", "-o", metavar="DIR", help="Directory for toy.json and toy.png.", show_default=False)],
    variant: Annotated[str, typer.Option("--variant", help="diagonal (Fig. 6), axes (supp. Fig. 12) or both.")] = "both",
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds 0..N-1 per model (N >= 2 for the 95% intervals).")] = 10,
    p_switch: Annotated[Optional[str], typer.Option("--p-switch", metavar="P[,P...]", help="p_switch of the regularised model, or a comma list of them (one model each). [default: 0.001]", show_default=False)] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help=f"Regularised models for p_switch = {SWEEP_TEXT} (instead of --p-switch).")] = False,
    iterations: Annotated[int, typer.Option("--iterations", help="Training iterations per model (the paper: 200).")] = 200,
) -> None:
    """Train the 2-D toy example with and without rho-regularisation; write DIR/toy.json and DIR/toy.png.

    Paper settings (Roth et al. 2020 supp. G): MLP 2-30-30-2 with the embedding L2-normalised onto
    the unit circle; four training and four test lines (classes) of 15 points; 200 iterations,
    batch size 24, learning rate 0.03, contrastive loss (supp. eq. 1) with margin 0.1; the
    regularised model switches a tuple's negative to a classmate with probability p_switch (0.001).

    Choices the paper leaves open, the same for every model: ReLU activations, PyTorch's default
    uniform initialisation; Adam (as in the paper's benchmarks); SPC-6 batches (4 classes x 6
    points); the random miner (one random positive and one random negative per anchor; a switch
    turns (a, p, n) into (a, a, classmate)); for one seed all models share initial weights,
    batches, line points and random tuples, so a switch is their only difference. Points are drawn
    uniformly along the segments, new for every seed.
    Lines: axes: training x = -0.75, -0.25, 0.25, 0.75 (vertical, y in [-1, 1]), test y = the same
    values (horizontal, x in [-1, 1]). diagonal: training lines along (1,1) at offsets -0.75..0.75
    along (-1,1); test lines along (-1,1) in a 2 x 2 grid (u = +-0.5 along (1,1), v in +-[0.1, 0.75]).

    Reported per model: rho of the training embeddings (embedding_space.analyze, drop=0: with a
    2-D embedding the default drop=1 leaves one singular value and rho would always be 0) and test
    Recall@1 (evaluation.evaluate, every test point a query against the other 59), per seed, mean
    and 95% Student-t interval, and the per-seed differences regularised - plain.
    """
    import torch

    from dmlbench import toy

    if sweep and p_switch is not None:
        raise UserInputError("give --p-switch or --sweep, not both")
    p_switches = toy.SWEEP if sweep else toy.parse_p_switches(p_switch if p_switch is not None else str(toy.DEFAULT_P_SWITCH))
    variants = toy.parse_variants(variant)
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest and leaves the other cores free
    result = toy.run(
        output, variants=variants, seeds=seeds, p_switches=p_switches, iterations=iterations,
        progress=lambda message: typer.echo(message, err=True),
    )
    typer.echo(toy.format_summary(result.summary))
    typer.echo(f"wrote {output / toy.JSON_FILE} and {output / toy.FIGURE_FILE}")
