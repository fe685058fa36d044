"""Time per batch of every sampler next to one training step of the default CPU model.

A training step is forward + triplet loss + backward + Adam on ``small_cnn`` (embedding 128) with
32x32 grayscale images. Embedded samplers are timed with their memory-bank update included, as the
trainer runs them. The target is a sampler cost under 20% of a step.

    python benchmarks/samplers.py                       # defaults: 4800 images, 300 classes, b = 112
    python benchmarks/samplers.py --threads 1 --batches 30
"""

from __future__ import annotations

import argparse
import time

import torch

from dmlbench import losses, models, sampling


def time_training_step(batch_size: int, steps: int) -> float:
    """Median seconds of one forward/backward/Adam step on a batch of ``batch_size`` images."""
    model = models.build("small_cnn", embedding_dim=128, seed=0)
    loss_fn = losses.build("triplet")
    parameters = list(model.parameters()) + list(loss_fn.parameters())
    optimizer = torch.optim.Adam(parameters, lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch_size, 1, 32, 32, generator=generator)
    # SPC-2 labels, so that the loss has triplets to back-propagate through.
    batch_labels = torch.arange(batch_size // 2).repeat_interleave(2)[:batch_size]
    durations = []
    for step in range(steps + 2):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), batch_labels)
        loss.backward()
        optimizer.step()
        if step >= 2:  # the first steps allocate and warm caches
            durations.append(time.perf_counter() - start)
    return sorted(durations)[len(durations) // 2]


def time_sampler(name: str, labels: torch.Tensor, batch_size: int, batches: int, options: dict) -> float:
    """Mean seconds per batch over the first ``batches`` batches (memory updates included)."""
    sampler = sampling.build(name, labels=labels, batch_size=batch_size, seed=0, **options)
    generator = torch.Generator().manual_seed(1)
    bank = torch.nn.functional.normalize(torch.randn(len(labels), 128, generator=generator), dim=1)
    if sampler.needs_embeddings:
        sampler.initialize_memory(bank)
    start = time.perf_counter()
    count = 0
    for batch in sampler:
        if sampler.needs_embeddings:
            sampler.update_memory(batch, bank[batch])
        count += 1
        if count == batches:
            break
    return (time.perf_counter() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4800)
    parser.add_argument("--classes", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=112)
    parser.add_argument("--big-batch-size", type=int, default=1024)
    parser.add_argument("--num-candidates", type=int, default=10)
    parser.add_argument("--batches", type=int, default=20, help="batches timed per sampler")
    parser.add_argument("--steps", type=int, default=10, help="training steps timed")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    labels = torch.arange(args.images) % args.classes
    step = time_training_step(args.batch_size, args.steps)
    embedded = {"big_batch_size": args.big_batch_size}
    configurations = {
        "spc": {"samples_per_class": 2},
        "spc_random": {},
        "random": {},
        "classification": {},
        "greedy_coreset": embedded,
        "ddm": {**embedded, "num_candidates": args.num_candidates},
        "frd": {**embedded, "num_candidates": args.num_candidates},
    }
    print(f"{args.images} images, {args.classes} classes, batch {args.batch_size}, "
          f"b* {args.big_batch_size}, m {args.num_candidates}, {torch.get_num_threads()} thread(s)")
    print(f"training step (small_cnn, triplet, Adam): {1000 * step:.1f} ms")
    print(f"{'sampler':<16}{'ms/batch':>10}{'% of step':>11}")
    for name, options in configurations.items():
        per_batch = time_sampler(name, labels, args.batch_size, args.batches, options)
        print(f"{name:<16}{1000 * per_batch:>10.2f}{100 * per_batch / step:>10.1f}%")


if __name__ == "__main__":
    main()
