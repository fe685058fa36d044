"""Cost of the facility-location swap refinement, measured against the greedy inference in the same run.

Batches of 112 and 256 x 128-d L2-normalised embeddings (28 and 64 classes x 4) at three degrees
of class structure (``spread`` 0: none); one torch thread; best of 7 timings, mean over 5 batches.
The last line is the loss step (forward and backward) at b = 256 with the refinement, in ms and as
a ratio to the same step without it.

    python benchmarks/facility_location.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from dmlbench.distances import euclidean
from dmlbench.losses.facility_location import FacilityLocationLoss
from dmlbench.losses.medoids import greedy_loss_augmented_medoids, swap_refined_medoids


def make_batch(seed: int, spread: float, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(4)
    centres = torch.randn(classes, 128, generator=generator)
    points = spread * centres[labels] + torch.randn(len(labels), 128, generator=generator)
    return F.normalize(points, dim=1), labels


def best_time(function: Callable[[], object], repeats: int = 7) -> float:
    durations = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        durations.append(time.perf_counter() - started)
    return min(durations)


def main() -> None:
    torch.set_num_threads(1)
    print("batch  spread  greedy ms  refinement ms  loss fwd+bwd ms (refine off -> on)  medoids swapped")
    steps = {False: [], True: []}
    for classes, spread in ((28, 0.0), (28, 0.5), (28, 1.0), (64, 0.0), (64, 0.5), (64, 1.0)):
        rows = []
        for seed in range(5):
            embeddings, labels = make_batch(seed, spread, classes)
            distances = euclidean(embeddings).detach()
            _, class_index = torch.unique(labels, return_inverse=True)
            greedy = greedy_loss_augmented_medoids(distances, class_index, 1.0)
            refined = swap_refined_medoids(distances, class_index, 1.0, greedy)
            leaf = embeddings.clone().requires_grad_(True)

            def step(refine: bool) -> None:
                FacilityLocationLoss(refine=refine)(leaf, labels).backward()

            rows.append((
                best_time(lambda: greedy_loss_augmented_medoids(distances, class_index, 1.0)),
                best_time(lambda: swap_refined_medoids(distances, class_index, 1.0, greedy)),
                best_time(lambda: step(False)),
                best_time(lambda: step(True)),
                int((greedy != refined).sum()),
            ))
        mean = [sum(row[column] for row in rows) / len(rows) for column in range(5)]
        print(f"{4 * classes:5d}  {spread:6.1f}  {1e3 * mean[0]:9.1f}  {1e3 * mean[1]:13.1f}  "
              f"{1e3 * mean[2]:14.1f} -> {1e3 * mean[3]:.1f}  {mean[4]:16.1f}")
        if classes == 64:
            steps[False].append(mean[2])
            steps[True].append(mean[3])
    with_refinement, without = (sum(steps[refine]) / len(steps[refine]) for refine in (True, False))
    print(f"b=256 step with refinement: {1e3 * with_refinement:.0f} ms; ratio with / without refinement = "
          f"{with_refinement / without:.2f}")


if __name__ == "__main__":
    main()
