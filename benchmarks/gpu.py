"""Figures for a GPU: training steps per second of an embedding model in fp32, bf16 and fp16 autocast
and with ``torch.compile``, and exact evaluation of N embeddings.

One training step is the forward pass of a batch of random images through the trunk and the
embedding head, a metric loss (``--loss``, default multi-similarity, seed 004's best pair loss),
the backward pass and an AdamW update; fp16 uses a gradient scaler. Steps per second are the median
over ``--steps`` timed steps after ``--warmup`` untimed ones (the compiled mode's first steps
compile). The evaluation times ``dmlbench.evaluation.evaluate`` (precision@1, R-precision, MAP@R;
its exact search runs on the CPU) on N synthetic embeddings and, in the same run, the float32
products it cannot avoid (``benchmarks/evaluation.py``'s floor). The last line is the fastest
training mode's speed-up over fp32. The device is set up as ``dmlbench train`` sets it up
(``training.embed.resolve_device``: deterministic algorithms, fp32 without TF32).

    python benchmarks/gpu.py                                     # CUDA, ResNet-50 at 224 px, N = 1,000,000
    python benchmarks/gpu.py --device cpu --trunk resnet18 --image-size 32 --batch-size 4 --steps 2 --n 2000
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from dmlbench import losses, models
from dmlbench.training.embed import resolve_device

MODES = ("fp32", "bf16", "fp16", "fp32+compile", "bf16+compile")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps_per_second(mode: str, args: argparse.Namespace, device: torch.device) -> float:
    """Median training steps per second of ``mode`` (``fp32``/``bf16``/``fp16``, ``+compile``)."""
    precision, _, compiled = mode.partition("+")
    generator = torch.Generator().manual_seed(args.seed)
    model = models.build(args.trunk, embedding_dim=args.embedding_dim, seed=args.seed, in_channels=3).to(device)
    loss = losses.build(args.loss).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    forward = torch.compile(model) if compiled else model
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator).to(device)
    labels = torch.arange(args.batch_size).div(4, rounding_mode="floor").to(device)  # 4 images per class
    durations = []
    for step in range(args.warmup + args.steps):
        synchronize(device)
        started = time.perf_counter()
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with autocast:
            embeddings = forward(images)
        value = loss(embeddings.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(value).backward()
        scaler.step(optimizer)
        scaler.update()
        synchronize(device)
        if step >= args.warmup:
            durations.append(time.perf_counter() - started)
    return 1.0 / statistics.median(durations)


def evaluation_seconds(args: argparse.Namespace) -> tuple[float, float]:
    """Seconds of exact evaluation of ``args.n`` embeddings, and of the products it needs (the floor)."""
    from evaluation import floor_seconds, make_data

    from dmlbench.evaluation import evaluate

    embeddings, labels = make_data(args.n, args.embedding_dim, 5, args.seed)
    started = time.perf_counter()
    evaluate(embeddings, labels, metrics=["precision_at_1", "r_precision", "map_at_r"], seed=args.seed)
    return time.perf_counter() - started, floor_seconds(embeddings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--trunk", default="resnet50")
    parser.add_argument("--loss", default="multi_similarity")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    parser.add_argument("--n", type=int, default=1_000_000, help="embeddings evaluated (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; this script is for a GPU (--device cpu runs it at tiny sizes)")
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}; {args.trunk} at {args.image_size} px, batch {args.batch_size}")
    speeds = {}
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        speeds[mode] = steps_per_second(mode, args, device)
        print(f"{mode:13s} {speeds[mode]:8.2f} steps/s  {speeds[mode] * args.batch_size:9.1f} images/s")
    if args.n:
        seconds, floor = evaluation_seconds(args)
        print(f"evaluation of N={args.n:,} x {args.embedding_dim}: {seconds:.1f} s, {seconds / floor:.2f}x the products' floor")
    if "fp32" in speeds:
        fastest = max(speeds, key=speeds.__getitem__)
        print(f"fastest mode {fastest}: {speeds[fastest] / speeds['fp32']:.2f}x fp32 steps/s")


if __name__ == "__main__":
    main()
