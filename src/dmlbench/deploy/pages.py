"""Static HTML pages of queries and their neighbours (thumbnails embedded, no server, no script)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dmlbench.data.base import ImageDataset
from dmlbench.deploy.images import thumbnail_data_uri
from dmlbench.files import atomic_write


@dataclass(frozen=True)
class Tile:
    """One picture on a page: a thumbnail (``None``: no image available), a caption, and whether it is
    a correct neighbour (``None`` for the query itself, or when labels are unknown)."""

    thumbnail: str | None
    caption: str
    correct: bool | None = None


@dataclass(frozen=True)
class Row:
    """A query and its neighbours; ``verdict`` says whether a calibrated threshold found a match
    (``matched``: ``None`` when no threshold was applied)."""

    query: Tile
    neighbors: list[Tile]
    heading: str
    verdict: str = ""
    matched: bool | None = None


class Thumbnails:
    """Thumbnails of items named by a file path, or ``<dataset>:<index>`` for in-memory datasets."""

    def __init__(self, dataset: ImageDataset | None = None) -> None:
        self.dataset = dataset
        self._made: dict[str, str | None] = {}

    def __call__(self, item: str) -> str | None:
        # An item shown several times on one page is encoded once.
        if item not in self._made:
            self._made[item] = self._make(item)
        return self._made[item]

    def _make(self, item: str) -> str | None:
        path = Path(item)
        if path.is_file():
            return thumbnail_data_uri(path)
        name, _, position = item.rpartition(":")
        if self.dataset is not None and name == self.dataset.name and position.isdigit():
            index = int(position)
            if index < len(self.dataset):
                return thumbnail_data_uri(self.dataset.images[index])
        return None


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1em; margin: 1.2em 0 0.4em; }
.row { display: flex; gap: 10px; align-items: flex-start; }
.tile { width: 104px; text-align: center; font-size: 11px; word-break: break-all; }
.tile img, .tile .missing { width: 96px; height: 96px; object-fit: contain; border: 4px solid #ccc; background: #eee; }
.missing { display: flex; align-items: center; justify-content: center; color: #888; }
.query img, .query .missing { border-color: #4363d8; }
.correct img, .correct .missing { border-color: #2a9d3a; }
.wrong img, .wrong .missing { border-color: #d62728; }
.legend span { display: inline-block; margin-right: 1.2em; }
.verdict { margin: 0 0 0.4em; font-weight: bold; } .verdict.match { color: #2a9d3a; } .verdict.nomatch { color: #d62728; }
"""


def write_page(path: Path, title: str, rows: Sequence[Row], note: str = "") -> None:
    """Write the page atomically: one row per query, the query first, its neighbours in rank order."""
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if note:
        parts.append(f"<p>{html.escape(note)}</p>")
    parts.append(
        '<p class="legend"><span style="color:#4363d8">&#9632; query</span>'
        '<span style="color:#2a9d3a">&#9632; same label</span><span style="color:#d62728">&#9632; other label</span></p>'
    )
    for row in rows:
        verdict = f'<p class="verdict {"match" if row.matched else "nomatch"}">{html.escape(row.verdict)}</p>' if row.verdict else ""
        parts.append(f"<h2>{html.escape(row.heading)}</h2>{verdict}<div class=\"row\">")
        parts.append(_tile(row.query, "query"))
        for tile in row.neighbors:
            parts.append(_tile(tile, "" if tile.correct is None else ("correct" if tile.correct else "wrong")))
        parts.append("</div>")
    parts.append("</body></html>\n")
    text = "\n".join(parts).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: stream.write(text))


def _tile(tile: Tile, css_class: str) -> str:
    picture = (
        f'<img src="{tile.thumbnail}" alt="{html.escape(tile.caption)}">' if tile.thumbnail
        else '<div class="missing">no image</div>'
    )
    return f'<div class="tile {css_class}">{picture}<div>{html.escape(tile.caption)}</div></div>'
