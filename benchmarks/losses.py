"""Time forward+backward of every registered loss and every miner against pytorch-metric-learning.

    python benchmarks/losses.py                      # batch 32 and 256, D=128, CPU
    python benchmarks/losses.py --device cuda --json timings.json

Batches are class-balanced (4 samples per class, so 8 and 64 classes), embeddings L2-normalised;
losses that take ``num_classes`` get the number of classes in the batch. Tuple-based losses run
without a miner (every valid tuple of the batch), like PML losses without an ``indices_tuple``.
Each time is the median of repeated runs after one warm-up; ratio = dmlbench / PML (< 1: faster).
PML's settings mirror our defaults (the seed values); differences that change the work done are
noted in ``PML_LOSSES`` / ``PML_MINERS``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners
from pytorch_metric_learning.distances import SNRDistance
from pytorch_metric_learning.reducers import MeanReducer

import dmlbench.losses as losses
import dmlbench.mining as mining

# name -> PML factory(num_classes, embedding_dim) with the settings of our defaults
PML_LOSSES: dict[str, Callable[[int, int], torch.nn.Module]] = {
    "contrastive": lambda c, d: pml_losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0, reducer=MeanReducer()),
    "triplet": lambda c, d: pml_losses.TripletMarginLoss(margin=0.2, reducer=MeanReducer()),
    # PML works on all triplets (b^3), ours on all pairs (b^2) of the batch
    "margin": lambda c, d: pml_losses.MarginLoss(margin=0.2, beta=1.2, learn_beta=True),
    # eq. 15's ranking term; PML has no SNR triplet loss with the zero-mean regulariser
    "snr": lambda c, d: pml_losses.TripletMarginLoss(margin=0.2, distance=SNRDistance(), reducer=MeanReducer()),
    "multi_similarity": lambda c, d: pml_losses.MultiSimilarityLoss(alpha=2, beta=40, base=0.5),
    "lifted_structure": lambda c, d: pml_losses.LiftedStructureLoss(neg_margin=1.0, pos_margin=0.0),
    "generalized_lifted_structure": lambda c, d: pml_losses.GeneralizedLiftedStructureLoss(
        neg_margin=1.0, pos_margin=0.0
    ),
    # PML keeps one (anchor, positive) pair per class and a [classes, classes] softmax; ours sums over
    # every ordered positive pair against all b negatives ([b, b] products) plus the embedding regulariser
    "npairs": lambda c, d: pml_losses.NPairsLoss(),
    "nt_xent": lambda c, d: pml_losses.NTXentLoss(temperature=0.07),
    # PML: one positive pair per class; ours: every ordered positive pair, plus the N-pair term and regulariser
    "angular": lambda c, d: pml_losses.AngularLoss(alpha=45),
    # ours scales unit vectors by 3 before squared distances, i.e. PML's softmax_scale = 3^2
    "proxy_nca": lambda c, d: pml_losses.ProxyNCALoss(c, d, softmax_scale=9),
    "proxy_anchor": lambda c, d: pml_losses.ProxyAnchorLoss(c, d, margin=0.1, alpha=32),
    "normalized_softmax": lambda c, d: pml_losses.NormalizedSoftmaxLoss(c, d, temperature=0.05),
    "cosface": lambda c, d: pml_losses.CosFaceLoss(c, d, margin=0.35, scale=64),
    "arcface": lambda c, d: pml_losses.ArcFaceLoss(c, d, margin=math.degrees(0.5), scale=16),
    # ours adds eq. 18's centre regulariser (tau = 0.2), which PML's SoftTripleLoss does not have
    "softtriple": lambda c, d: pml_losses.SoftTripleLoss(c, d, centers_per_class=2, la=8, gamma=0.1, margin=0.01),
    "fastap": lambda c, d: pml_losses.FastAPLoss(num_bins=10),
    "circle": lambda c, d: pml_losses.CircleLoss(m=0.4, gamma=80),
    # our R = 65 histogram nodes are PML's 64 bins
    "histogram": lambda c, d: pml_losses.HistogramLoss(n_bins=64),
}

# our hyper-parameters where the defaults do not fit a benchmark batch (8 or 64 classes, D=128)
LOSS_OPTIONS: dict[str, dict[str, Any]] = {
    "dreml": {"num_learners": 4, "num_meta_classes": 4},
}

# Extra rows: a loss with the options that make its work equal to its PML peer's, timed against the
# same peer, beside the full formula's row (label -> (our loss name, our options)).
EQUAL_WORK: dict[str, tuple[str, dict[str, Any]]] = {
    "softtriple[tau=0]": ("softtriple", {"tau": 0.0}),  # without eq. 18's centre regulariser, as PML's
}

# label -> (our miner name, our hyper-parameters, PML factory or None)
PML_MINERS: dict[str, tuple[str, dict[str, Any], Callable[[], Any] | None]] = {
    "random": ("random", {}, None),
    "semihard": ("semihard", {}, None),
    # PML returns every triplet inside the window; so does all_triplets=True
    "semihard[all_triplets]": (
        "semihard",
        {"all_triplets": True},
        lambda: pml_miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard"),
    ),
    "softhard": ("softhard", {}, None),
    "hard": ("hard", {}, lambda: pml_miners.BatchHardMiner()),
    "distance_weighted": (
        "distance_weighted",
        {},
        lambda: pml_miners.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4),
    ),
    "multi_similarity": ("multi_similarity", {}, lambda: pml_miners.MultiSimilarityMiner(epsilon=0.1)),
}


@dataclass
class Row:
    kind: str
    name: str
    batch: int
    dmlbench_ms: float | None
    pml_ms: float | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.dmlbench_ms is None or self.pml_ms is None:
            return None
        return self.dmlbench_ms / self.pml_ms


def median_time(run: Callable[[], None], device: torch.device, min_time: float, max_repeats: int) -> float:
    """Median seconds of ``run`` after one warm-up; a warm-up slower than ``min_time`` is the answer."""

    def timed() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    warm_up = timed()
    if warm_up > min_time:
        return warm_up
    times: list[float] = []
    while len(times) < 3 or (sum(times) < min_time and len(times) < max_repeats):
        times.append(timed())
    return statistics.median(times)


def make_batch(batch: int, dim: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) // 4
    labels = labels[torch.randperm(batch, generator=generator)]
    embeddings = torch.nn.functional.normalize(torch.randn(batch, dim, generator=generator), dim=1)
    return embeddings.to(device), labels.to(device)


def loss_step(loss: torch.nn.Module, embeddings: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        x = embeddings.detach().requires_grad_(True)
        loss(x, labels).backward()

    return run


def unique_losses() -> dict[str, list[str]]:
    """Registered names grouped by constructor, so aliases are timed once: {name: [aliases]}."""
    groups: dict[Callable[..., Any], list[str]] = {}
    for name in losses.LOSSES.names():
        groups.setdefault(losses.LOSSES.get(name), []).append(name)
    result = {}
    for names in groups.values():
        main = next((name for name in names if name in PML_LOSSES), names[0])
        result[main] = [name for name in names if name != main]
    return dict(sorted(result.items()))


def time_or_error(
    make: Callable[[], Callable[[], None]], device: torch.device, args: argparse.Namespace
) -> tuple[float | None, str]:
    try:
        return 1e3 * median_time(make(), device, args.min_time, args.max_repeats), ""
    except Exception as error:  # a broken entry must not end the whole table
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:60]}"


def benchmark_losses(batch: int, args: argparse.Namespace, device: torch.device) -> list[Row]:
    embeddings, labels = make_batch(batch, args.dim, device)
    num_classes = int(labels.max()) + 1
    rows = []
    entries = [(name, name, LOSS_OPTIONS.get(name, {}), aliases) for name, aliases in unique_losses().items()]
    entries += [(label, name, options, []) for label, (name, options) in EQUAL_WORK.items()]
    for label, name, options, aliases in entries:
        if args.only and name not in args.only:
            continue

        def ours() -> Callable[[], None]:
            loss = losses.build(name, num_classes=num_classes, embedding_dim=args.dim, **options).to(device)
            return loss_step(loss, embeddings, labels)

        ours_ms, ours_error = time_or_error(ours, device, args)
        pml_ms, pml_error = None, "no PML equivalent"
        if name in PML_LOSSES:

            def theirs() -> Callable[[], None]:
                return loss_step(PML_LOSSES[name](num_classes, args.dim).to(device), embeddings, labels)

            pml_ms, pml_error = time_or_error(theirs, device, args)
        note = "; ".join(filter(None, [f"= {', '.join(aliases)}" if aliases else "", ours_error, pml_error]))
        rows.append(Row("loss", label, batch, ours_ms, pml_ms, note))
        print(format_row(rows[-1]), flush=True)
    return rows


def benchmark_miners(batch: int, args: argparse.Namespace, device: torch.device) -> list[Row]:
    embeddings, labels = make_batch(batch, args.dim, device)
    rows = []
    for label, (name, hparams, pml_factory) in PML_MINERS.items():
        if args.only and name not in args.only:
            continue

        def ours() -> Callable[[], None]:
            miner = mining.build(name, generator=torch.Generator().manual_seed(0), **hparams)
            return lambda: miner(embeddings, labels)

        ours_ms, ours_error = time_or_error(ours, device, args)
        pml_ms, pml_error = None, "no PML equivalent"
        if pml_factory is not None:

            def theirs() -> Callable[[], None]:
                miner = pml_factory()
                return lambda: miner(embeddings, labels)

            pml_ms, pml_error = time_or_error(theirs, device, args)
        rows.append(Row("miner", label, batch, ours_ms, pml_ms, "; ".join(filter(None, [ours_error, pml_error]))))
        print(format_row(rows[-1]), flush=True)
    return rows


def format_number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = "| kind | name | batch | dmlbench ms | PML ms | ratio | note |\n|---|---|---:|---:|---:|---:|---|"


def format_row(row: Row) -> str:
    return (
        f"| {row.kind} | {row.name} | {row.batch} | {format_number(row.dmlbench_ms)} | "
        f"{format_number(row.pml_ms)} | {format_number(row.ratio)} | {row.note} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--min-time", type=float, default=0.15, help="seconds of repeats per measurement")
    parser.add_argument("--max-repeats", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None, help="loss/miner names to time (default: all)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_metric_learning")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, D={args.dim}\n")
    print(HEADER, flush=True)
    started = time.perf_counter()
    rows = []
    for batch in args.batch_sizes:
        rows += benchmark_losses(batch, args, device)
        rows += benchmark_miners(batch, args, device)
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{**asdict(row), "ratio": row.ratio} for row in rows], handle, indent=1)


if __name__ == "__main__":
    main()
