"""Time and peak memory of re-ranking (query expansion, k-reciprocal) against the plain exact search.

Each case runs in a fresh process on synthetic clustered embeddings (``--dim`` 128, classes of
``--class-size`` images, like SOP's small classes), self-retrieval of every row with k = 10 (or the
largest class), and prints the wall seconds, the ratio to the plain exact search of the same rows
measured in the same run, and the process's peak resident memory above what the embeddings alone
take (so it can be held against an N x N float64 matrix: 28.8 GB at N = 60,000).

    python benchmarks/rerank.py                    # N = 10,000 and 60,000
    python benchmarks/rerank.py --sizes 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CASE = """
import json, resource, sys, time
import numpy as np, torch
from dmlbench.evaluation import rerank
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.neighbors import nearest_neighbors
size, dim, class_size, kind = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
generator = np.random.default_rng(0)
centres = generator.normal(size=(size // class_size + 1, dim))
labels = np.arange(size) // class_size
rows = torch.from_numpy(centres[labels] + 0.8 * generator.normal(size=(size, dim)))
everyone = torch.arange(size)
k = max(10, class_size)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
if kind == "none":
    found = nearest_neighbors(prepare(rows, normalize=True, binarize=False), everyone, everyone, k, exclude_self=True)
else:
    method = rerank.build(kind)
    found = rerank.reranked_neighbors(rows, everyone, everyone, k, exclude_self=True, method=method)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
hits = (torch.from_numpy(labels)[found.ids[:, 0]] == torch.from_numpy(labels)).double().mean().item()
print(json.dumps({"seconds": seconds, "peak_mb": (peak - before) / 1024, "precision_at_1": hits}))
"""


def run_case(size: int, dim: int, class_size: int, kind: str) -> dict[str, float]:
    output = subprocess.run([sys.executable, "-c", _CASE, str(size), str(dim), str(class_size), kind],
                            check=True, capture_output=True, text=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 60_000])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--class-size", type=int, default=6)
    arguments = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for size in arguments.sizes:
        plain = run_case(size, arguments.dim, arguments.class_size, "none")
        print(f"N = {size}: exact search {plain['seconds']:.1f} s, peak +{plain['peak_mb']:.0f} MB, "
              f"P@1 {plain['precision_at_1']:.4f}", flush=True)
        for kind in ("query_expansion", "k_reciprocal"):
            result = run_case(size, arguments.dim, arguments.class_size, kind)
            print(f"N = {size}: {kind} (default parameters) {result['seconds']:.1f} s "
                  f"({result['seconds'] / plain['seconds']:.1f}x the exact search), peak +{result['peak_mb']:.0f} MB "
                  f"(an N x N float64 matrix: {size * size * 8 / 2**20:.0f} MB), P@1 {result['precision_at_1']:.4f}",
                  flush=True)


if __name__ == "__main__":
    main()
