"""Where a model's nearest-neighbour errors fall on a dataset whose images carry a domain (emoji: the
vendor that drew the image), so that the gap between all-versus-all and cross-domain P@1 can be read:

    python results/domain_errors.py RUN [RUN ...] [--untrained] [--reuse CSV] -o CSV

Each RUN is a training run directory (its best checkpoint embeds the test split) or a benchmark's
reproduction directory (``METHOD/reproduction_NN``: its fold models' test embeddings, each
L2-normalised, concatenated, as the protocol's concatenated mode scores them). ``--untrained`` adds
each run's model as initialised (a single run only). The test split is read after the study: this
chooses nothing.

Reproductions of a method given together also get one row per domain of their means
(``METHOD (mean of N reproductions)``). Per model and query domain (and ``all``): the queries,
all-versus-all P@1 (every other test image is a candidate), cross-domain P@1 (only the other
domains' images are), the all-versus-all top-1 errors, the share of those whose wrong neighbour has
the query's own domain, what that share would be by chance (the share of the query's own domain
among its candidates of other classes, averaged over the erring queries), and the share of the
errors that the cross-domain list answers right. ``--reuse CSV`` (an earlier output of this script)
copies the rows of the models it already holds instead of embedding them again (each was checked
when it was computed), so a long list of reproductions can be completed in steps; the output is
rewritten after every model, so a list that was interrupted resumes with ``--reuse`` of its output.
Neighbours come from the exact search ``dmlbench.evaluate`` uses (``evaluation.neighbors``: float64
distance on L2-normalised embeddings, ties broken by index); both P@1 values are checked against
``dmlbench.evaluate`` before anything is written. Columns: model, domain, queries,
precision_at_1_all, precision_at_1_cross_domain, wrong_top1, wrong_top1_own_domain,
own_domain_among_wrong_candidates, wrong_top1_right_cross_domain.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

import numpy as np
import torch

COLUMNS = ["model", "domain", "queries", "precision_at_1_all", "precision_at_1_cross_domain", "wrong_top1",
           "wrong_top1_own_domain", "own_domain_among_wrong_candidates", "wrong_top1_right_cross_domain"]
COUNTS = {2, 5}  # the columns that count (queries, wrong_top1); the others are shares


def nearest(embeddings: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest other row, and its nearest row of another domain (-1 when there is none),
    by the exact search ``dmlbench.evaluate`` uses (float64 distance on L2-normalised rows, then index)."""
    from dmlbench.evaluation.knn_index import prepare
    from dmlbench.evaluation.neighbors import nearest_neighbors

    space = prepare(torch.as_tensor(embeddings, dtype=torch.float64), normalize=True, binarize=False)
    everyone = torch.arange(space.num_rows)
    any_other = nearest_neighbors(space, everyone, everyone, 1, exclude_self=True).ids[:, 0].numpy()
    if len(np.unique(codes)) < 2:
        return any_other, np.full(len(any_other), -1)
    domains = torch.as_tensor(codes, dtype=torch.int64)
    other_domain = nearest_neighbors(space, everyone, everyone, 1, exclude_self=True, domains=domains).ids[:, 0].numpy()
    return any_other, other_domain


def error_rows(model: str, embeddings: np.ndarray, labels: np.ndarray, domains: np.ndarray) -> list[list[object]]:
    """One row per query domain and one for ``all`` (``COLUMNS``); queries without another-domain
    neighbour count as wrong cross-domain (the emoji test split has none)."""
    names, codes = np.unique(domains, return_inverse=True)
    any_other, other_domain = nearest(embeddings, codes)
    right_all = labels[any_other] == labels
    right_cross = (other_domain >= 0) & (labels[np.maximum(other_domain, 0)] == labels)
    own = codes[any_other] == codes
    # By chance: of a query's candidates of other classes, the share drawn in its own domain.
    pair_counts = np.zeros((codes.max() + 1, labels.max() + 1), dtype=np.int64)
    np.add.at(pair_counts, (codes, labels), 1)
    candidates = len(labels) - pair_counts.sum(axis=0)[labels]
    own_candidates = pair_counts.sum(axis=1)[codes] - pair_counts[codes, labels]
    chance = own_candidates / np.maximum(candidates, 1)
    rows = []
    for name, members in [*((str(n), codes == c) for c, n in enumerate(names)), ("all", np.ones(len(labels), bool))]:
        wrong = members & ~right_all
        shares = [round(float(own[wrong].mean()), 6), round(float(chance[wrong].mean()), 6),
                  round(float(right_cross[wrong].mean()), 6)] if wrong.any() else ["", "", ""]
        rows.append([model, name, int(members.sum()), round(float(right_all[members].mean()), 6),
                     round(float(right_cross[members].mean()), 6), int(wrong.sum()), *shares])
    return rows


