"""The report's figures as PNG bytes (matplotlib, Agg): written beside the report and embedded in the HTML.

Every method has one colour and marker (``method_styles``) in the per-method figures.

* ``search.png``: the search objective over trials, per method (integer trial ticks);
* ``budget.png``: the expected best validation MAP@R after n trials ± its SD (Dodge et al. 2019), per method;
* ``validation_curves.png``: mean validation MAP@R of the reproductions' runs per evaluation;
* ``forest.png``: every trained method's test mean ± 95% interval (concatenated P@1 and MAP@R), sorted; the
  baselines, far below, would set its scale and are in the results table instead;
* ``differences.png``: the primary family's paired differences with their 95% intervals, the 90% interval
  TOST reads and the ±margin equivalence band, each labelled with its verdict: what the verdicts are about;
* ``rho_vs_precision_at_1.png``: rho and pi_ratio of the training embeddings against test P@1, one
  point per reproduction, with the least-squares line (seed 003 Fig. 5).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dmlbench.protocol.layout import (
    BASELINES,
    BUDGET_FIGURE,
    DIFFERENCES_FIGURE,
    FOREST_FIGURE,
    SEARCH_FIGURE,
    SEQUENTIAL_FIGURE,
    SPACE_FIGURE,
    VALIDATION_CURVES_FIGURE,
)
from dmlbench.report.analysis import SPACE_QUANTITIES, SpacePoint

Figure = tuple[str, str, bytes]  # title, file name, PNG


# Markers cycled beside the ten colours: 11 markers against 10 colours repeat a (colour, marker)
# pair only after 110 methods, and neighbours in the order differ in both.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
           "tab:olive", "tab:cyan")


def method_styles(methods: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each method's (colour, marker), the same in every figure; distinct pairs for up to 110 methods."""
    return {method: (COLOURS[index % len(COLOURS)], MARKERS[index % len(MARKERS)]) for index, method in enumerate(methods)}


def search_figure(methods: Sequence[str], trials: Mapping[str, list[dict[str, Any]]]) -> Figure:
    """The fold-mean validation MAP@R of every completed trial, per method, over the trial number."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4))
    draw_search(axes, methods, trials)
    return "Search objective over trials", SEARCH_FIGURE, _png(figure, pyplot)


def draw_search(axes: Any, methods: Sequence[str], trials: Mapping[str, list[dict[str, Any]]]) -> None:
    """``search_figure``'s axes: trial numbers are whole, so the x axis gets integer ticks only."""
    from matplotlib.ticker import MaxNLocator

    styles = method_styles(methods)
    for method in methods:
        points = [(t["number"], t["value"]) for t in trials.get(method, []) if t["state"] == "COMPLETE"]
        if points:
            numbers, values = zip(*points)
            colour, marker = styles[method]
            axes.plot(numbers, values, color=colour, marker=marker, label=method)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trial")
    axes.set_ylabel("fold-mean validation MAP@R")
    _legend(axes)


def budget_figure(methods: Sequence[str], rows: Sequence[Sequence[Any]]) -> Figure:
    """``budget.csv``'s search 0 per method: the expected best after n trials with a ±1 SD band."""
    from matplotlib.ticker import MaxNLocator

    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4))
    styles = method_styles(methods)
    for method in methods:
        points = [(int(row[2]), float(row[4]), float(row[5])) for row in rows if row[0] == method and row[1] == 0]
        if points:
            trials, mean, sd = (np.array(values) for values in zip(*points))
            colour, marker = styles[method]
            axes.plot(trials, mean, color=colour, marker=marker, label=method)
            axes.fill_between(trials, mean - sd, mean + sd, color=colour, alpha=0.15)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trials")
    axes.set_ylabel("expected best validation MAP@R")
    _legend(axes)
    return "Expected best validation score over the search budget", BUDGET_FIGURE, _png(figure, pyplot)


