"""Plain-text tables of evaluation results."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _cell(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def format_table(columns: Mapping[str, Mapping[str, object]] | Mapping[str, object]) -> str:
    """Rows are metrics, columns are result sets (e.g. ``{"trained": ..., "untrained": ...}``).

    A flat ``{metric: value}`` mapping gives a single ``value`` column. Nested values that are not
    numbers (lists, mappings) are left out.
    """
    if all(not isinstance(value, Mapping) for value in columns.values()):
        columns = {"value": columns}
    columns = {name: column for name, column in columns.items() if isinstance(column, Mapping)}
    metrics: list[str] = []
    for column in columns.values():
        for metric, value in column.items():
            if metric not in metrics and isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics.append(metric)
    header = ["metric", *columns]
    rows = [[metric, *(_cell(column.get(metric, "")) for column in columns.values())] for metric in metrics]
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:]))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# The columns a run's results hold beside its trained scores, and the sections of ``dmlbench evaluate --json``.
RUN_EXTRAS = ("untrained", "reranked", "untrained_reranked", "cross_domain", "untrained_cross_domain")
SECTIONS = ("analysis", "verification", "open_set")


def evaluation_text(results: Mapping[str, Any], *, of_run: bool) -> list[str]:
    """What ``dmlbench evaluate`` prints of its ``results`` (the JSON it writes): the scores table, then the
    embedding-space analysis, verification and open set when ``results`` holds them, a blank line between."""
    lines: list[str] = []
    for section in EVALUATION_SECTIONS:
        shown = section_text(results, section, of_run=of_run)
        lines += ["", *shown] if lines and shown else shown
    return lines


# The order in which ``dmlbench evaluate`` computes and prints its results.
EVALUATION_SECTIONS = ("scores", *SECTIONS)


def section_text(results: Mapping[str, Any], section: str, *, of_run: bool) -> list[str]:
    """One of ``EVALUATION_SECTIONS`` of ``evaluation_text``; no lines where ``results`` does not hold it."""
    if section == "scores":
        return [_run_scores(results) if of_run else _stored_scores(results)]
    found = results.get(section)
    if not isinstance(found, Mapping):
        return []
    if section == "analysis":
        title = "train split" if of_run else "analysis"
        return [format_table({title: {key: value for key, value in found.items() if key != "singular_values"}})]
    return _verification(found) if section == "verification" else _open_set(found)


def _run_scores(results: Mapping[str, Any]) -> str:
    """A run's trained and untrained columns, re-ranked and cross-domain beside them when scored."""
    columns: dict[str, Any] = {"trained": {name: value for name, value in results.items() if name not in (*RUN_EXTRAS, *SECTIONS)}}
    if "reranked" in results:  # --rerank, or the run's config sets evaluation.rerank
        columns["trained, re-ranked"] = results["reranked"]
    columns["untrained"] = results.get("untrained", {})
    if "reranked" in results:
        columns["untrained, re-ranked"] = results["untrained_reranked"]
    if "cross_domain" in results:  # the run's config sets evaluation.cross_domain
        columns["trained, cross-domain"] = results["cross_domain"]
        columns["untrained, cross-domain"] = results["untrained_cross_domain"]
    return format_table(columns)


def _stored_scores(results: Mapping[str, Any]) -> str:
    """Stored embeddings' metrics: one column, or ``all`` with ``re-ranked`` and ``cross-domain`` beside it."""
    added = {title: results[name] for name, title in (("reranked", "re-ranked"), ("cross_domain", "cross-domain")) if name in results}
    metrics = {name: value for name, value in results.items() if name not in ("reranked", "cross_domain", *SECTIONS)}
    return format_table({"all": metrics, **added} if added else metrics)


def _verification(summary: Mapping[str, Any]) -> list[str]:
    """Thresholds and FNMR at the target FMRs, then the equal error rate with the pairs it rests on."""
    points = {f"FMR {point['target_fmr']:g}": {"threshold": point["threshold"], "fmr": point["fmr"], "fnmr": point["fnmr"]}
              for point in summary["operating_points"]}
    return [format_table(points), f"equal error rate {summary['equal_error_rate']:.4f} over {_pairs_used(summary, 'positive')} "
                                  f"and {_pairs_used(summary, 'negative')}"]


def _pairs_used(summary: Mapping[str, Any], kind: str) -> str:
    """``all 160,210 positive pairs`` or ``2,000,000 of 51,042,345 negative pairs (sampled without replacement, seed 0)``."""
    used, total = summary[f"{kind}_pairs"], summary[f"{kind}_pairs_total"]
    if used == total:
        return f"all {total:,} {kind} pairs"
    return f"{used:,} of {total:,} {kind} pairs (sampled without replacement, seed {summary['seed']})"


def _open_set(found: Mapping[str, Any]) -> list[str]:
    """DIR and FAR at the FAR targets and at the calibrated thresholds, with their 95% intervals."""

    def span(values: Any) -> str:
        return "[n/a]" if values is None else f"[{values[0]:.3f}, {values[1]:.3f}]"

    lines = [f"open set: {found['enrolled_classes']} enrolled classes ({found['gallery_items']} gallery items, "
             f"{found['known_queries']} known queries), {found['unknown_classes']} unknown classes "
             f"({found['unknown_queries']} queries); rank-1 identification {found['rank_1_identification_rate']:.4f}"]
    for point in [*found["at_far"], *found["at_calibrated_threshold"]]:
        at = f"FAR {point['target_far']:g}" if "target_far" in point else f"calibrated FMR {point['target_fmr']:g}"
        unreachable = "" if point.get("reachable", True) else " (too few unknown queries for this FAR)"
        lines.append(f"  {at:>22}: threshold {point['threshold']:.4f}  DIR {point['dir']:.4f} {span(point['dir_ci'])}"
                     f"  FAR {point['far']:.4f} {span(point['far_ci'])}{unreachable}")
    return lines