def test_embeddings(directory: Path, untrained: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embeddings, labels and domains of the test split for a run directory or a reproduction directory."""
    from dmlbench.evaluation import concatenate
    from dmlbench.protocol.units.reproductions import fold_test_embeddings
    from dmlbench.training.runs import Run, embed_test_split, run_test_domains

    if (directory / "run.json").is_file():
        embeddings, labels = embed_test_split(directory, untrained=untrained)
        return embeddings.numpy(), labels.numpy(), np.asarray(run_test_domains(directory))
    folds = sorted(path for path in directory.glob("fold_*") if (path / "run.json").is_file())
    if not folds or untrained:
        raise SystemExit(f"{directory}: not a run directory{'' if untrained else ' nor a reproduction with fold runs'}"
                         f"{' (--untrained takes run directories)' if untrained and folds else ''}")
    embeddings, labels = fold_test_embeddings([Run.open(fold) for fold in folds])
    return concatenate(embeddings.values()).numpy(), labels.numpy(), np.asarray(run_test_domains(folds[0]))


def method_means(rows: list[list[object]]) -> list[list[object]]:
    """For the reproductions of a method (``METHOD/reproduction_NN``) given together, one row per domain
    with each column's mean over them (``METHOD (mean of N reproductions)``; a share is averaged over
    the reproductions that had an error to share)."""
    groups: dict[tuple[str, str], list[list[object]]] = {}
    for row in rows:
        path = Path(str(row[0]))
        if path.name.startswith("reproduction_"):
            groups.setdefault((path.parent.name, str(row[1])), []).append(row)
    means = []
    for (method, domain), members in groups.items():
        columns = []
        for index in range(2, len(COLUMNS)):
            values = [float(member[index]) for member in members if member[index] != ""]
            columns.append(round(sum(values) / len(values), 6) if values else "")
        means.append([f"{method} (mean of {len(members)} reproduction{'s' if len(members) != 1 else ''})", domain, *columns])
    return means


def read_rows(path: Path) -> dict[str, list[list[object]]]:
    """The per-model rows of an earlier output (``--reuse``), by model, with the types ``error_rows``
    gives them; the per-method mean rows are left out (they are recomputed)."""
    with path.open(newline="") as stream:
        table = list(csv.reader(stream))
    if not table or table[0] != COLUMNS:
        raise SystemExit(f"{path}: not an output of domain_errors.py (its header is not {','.join(COLUMNS)})")
    rows: dict[str, list[list[object]]] = {}
    for line in table[1:]:
        if " (mean of " in line[0]:
            continue
        rows.setdefault(line[0], []).append(
            [*line[:2], *(int(value) if index in COUNTS else float(value) if value else ""
                         for index, value in enumerate(line[2:], start=2))])
    return rows


def write_rows(path: Path, rows: list[list[object]]) -> None:
    """The per-model rows and their method means as CSV, replacing ``path`` atomically."""
    from dmlbench.files import atomic_write_text

    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([*rows, *method_means(rows)])
    atomic_write_text(path, stream.getvalue())


def check_against_evaluate(row: list[object], embeddings: np.ndarray, labels: np.ndarray, domains: np.ndarray) -> None:
    """The ``all`` row's two P@1 values are ``dmlbench.evaluate``'s, to the rounding of the CSV."""
    from dmlbench import evaluate

    codes = np.unique(domains, return_inverse=True)[1]
    expected = (evaluate(embeddings, labels, metrics=["precision_at_1"])["precision_at_1"],
                evaluate(embeddings, labels, metrics=["precision_at_1"], domains=codes)["precision_at_1"])
    if abs(row[3] - expected[0]) > 1e-6 or abs(row[4] - expected[1]) > 1e-6:
        raise SystemExit(f"{row[0]}: P@1 {row[3]} / {row[4]} differs from dmlbench.evaluate's {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    parser.add_argument("--untrained", action="store_true", help="also each run's model as initialised")
    parser.add_argument("--reuse", type=Path, metavar="CSV", help="copy the rows of the models an earlier output holds")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="CSV")
    args = parser.parse_args(argv)
    from dmlbench.errors import UserInputError

    known = read_rows(args.reuse) if args.reuse else {}
    rows: list[list[object]] = []
    for directory in args.runs:
        for untrained in (False, True) if args.untrained else (False,):
            model = f"{directory}{' (untrained)' if untrained else ''}"
            if model in known:
                rows += known[model]
                continue
            try:
                embeddings, labels, domains = test_embeddings(directory, untrained)
            except UserInputError as error:  # e.g. the run's data.root, relative to this folder, is not here
                print(f"domain_errors.py: error: {directory}: {error}", file=sys.stderr)
                return 2
            model_rows = error_rows(model, embeddings, labels, domains)
            check_against_evaluate(model_rows[-1], embeddings, labels, domains)
            rows += model_rows
            write_rows(args.output, rows)  # after every model: an interrupted list resumes with --reuse
    write_rows(args.output, rows)
    rows += method_means(rows)
    for row in rows:
        if row[1] == "all":
            print(f"{row[0]}: P@1 {100 * row[3]:.2f} all vs all, {100 * row[4]:.2f} cross-domain; "
                  f"{row[5]} wrong top-1, {100 * float(row[6] or 0):.1f}% of them of the query's own domain "
                  f"({100 * float(row[7] or 0):.1f}% by chance)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
