"""What a person reads to understand a model's failures: per-query results on a run's test split as a CSV
file, and the worst queries with their neighbours as a page (``evaluation.per_query`` computes them)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from torch import Tensor

from dmlbench.deploy.images import thumbnail_data_uri
from dmlbench.deploy.pages import Row, Thumbnails, Tile, write_page
from dmlbench.evaluation.per_query import PerQuery
from dmlbench.files import atomic_write
from dmlbench.training.run_evaluation import TestSplit

CSV_COLUMNS = ("query", "path", "label", "relevant", "first_correct_rank", "average_precision_at_r")


def write(found: PerQuery, split: TestSplit, csv_path: Path | None, worst: Tensor | None, page_path: Path | None,
          title: str) -> list[str]:
    """The per-query CSV at ``csv_path`` and the page of the ``worst`` queries (positions into ``found``, lowest
    AP@R first) at ``page_path``, each where given; a line per file written. Both are made before either
    is written."""
    rows = None if worst is None or page_path is None else _worst_rows(found, split, worst)
    table = None if csv_path is None else _per_query_csv(found, split.names)
    written = []
    if rows is not None and page_path is not None:
        write_page(page_path, title, rows, note="Queries sorted by AP@R, lowest first; ties by first correct rank.")
        written.append(f"worst queries: {page_path}")
    if table is not None and csv_path is not None:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(csv_path, lambda stream: stream.write(table))
        written.append(f"per-query results: {csv_path} ({len(found.query_ids)} queries)")
    return written


def _per_query_csv(diagnostics: PerQuery, names: list[str]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row, query in enumerate(diagnostics.query_ids.tolist()):
        ap = float(diagnostics.average_precision_at_r[row])
        writer.writerow([
            query, names[query], int(diagnostics.labels[row]), int(diagnostics.relevant[row]),
            int(diagnostics.first_correct_rank[row]), "" if ap != ap else f"{ap:.6f}",
        ])
    return buffer.getvalue().encode()


def _worst_rows(diagnostics: PerQuery, split: TestSplit, worst: Tensor) -> list[Row]:
    """The ``worst`` queries, each beside its nearest neighbours."""
    thumbnails = Thumbnails()
    rows = []
    for position in worst.tolist():
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
    return rows


def _thumbnail(thumbnails: Thumbnails, split: TestSplit, row: int) -> str | None:
    """Files by path; in-memory items straight from the split's own images."""
    found = thumbnails(split.names[row])
    if found is None and hasattr(split.items, "images"):
        return thumbnail_data_uri(split.items.images[row])
    return found
