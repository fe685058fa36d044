"""Benchmark: exact retrieval evaluation against pytorch-metric-learning and against a matrix-multiplication floor.

Self-retrieval on synthetic data (L2-normalised embeddings, classes of ``--per-class`` items),
metrics precision@1, R-precision and MAP@R. Each side runs in its own process, so that its peak
memory (max RSS) is its own, and reports the metric values, which must agree:

- ``dmlbench``: ``dmlbench.evaluation.evaluate`` in-process (the data is already in memory);
- ``cli``: ``dmlbench evaluate --embeddings E.npy --labels L.npy`` as a user runs it, interpreter
  start, imports and loading included;
- ``peer``: PML's ``AccuracyCalculator`` (exact faiss ``IndexFlatL2``, ``k="max_bin_count"``);
- ``floor``: the ``N x N`` float32 products every exact method computes (``torch.mm`` in tiles),
  timed on a sample of query tiles and scaled to all ``N`` queries.

With ``--kind ivf`` or ``--kind hnsw`` the dmlbench sides use the approximate faiss backend
(``faiss_approx`` / ``faiss_hnsw``) and the benchmark also measures its recall of the exact 10
nearest neighbours on 1,000 sampled queries. The last line is the ratio of the CLI (or, with
``--skip-cli``, the in-process evaluation) to the peer, or to the floor when the peer is skipped.

    python benchmarks/evaluation.py                                  # N = 60,000, all four sides
    python benchmarks/evaluation.py --n 1000000 --skip-peer --skip-cli   # a million, against the floor
    python benchmarks/evaluation.py --n 1000000 --kind ivf --skip-peer --skip-cli
    python benchmarks/evaluation.py --threads 1                      # every side on one thread
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

METRICS = {"precision_at_1": "precision_at_1", "r_precision": "r_precision", "map_at_r": "mean_average_precision_at_r"}
BACKENDS = {"exact": "torch", "ivf": "faiss_approx", "hnsw": "faiss_hnsw"}
RECALL_QUERIES, RECALL_K = 1000, 10


def make_data(n: int, dim: int, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class centres plus noise, L2-normalised, rows shuffled; labels ~``n / per_class`` classes."""
    rng = np.random.default_rng(seed)
    num_classes = n // per_class
    labels = rng.permutation(np.arange(n) % num_classes)
    embeddings = rng.standard_normal((num_classes, dim), dtype=np.float32)[labels]
    embeddings += 1.4 * rng.standard_normal((n, dim), dtype=np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return embeddings, labels


def _peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0


def _set_threads(threads: int) -> None:
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)


def floor_seconds(embeddings: np.ndarray, sample_queries: int = 16_384) -> float:
    """Seconds of the ``N x N`` products in float32 ``4096 x 4096`` tiles (the fastest of the tile sizes
    tried on this machine), timed on the first ``sample_queries`` queries after one untimed tile row,
    and scaled to all ``N`` queries."""
    import torch

    rows = torch.from_numpy(embeddings)
    tile = 4096
    sampled = min(len(rows), sample_queries)
    product = torch.empty(tile, tile)

    def products(queries: torch.Tensor) -> None:
        for start in range(0, len(rows), tile):
            references = rows[start:start + tile]
            torch.mm(queries, references.T, out=product[:len(queries), :len(references)])

    products(rows[:tile])  # warm-up: the output's pages, BLAS's buffers
    started = time.perf_counter()
    for first in range(0, sampled, tile):
        products(rows[first:first + tile])
    return (time.perf_counter() - started) * len(rows) / sampled


def recall_of_exact(embeddings: np.ndarray, backend: str, seed: int, nprobe: int | None) -> float:
    """Mean share of each sampled query's exact 10 nearest neighbours that ``backend`` returns."""
    import torch

    from dmlbench.evaluation.knn_index import prepare
    from dmlbench.evaluation.neighbors import nearest_neighbors

    space = prepare(torch.from_numpy(embeddings), normalize=True, binarize=False)
    generator = np.random.default_rng(seed)
    queries = torch.from_numpy(np.sort(generator.choice(len(embeddings), RECALL_QUERIES, replace=False)))
    references = torch.arange(len(embeddings))
    found = {
        name: nearest_neighbors(space, queries, references, RECALL_K, exclude_self=True, backend=name, seed=seed,
                                nprobe=nprobe).ids
        for name in ("torch", backend)
    }
    shared = [len(set(a) & set(b)) for a, b in zip(found["torch"].tolist(), found[backend].tolist())]
    return float(np.mean(shared)) / RECALL_K


