"""The report's sections (``report.sections``) as a Markdown file and as a self-contained HTML page."""

from __future__ import annotations

import base64
import html
import re

from dmlbench.report.sections import TITLE, Section, Table

CSS = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}th,td{border-bottom:1px solid #ccc;padding:.3rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}th{border-bottom:2px solid #444}img{max-width:100%}code{background:#f3f3f3}"""


def markdown(sections: list[Section]) -> str:
    """``report.md``: the figures linked as the PNG files written beside it."""
    lines = [f"# {TITLE}", ""]
    for section in sections:
        if section.title is not None:
            lines += [f"## {section.title}", ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        if section.bullets:
            lines += [f"- {bullet}" for bullet in section.bullets] + [""]
        for table in section.tables:
            lines += _markdown_table(table) + [""]
        for paragraph in section.after:
            lines += [paragraph, ""]
        lines += [f"![{title}]({name})\n" for title, name, _ in section.figures]
    return "\n".join(lines).rstrip("\n") + "\n"


def html_page(sections: list[Section]) -> str:
    """``report.html``: inline CSS, the figures embedded as base64 PNG, so the one file is the whole report."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{TITLE}</title>",
             f"<style>{CSS}</style></head><body><h1>{TITLE}</h1>"]
    for section in sections:
        if section.title is not None:
            parts.append(f"<h2>{inline_html(section.title)}</h2>")
        parts += [f"<p>{inline_html(paragraph)}</p>" for paragraph in section.paragraphs]
        if section.bullets:
            parts.append("<ul>" + "".join(f"<li>{inline_html(bullet)}</li>" for bullet in section.bullets) + "</ul>")
        parts += [_html_table(table) for table in section.tables]
        parts += [f"<p>{inline_html(paragraph)}</p>" for paragraph in section.after]
        for title, _, png in section.figures:
            image = base64.b64encode(png).decode()
            parts.append(f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{image}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _markdown_table(table: Table) -> list[str]:
    header, rows = table
    escape = lambda cell: str(cell).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in rows]
    return lines


def _html_table(table: Table) -> str:
    header, rows = table
    head = "".join(f"<th>{inline_html(str(cell))}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{inline_html(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# Emphasis as Markdown's rule has it (the opening ``*`` followed and the closing one preceded by a
# non-space), and further neither ``*`` inside a word, so that a product ``a*b*c`` or a ``p*`` stays
# literal. The text is already escaped, so the span holds no raw ``<``.
_EMPHASIS = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_CODE = "\0{}\0"  # a placeholder for a code span, which emphasis must not enter; NUL never occurs in the text


def inline_html(text: str) -> str:
    """Markdown's inline code spans as ``<code>`` and ``*emphasis*`` as ``<em>``; everything else escaped."""
    pieces = html.escape(text).split("`")
    if len(pieces) % 2 == 0:  # an unmatched backtick is a literal one
        pieces[-2:] = [pieces[-2] + "`" + pieces[-1]]
    codes = pieces[1::2]
    marked = "".join(_CODE.format(index // 2) if index % 2 else piece for index, piece in enumerate(pieces))
    marked = _EMPHASIS.sub(r"<em>\1</em>", marked)
    return re.sub("\0([0-9]+)\0", lambda match: f"<code>{codes[int(match.group(1))]}</code>", marked)
