"""Benchmark: ``dmlbench.evaluation.evaluate`` against pytorch-metric-learning's ``AccuracyCalculator``.

Self-retrieval on synthetic Stanford-Online-Products-sized data (N = 60,000 L2-normalised
embeddings, D = 128, ~12,000 classes of ~5), metrics precision@1, R-precision and MAP@R. The peer
uses its default exact faiss search (``IndexFlatL2``) with ``k="max_bin_count"``. Each side runs in
its own process so that its peak memory (max RSS) is its own; both report their metric values,
which must agree.

    python benchmarks/evaluation.py                  # N = 60,000
    python benchmarks/evaluation.py --n 200000       # memory stays bounded
    python benchmarks/evaluation.py --threads 1      # both sides on one thread
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

METRICS = {"precision_at_1": "precision_at_1", "r_precision": "r_precision", "map_at_r": "mean_average_precision_at_r"}


def make_data(n: int, dim: int, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class centres plus noise, L2-normalised, rows shuffled; labels ~``n / per_class`` classes."""
    rng = np.random.default_rng(seed)
    num_classes = n // per_class
    labels = rng.permutation(np.arange(n) % num_classes)
    centres = rng.standard_normal((num_classes, dim), dtype=np.float32)
    embeddings = centres[labels] + 1.4 * rng.standard_normal((n, dim), dtype=np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return embeddings, labels


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker(side: str, n: int, dim: int, per_class: int, seed: int, threads: int) -> dict[str, object]:
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from dmlbench.evaluation import evaluate

    embeddings, labels = make_data(n, dim, per_class, seed)
    baseline = _peak_rss_mb()
    start = time.perf_counter()
    if side == "dmlbench":
        result = evaluate(embeddings, labels, metrics=list(METRICS))
        values = {name: result[name] for name in METRICS}
    else:
        calculator = AccuracyCalculator(include=tuple(METRICS.values()), k="max_bin_count", device=torch.device("cpu"))
        result = calculator.get_accuracy(torch.from_numpy(embeddings), torch.from_numpy(labels))
        values = {name: result[peer_name] for name, peer_name in METRICS.items()}
    seconds = time.perf_counter() - start
    peak = _peak_rss_mb()
    return {"side": side, "seconds": seconds, "values": values, "peak_rss_mb": peak, "rss_above_data_mb": peak - baseline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-peer", action="store_true", help="time dmlbench only")
    parser.add_argument("--memory-limit-gb", type=float, default=16.0, help="address-space limit of each side")
    parser.add_argument("--worker", choices=["dmlbench", "peer"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.n, args.dim, args.per_class, args.seed, args.threads)))
        return

    sides = ["dmlbench"] if args.skip_peer else ["dmlbench", "peer"]
    reports = {}
    print(f"N={args.n} D={args.dim} classes={args.n // args.per_class} threads={args.threads}")
    for side in sides:
        command = [sys.executable, __file__, "--worker", side, "--n", str(args.n), "--dim", str(args.dim),
                   "--per-class", str(args.per_class), "--seed", str(args.seed), "--threads", str(args.threads)]
        limit = int(args.memory_limit_gb * 2**30)
        # An address-space limit turns a runaway allocation into a MemoryError instead of the OOM killer.
        completed = subprocess.run(command, capture_output=True, text=True, check=False,
                                   preexec_fn=lambda limit=limit: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
        if completed.returncode != 0:
            last = (completed.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{side:9s} failed under the {args.memory_limit_gb:g} GB address-space limit: {last}")
            continue
        reports[side] = json.loads(completed.stdout.strip().splitlines()[-1])
    for side, report in reports.items():
        print(f"{side:9s} {report['seconds']:8.2f} s  peak RSS {report['peak_rss_mb']:7.0f} MB "
              f"(+{report['rss_above_data_mb']:.0f} MB over the data)  {report['values']}")
    if len(reports) == 2:
        ours, peer = reports["dmlbench"], reports["peer"]
        print(f"time ratio dmlbench / peer = {ours['seconds'] / peer['seconds']:.3f}")
        differences = {name: abs(ours["values"][name] - peer["values"][name]) for name in METRICS}
        print(f"largest metric difference = {max(differences.values()):.3g}  {differences}")


if __name__ == "__main__":
    main()