def curves_figure(methods: Sequence[str], curves: Mapping[str, list[list[float]]]) -> Figure:
    """``curves[method]``: the reproduction runs' validation MAP@R curves (evaluation 0 = untrained)."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4))
    styles = method_styles(methods)
    for method in methods:
        runs = [curve for curve in curves.get(method, []) if curve]
        if runs:
            length = max(len(curve) for curve in runs)
            mean = [float(np.mean([c[i] for c in runs if len(c) > i])) for i in range(length)]
            colour, marker = styles[method]
            axes.plot(range(length), mean, color=colour, marker=marker, markersize=4, label=method)
    axes.set_xlabel("evaluation (0 = untrained)")
    axes.set_ylabel("validation MAP@R (mean over reproduction runs)")
    _legend(axes)
    return "Validation curves of the reproductions", VALIDATION_CURVES_FIGURE, _png(figure, pyplot)


def forest_figure(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], titles: Mapping[str, str],
                  references: Sequence[str] = ()) -> Figure:
    """``rows``: ``results.csv`` rows; one panel per metric, concatenated mode, the trained methods sorted by the
    first metric's mean (the baselines left out: they would set the scale); dashed lines at the references' means."""
    pyplot = _pyplot()
    by_key = {(row["method"], row["metric"]): row for row in rows if row["mode"] == "concatenated"}
    methods = sorted({row["method"] for row in rows} - set(BASELINES),
                     key=lambda name: by_key.get((name, metrics[0]), {}).get("mean", 0.0))
    figure, panels = pyplot.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 0.32 * len(methods) + 1.4),
                                     sharey=True, squeeze=False)
    for axes, metric in zip(panels[0], metrics):
        for y, method in enumerate(methods):
            row = by_key.get((method, metric))
            if row is None:
                continue
            mean, low, high = (100 * row[key] for key in ("mean", "ci_low", "ci_high"))
            error = [[mean - low], [high - mean]] if np.isfinite(low) else None
            colour = "tab:red" if method in references else "tab:blue"
            axes.errorbar([mean], [y], xerr=error, fmt="o", color=colour, capsize=3, markersize=4)
        for reference in references:
            row = by_key.get((reference, metric))
            if row is not None:
                axes.axvline(100 * row["mean"], color="tab:red", linestyle="--", linewidth=0.8)
        axes.set_xlabel(f"test {titles[metric]} (%), concatenated", fontsize="medium")
        axes.grid(axis="x", alpha=0.3)
    panels[0][0].set_yticks(range(len(methods)), methods, fontsize="medium")
    return ("Methods' test means with 95% intervals (references in red; the baselines are in the results table)",
            FOREST_FIGURE, _png(figure, pyplot))


def differences_figure(comparisons: Sequence[Any], endpoint_title: str, margin: float, alpha: float) -> Figure:
    """The primary family's paired differences ``a - b`` (``statistics.PairedComparison``): the mean with its 95%
    interval (the t-test's), the 90% interval TOST reads (thick), the ±``margin`` equivalence band, and each
    comparison's verdict under its name."""
    from dmlbench.analysis.verdicts import equivalence_interval

    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(9.0, 0.6 * len(comparisons) + 1.8))
    axes.axvspan(-100 * margin, 100 * margin, color="tab:green", alpha=0.15, label=f"equivalence band ±{100 * margin:g}")
    axes.axvline(0.0, color="black", linewidth=0.8)
    for y, comparison in enumerate(comparisons):
        mean = 100 * comparison.mean_difference
        low, high = (100 * value for value in (comparison.difference_low, comparison.difference_high))
        tost_low, tost_high = (100 * value for value in equivalence_interval(comparison, alpha))
        if np.isfinite(low):
            axes.plot([low, high], [y, y], color="tab:blue", linewidth=1.2)
        if np.isfinite(tost_low):
            axes.plot([tost_low, tost_high], [y, y], color="tab:blue", linewidth=3.5, alpha=0.5)
        axes.plot([mean], [y], "o", color="tab:blue", markersize=5)
    axes.set_yticks(range(len(comparisons)), [f"{c.a} − {c.b}\n{c.outcome(alpha)}" for c in comparisons], fontsize="medium")
    axes.set_ylim(-0.7, len(comparisons) - 0.3)
    axes.set_xlabel(f"a − b, {endpoint_title} (points); thin: 95% interval, thick: 90% (TOST)", fontsize="medium")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(fontsize="small", loc="lower right")
    return ("The primary comparisons: paired differences, their intervals and the equivalence band", DIFFERENCES_FIGURE,
            _png(figure, pyplot))


