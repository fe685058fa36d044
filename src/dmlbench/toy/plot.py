"""``toy.png``: the layout of Roth et al. 2020 Fig. 6, one row per variant.

Columns: (1) the training lines (x) and test lines (o) of the first seed, coloured by class;
(2) the embeddings of the plain model of the first seed; (3...) the same for every regularised
model; (last) the singular-value spectra of the training embeddings, normalised to sum 1, mean over
seeds with every seed as a thin line. The embeddings lie on the unit circle, so a point is fully
described by its angle: the embedding panels show the angle of every point, one row per class
(test classes above, training classes below). A test class is separated when its row's angles do
not overlap those of the other test rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from dmlbench.files import atomic_write
from dmlbench.toy.results import ModelRun, ToyResult

TRAIN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
TEST_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf")


def _model_title(p_switch: float) -> str:
    return "plain (no regularisation)" if p_switch == 0 else f"rho-regularised, p_switch={p_switch:g}"


def _data_panel(axis, run: ModelRun) -> None:  # noqa: ANN001
    data = run.data
    for label, colour in enumerate(TRAIN_COLOURS):
        points = data.train_points[data.train_labels == label].numpy()
        axis.plot(points[:, 0], points[:, 1], "x", color=colour, markersize=4)
    for label, colour in enumerate(TEST_COLOURS):
        points = data.test_points[data.test_labels == label].numpy()
        axis.plot(points[:, 0], points[:, 1], "o", color=colour, markersize=4.5, markerfacecolor="none")
    axis.set_aspect("equal")
    axis.set_xlim(-1.3, 1.3)
    axis.set_ylim(-1.3, 1.3)
    axis.tick_params(labelsize=7)
    axis.set_title(f"{data.variant}, seed {run.seed}: training (x) and\ntest (o) lines, colour = class", fontsize=8)


def _embedding_panel(axis, run: ModelRun) -> None:  # noqa: ANN001
    """Angles of the embedded points on the unit circle, one row per class (test above, training below)."""
    rows = []
    for split, embeddings, labels, colours in (
        ("test", run.test_embeddings, run.data.test_labels, TEST_COLOURS),
        ("train", run.train_embeddings, run.data.train_labels, TRAIN_COLOURS),
    ):
        angles = np.degrees(np.arctan2(embeddings[:, 1].numpy(), embeddings[:, 0].numpy()))
        for label, colour in enumerate(colours):
            rows.append((f"{split} {label}", angles[labels.numpy() == label], colour, split))
    for height, (name, angles, colour, split) in enumerate(reversed(rows)):
        marker = "o" if split == "test" else "x"
        axis.plot(angles, np.full(len(angles), height), marker, color=colour, markersize=4,
                  markerfacecolor="none" if split == "test" else colour, alpha=0.85)
    axis.set_yticks(range(len(rows)), [name for name, *_ in reversed(rows)], fontsize=7)
    for tick, (_, _, colour, _) in zip(axis.get_yticklabels(), reversed(rows)):
        tick.set_color(colour)
    axis.axhline(len(rows) / 2 - 0.5, color="0.7", linewidth=0.6)
    axis.set_ylim(-0.7, len(rows) - 0.3)
    axis.set_xlabel("angle on the unit circle (degrees)", fontsize=7)
    axis.tick_params(axis="x", labelsize=7)
    axis.set_title(
        f"{_model_title(run.p_switch)}\nseed {run.seed}: test R@1 {run.recall_at_1:.2f}, rho {run.rho:.3f}",
        fontsize=8,
    )


def _spectrum_panel(axis, by_p: dict[float, list[ModelRun]]) -> None:  # noqa: ANN001
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    for index, (p_switch, runs) in enumerate(by_p.items()):
        colour = colours[index % len(colours)]
        spectra = np.array([np.asarray(run.singular_values) / np.sum(run.singular_values) for run in runs])
        positions = np.arange(1, spectra.shape[1] + 1) + (index - (len(by_p) - 1) / 2) * 0.06
        for spectrum in spectra:
            axis.plot(positions, spectrum, color=colour, linewidth=0.5, alpha=0.35)
        rho = np.mean([run.rho for run in runs])
        recall = np.mean([run.recall_at_1 for run in runs])
        name = "plain" if p_switch == 0 else f"p={p_switch:g}"
        axis.plot(positions, spectra.mean(axis=0), "o-", color=colour, linewidth=2,
                  label=f"{name}: mean rho {rho:.3f}, R@1 {recall:.2f}")
    axis.set_xticks([1, 2])
    axis.set_xlim(0.7, 2.3)
    axis.set_ylim(0, 1)
    axis.set_xlabel("singular value index", fontsize=8)
    axis.set_ylabel("normalised singular value", fontsize=8)
    axis.set_title("spectra of training embeddings\n(thin: seeds, thick: mean)", fontsize=8)
    axis.legend(fontsize=6, loc="upper right")
    axis.tick_params(labelsize=7)


def write_figure(result: ToyResult, path: Path) -> Path:
    """Draw ``result`` (Fig. 6 layout, one row per variant) and write it atomically as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    variants = list(result.runs)
    models = result.settings.models
    columns = len(models) + 2
    figure, axes = pyplot.subplots(
        len(variants), columns, figsize=(3.0 * columns, 3.6 * len(variants)), squeeze=False
    )
    for row, variant in enumerate(variants):
        by_p = result.runs[variant]
        _data_panel(axes[row][0], by_p[0.0][0])
        for column, p_switch in enumerate(models, start=1):
            _embedding_panel(axes[row][column], by_p[p_switch][0])
        _spectrum_panel(axes[row][-1], by_p)
    figure.suptitle(
        f"rho-regularisation toy example (Roth et al. 2020 Fig. 6 / supp. Fig. 12), "
        f"{result.settings.seeds} seeds; embeddings shown as their angle on the unit circle",
        fontsize=10,
    )
    figure.tight_layout()

    def save(stream: BinaryIO) -> None:
        figure.savefig(stream, format="png", dpi=110)

    try:
        atomic_write(Path(path), save)
    finally:
        pyplot.close(figure)
    return Path(path)
