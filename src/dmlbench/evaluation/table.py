"""Plain-text tables of evaluation results."""

from __future__ import annotations

import math
from collections.abc import Mapping


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
