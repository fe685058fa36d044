"""Re-measure the numbers quoted in ``dmlbench.data.glyphs``: ``python -m dmlbench.data.measure [option=value ...]``.

Generates the dataset into a temporary cache (so the first generation is really timed), loads it
again from the cache, and computes raw-pixel 1-NN Precision@1 over every image of the test half.
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from dmlbench.data.base import build
from dmlbench.data.check import raw_pixel_precision_at_1
from dmlbench.data.splits import train_test_split


def main(arguments: list[str]) -> None:
    options = {key: _parse(value) for key, _, value in (argument.partition("=") for argument in arguments)}
    with tempfile.TemporaryDirectory() as directory:
        started, cpu_started = time.perf_counter(), time.process_time()
        dataset = build("glyphs", cache_dir=directory, **options)
        generated, generated_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        started = time.perf_counter()
        build("glyphs", cache_dir=directory, **options)
        loaded = time.perf_counter() - started
    _, test = train_test_split(dataset.labels)
    counts = np.bincount(dataset.labels.numpy())
    print(f"options {options or 'defaults'}")
    print(f"classes {len(dataset.class_names)}, images {len(dataset)}, per class {counts.min()}-{counts.max()}")
    # CPU time as well: on a shared machine the wall time mostly measures the other processes.
    print(f"first generation {generated:.1f} s wall ({generated_cpu:.1f} s CPU), cache hit {loaded:.2f} s")
    merged = dataset.metadata["homoglyphs"]
    print(f"classes that absorbed homoglyphs: {len(merged)} ({sum(map(len, merged.values()))} characters); "
          f"dropped as empty: {dataset.metadata['dropped_empty']!r}")
    started = time.perf_counter()
    precision = raw_pixel_precision_at_1(dataset, test)
    print(f"raw-pixel 1-NN Precision@1 on the test half ({len(test)} images): {precision:.3f} "
          f"({time.perf_counter() - started:.1f} s)")
    print(f"content hash {dataset.content_hash}")


def _parse(text: str) -> int | float | str | None:
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
