"""Where a benchmark's workers run: how many local worker processes ``--jobs auto`` starts
(``auto_jobs``) and which storage they share (``resolve_storage``), both settled by ``prepare``."""

from __future__ import annotations

from pathlib import Path

from dmlbench.protocol.design.benchmark import BenchmarkSpec
from dmlbench.protocol.design.benchmark_file import read_benchmark_if_any
from dmlbench.protocol.design.plan import MethodPlan, repeated_searches
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.training import threads


AUTO_JOBS = "auto"


def auto_jobs(spec: BenchmarkSpec, plans: dict[str, MethodPlan]) -> int:
    """``--jobs auto``: as many worker processes as this process's cores hold at the methods' torch
    thread count (one each when ``training.num_threads`` is ``auto`` and ``OMP_NUM_THREADS`` unset),
    at most the units of work the search can run at once (``ProtocolSpec.search_concurrency``, repeats too).

    One process per core because on the built-in benchmark two one-thread workers took 200 s where
    one two-thread worker took 269 s (``python benchmarks/jobs.py src/dmlbench/configs/benchmark.yaml``
    on a quiet 2-core machine): the small CNN's steps do not keep two threads busy.

    On CUDA the same rule, with no GPU count in it: the workers spread over the GPUs, several to one
    (``placement.worker_devices``), and each still needs a core for Python between the GPU's kernels and
    for what stays on the CPU (sampling, images not held on the GPU, records), so the cores bound the
    workers as on the CPU. How many workers keep a GPU busy, and how many fit in its memory, is not
    measured."""
    fixed = [int(plan.config.training.num_threads) for plan in plans.values() if plan.config.training.num_threads != threads.AUTO]
    per_process = max(fixed, default=threads.pinned_threads() or 1)
    searches = len(plans) + len(repeated_searches(plans, spec.protocol))
    return max(1, min(threads.available_cores() // per_process, spec.protocol.search_concurrency(searches)))


def resolve_storage(output_dir: Path, storage: str | None, jobs: int) -> str:
    """``--storage``, else the storage an existing benchmark in ``output_dir`` records, else the
    default for ``jobs`` workers (``storage.default_url``)."""
    if storage:
        storage_module.storage_for(storage)  # a supported kind, or one line
        return storage
    record = read_benchmark_if_any(output_dir)
    if record is not None and record.storage:
        return record.storage
    return storage_module.default_url(output_dir, jobs)
