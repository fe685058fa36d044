"""Benchmark: loading training batches of a file dataset with and without the decoded-image cache.

Writes ``--images`` CUB-sized JPEGs (500 x 375, smooth random content so they compress like photos)
as a ``folder`` dataset in a temporary directory, then times ``FileDataset.batch`` on random
batches of ``--batch-size`` in the same process: decoding from the JPEG files (thread pool of
``--workers``) against reading the memory-mapped cache, both with the ``base`` augmentation at
``--image-size``. The cache is filled once before timing (its fill time is printed separately).

    python benchmarks/data_loading.py                     # 600 images, batches of 64 at 224
    python benchmarks/data_loading.py --workers 1
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def write_dataset(root: Path, images: int, classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for index in range(images):
        small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        picture = Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC)
        folder = root / f"class_{index % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        picture.save(folder / f"{index:05d}.jpg", quality=90)


def time_batches(dataset: Any, batches: list[np.ndarray], train: bool) -> float:
    started = time.perf_counter()
    for epoch, batch in enumerate(batches):
        dataset.batch(batch, epoch=epoch if train else None)
    return (time.perf_counter() - started) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    arguments = parser.parse_args()

    import torch

    from dmlbench import data

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary) / "images"
        write_dataset(root, arguments.images, arguments.classes, seed=0)
        options = dict(root=str(root), image_size=arguments.image_size, augmentation="base", workers=arguments.workers)
        rng = np.random.default_rng(1)
        batches = [rng.choice(arguments.images, arguments.batch_size, replace=False) for _ in range(arguments.batches)]

        decoded = data.build("folder", **options)
        started = time.perf_counter()
        cached = data.build("folder", cache_dir=str(Path(temporary) / "cache"), **options)
        cached.find_unreadable()  # fills the cache
        fill = time.perf_counter() - started
        assert torch.equal(decoded.batch(batches[0], epoch=0)[0], cached.batch(batches[0], epoch=0)[0])

        timings = {train: (time_batches(decoded, batches, train), time_batches(cached, batches, train))
                   for train in (True, False)}
    per_image = 1000 / arguments.batch_size
    print(f"{arguments.images} JPEGs 500x375, batches of {arguments.batch_size} at {arguments.image_size}px, "
          f"augmentation base, {arguments.workers} decode workers")
    print(f"cache fill (once)    {fill:8.2f} s")
    for train, (without, with_cache) in timings.items():
        print("training batches (augmented)" if train else "evaluation batches (centre crop)")
        print(f"  decode from JPEG     {without * 1000:8.1f} ms/batch  ({without * per_image:.2f} ms/image)")
        print(f"  decoded-image cache  {with_cache * 1000:8.1f} ms/batch  ({with_cache * per_image:.2f} ms/image)")
        print(f"  speed-up             {without / with_cache:8.2f}x")


if __name__ == "__main__":
    main()
