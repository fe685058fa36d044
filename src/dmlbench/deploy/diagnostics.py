"""What a person reads to understand a model's failures: per-query results on a run's test split as a CSV
file, and the worst queries with their neighbours as a page (``training.run_evaluation`` computes them)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from dmlbench.deploy.images import thumbnail_data_uri
from dmlbench.deploy.pages import Row, Thumbnails, Tile, write_page
from dmlbench.evaluation.per_query import PerQuery
from dmlbench.files import atomic_write
from dmlbench.training.run_evaluation import TestSplit

CSV_COLUMNS = ("query", "path", "label", "relevant", "first_correct_rank", "average_precision_at_r")


def write_per_query_csv(path: Path, diagnostics: PerQuery, names: list[str]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row, query in enumerate(diagnostics.query_ids.tolist()):
        ap = float(diagnostics.average_precision_at_r[row])
        writer.writerow([
            query, names[query], int(diagnostics.labels[row]), int(diagnostics.relevant[row]),
            int(diagnostics.first_correct_rank[row]), "" if ap != ap else f"{ap:.6f}",
        ])
    data = buffer.getvalue().encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: stream.write(data))


def write_worst_page(path: Path, diagnostics: PerQuery, split: TestSplit, count: int, title: str) -> None:
    """The ``count`` queries with the lowest AP@R, each beside its nearest neighbours."""
    thumbnails = Thumbnails()
    rows = []
    for position in diagnostics.worst(count).tolist():
        query = int(diagnostics.query_ids[position])
        label = int(diagnostics.labels[position])
        tiles = []
        for rank, (neighbour, distance) in enumerate(zip(diagnostics.neighbor_ids[position].tolist(),
                                                         diagnostics.neighbor_distances[position].tolist()), start=1):
            neighbour_label = int(split.labels[neighbour])
            tiles.append(Tile(_thumbnail(thumbnails, split, neighbour), f"#{rank} d={distance:.3f} label {neighbour_label}",
                              neighbour_label == label))
        heading = (
            f"{split.names[query]} (label {label}): AP@R {float(diagnostics.average_precision_at_r[position]):.3f}, "
            f"first correct neighbour at rank {int(diagnostics.first_correct_rank[position])} of R={int(diagnostics.relevant[position])}"
        )
        rows.append(Row(Tile(_thumbnail(thumbnails, split, query), "query"), tiles, heading))
    write_page(path, title, rows, note="Queries sorted by AP@R, lowest first; ties by first correct rank.")


def _thumbnail(thumbnails: Thumbnails, split: TestSplit, row: int) -> str | None:
    """Files by path; in-memory items straight from the split's own images."""
    found = thumbnails(split.names[row])
    if found is None and hasattr(split.items, "images"):
        return thumbnail_data_uri(split.items.images[row])
    return found