def sequential_figure(judgement: Any, endpoint_title: str) -> Figure:
    """A sequential study's looks (``analysis.sequential.SequentialJudgement``): for each comparison, its estimate
    and repeated confidence interval at every look it was judged, the ±margin band, and its decision."""
    pyplot = _pyplot()
    pairs = list(dict.fromkeys((row.a, row.b) for row in judgement.rows))
    figure, panels = pyplot.subplots(len(pairs), 1, figsize=(8.0, 1.6 * len(pairs) + 0.8), squeeze=False, sharex=True)
    margin = 100 * judgement.design.margin
    for axes, pair in zip(panels[:, 0], pairs):
        rows = [row for row in judgement.rows if (row.a, row.b) == pair]
        searches = [row.searches for row in rows]
        axes.axhspan(-margin, margin, color="tab:green", alpha=0.15)
        axes.axhline(0.0, color="black", linewidth=0.8)
        for row in rows:
            if np.isfinite(row.ci_low) and np.isfinite(row.ci_high):
                axes.plot([row.searches, row.searches], [100 * row.ci_low, 100 * row.ci_high], color="tab:blue", linewidth=1.2)
        axes.plot(searches, [100 * row.estimate for row in rows], "o-", color="tab:blue", markersize=4)
        axes.set_title(f"{pair[0]} − {pair[1]}: {rows[-1].decision} at {rows[-1].searches} searches", fontsize="medium")
        axes.grid(alpha=0.3)
    panels[-1, 0].set_xlabel(f"searches per method; a − b, {endpoint_title} (points), with its repeated confidence interval "
                             f"at the comparison's Holm level; green: ±{margin:g}", fontsize="small")
    return ("The sequential study: each comparison's estimate and repeated interval at every look", SEQUENTIAL_FIGURE,
            _png(figure, pyplot))


def space_figure(points: Sequence[SpacePoint], mode: str = "separated", methods: Sequence[str] = ()) -> Figure:
    """rho and pi_ratio of the training embeddings against test P@1 (``mode``), one point per reproduction;
    ``methods``: the benchmark's order, so a method has the style it has in the other figures."""
    pyplot = _pyplot()
    figure, panels = pyplot.subplots(1, len(SPACE_QUANTITIES), figsize=(12, 4.5), squeeze=False)
    shown = {point.method for point in points}
    everyone = list(dict.fromkeys([*methods, *(point.method for point in points)]))
    styles = {method: style for method, style in method_styles(everyone).items() if method in shown}
    for axes, quantity in zip(panels[0], SPACE_QUANTITIES):
        used = [p for p in points if mode in p.scores and np.isfinite(getattr(p, quantity))]
        for method, (colour, marker) in styles.items():
            mine = [p for p in used if p.method == method]
            axes.scatter([getattr(p, quantity) for p in mine], [100 * p.scores[mode] for p in mine], s=22,
                         color=colour, marker=marker, label=method)
        if len(used) >= 2:
            x = np.array([getattr(p, quantity) for p in used])
            y = np.array([100 * p.scores[mode] for p in used])
            if np.ptp(x) > 0 and np.ptp(y) > 0:
                slope, intercept = np.polyfit(x, y, 1)
                grid = np.linspace(x.min(), x.max(), 50)
                axes.plot(grid, slope * grid + intercept, color="black", linewidth=1, label="least squares")
                axes.set_title(f"Pearson r = {np.corrcoef(x, y)[0, 1]:.2f} over {len(used)} reproductions", fontsize="medium")
        axes.set_xlabel({"rho": "rho (spectral decay, training classes)", "pi_ratio": "pi_ratio (training classes)"}[quantity])
        axes.set_ylabel(f"test P@1 (%), {mode}")
    panels[0][-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return f"rho and pi_ratio against test P@1 ({mode})", SPACE_FIGURE, _png(figure, pyplot)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _legend(axes: Any) -> None:
    """A legend of the methods drawn; none when nothing was (every method failed), instead of
    matplotlib's warning about an empty legend."""
    entries = len(axes.get_legend_handles_labels()[0])
    if entries:
        axes.legend(fontsize="small", ncol=1 if entries <= 8 else 2, loc="best")


def _png(figure: Any, pyplot: Any) -> bytes:
    stream = io.BytesIO()
    figure.tight_layout()
    figure.savefig(stream, format="png", dpi=80, metadata={"Software": None})
    pyplot.close(figure)
    return stream.getvalue()