def worker(side: str, args: argparse.Namespace) -> dict[str, object]:
    _set_threads(args.threads)
    embeddings, labels = make_data(args.n, args.dim, args.per_class, args.seed)
    baseline = _peak_rss_mb()
    report: dict[str, object] = {"side": side}
    started = time.perf_counter()
    if side == "dmlbench":
        from dmlbench.evaluation import evaluate

        result = evaluate(embeddings, labels, metrics=list(METRICS), backend=BACKENDS[args.kind], seed=args.seed,
                          nprobe=args.nprobe)
        report["values"] = {name: result[name] for name in METRICS}
    elif side == "peer":
        import torch
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        calculator = AccuracyCalculator(include=tuple(METRICS.values()), k="max_bin_count", device=torch.device("cpu"))
        result = calculator.get_accuracy(torch.from_numpy(embeddings), torch.from_numpy(labels))
        report["values"] = {name: result[peer_name] for name, peer_name in METRICS.items()}
    elif side == "floor":
        report["seconds"] = floor_seconds(embeddings)
    else:  # recall
        report["recall"] = recall_of_exact(embeddings, BACKENDS[args.kind], args.seed, args.nprobe)
    report.setdefault("seconds", time.perf_counter() - started)
    report["peak_rss_mb"] = _peak_rss_mb()
    report["rss_above_data_mb"] = report["peak_rss_mb"] - baseline
    return report


def run_cli(args: argparse.Namespace, limit: int) -> dict[str, object]:
    """``dmlbench evaluate`` on .npy files written beforehand (not timed), timed from process start to exit."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        embeddings, labels = make_data(args.n, args.dim, args.per_class, args.seed)
        np.save(directory / "embeddings.npy", embeddings)
        np.save(directory / "labels.npy", labels)
        del embeddings, labels
        command = [
            sys.executable, "-m", "dmlbench", "evaluate", "--embeddings", str(directory / "embeddings.npy"),
            "--labels", str(directory / "labels.npy"), "--metrics", ",".join(METRICS),
            "--backend", BACKENDS[args.kind], "--seed", str(args.seed), "--json", str(directory / "out.json"),
        ] + (["--nprobe", str(args.nprobe)] if args.nprobe is not None else [])
        environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        started = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True, check=False, env=environment,
                                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
        seconds = time.perf_counter() - started
        if completed.returncode != 0:
            raise RuntimeError((completed.stderr.strip().splitlines() or ["?"])[-1])
        values = json.loads((directory / "out.json").read_text())
    return {"side": "cli", "seconds": seconds, "values": {name: values[name] for name in METRICS},
            "peak_rss_mb": _peak_rss_mb(resource.RUSAGE_CHILDREN), "rss_above_data_mb": float("nan")}


def run_side(side: str, args: argparse.Namespace) -> dict[str, object] | None:
    limit = int(args.memory_limit_gb * 2**30)
    try:
        if side == "cli":
            return run_cli(args, limit)
        command = [sys.executable, __file__, "--worker", side, *sys.argv[1:]]
        # An address-space limit turns a runaway allocation into a MemoryError instead of the OOM killer.
        completed = subprocess.run(command, capture_output=True, text=True, check=False,
                                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
        if completed.returncode != 0:
            raise RuntimeError((completed.stderr.strip().splitlines() or ["?"])[-1])
        return json.loads(completed.stdout.strip().splitlines()[-1])
    except RuntimeError as error:
        print(f"{side:9s} failed under the {args.memory_limit_gb:g} GB address-space limit: {error}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kind", choices=list(BACKENDS), default="exact", help="exact, or an approximate faiss index")
    parser.add_argument("--nprobe", type=int, help="inverted lists probed with --kind ivf (default: an eighth of them)")
    parser.add_argument("--skip-peer", action="store_true", help="leave out pytorch-metric-learning")
    parser.add_argument("--skip-cli", action="store_true", help="leave out the command line")
    parser.add_argument("--memory-limit-gb", type=float, default=16.0, help="address-space limit of each side")
    parser.add_argument("--worker", choices=["dmlbench", "peer", "floor", "recall"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    sides = ["floor", "dmlbench"] + ["cli"] * (not args.skip_cli) + ["peer"] * (not args.skip_peer)
    sides += ["recall"] * (args.kind != "exact")
    print(f"N={args.n} D={args.dim} classes={args.n // args.per_class} threads={args.threads} kind={args.kind}")
    reports = {side: report for side in sides if (report := run_side(side, args)) is not None}
    for side, report in reports.items():
        extra = f"recall@{RECALL_K} of the exact neighbours {report['recall']:.4f}" if side == "recall" else report.get("values", "")
        print(f"{side:9s} {report['seconds']:8.2f} s  peak RSS {report['peak_rss_mb']:7.0f} MB  {extra}")
    valued = [report for report in reports.values() if "values" in report]
    if len(valued) > 1:
        largest = max(abs(a["values"][m] - b["values"][m]) for a in valued for b in valued for m in METRICS)
        print(f"largest metric difference between sides = {largest:.3g}")
    ours = reports.get("cli") or reports.get("dmlbench")
    if ours is None:
        return
    if "dmlbench" in reports and "floor" in reports:
        print(f"time ratio dmlbench / floor = {reports['dmlbench']['seconds'] / reports['floor']['seconds']:.3f}")
    if "peer" in reports:
        if "dmlbench" in reports and "cli" in reports:
            print(f"time ratio dmlbench (in-process) / peer = {reports['dmlbench']['seconds'] / reports['peer']['seconds']:.3f}")
        print(f"time ratio {ours['side']} / peer = {ours['seconds'] / reports['peer']['seconds']:.3f}")
    elif "floor" in reports and ours["side"] == "cli":
        print(f"time ratio cli / floor = {ours['seconds'] / reports['floor']['seconds']:.3f}")


if __name__ == "__main__":
    main()
