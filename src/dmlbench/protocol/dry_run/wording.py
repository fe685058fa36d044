"""The dry run's words: how long, how many workers the search keeps busy, what more workers take."""

from __future__ import annotations

from dmlbench.protocol.design.benchmark import ProtocolSpec


def search_parallelism(protocol: ProtocolSpec, searches: int) -> str:
    """How many workers the search keeps busy (``ProtocolSpec.search_concurrency``), folds counted with ``fold_units``."""
    busy = protocol.search_concurrency(searches)
    workers = "1 worker" if busy == 1 else f"{busy} workers"
    trials = f"{searches} search(es) x {protocol.parallel_trials} parallel trial(s)"
    if protocol.fold_units:
        return f"the search keeps at most {workers} busy ({trials} x {protocol.folds} folds: each fold is a unit of work, protocol.fold_units)"
    return (f"the search keeps at most {workers} busy ({trials}: a trial runs its folds in one worker; "
            f"protocol.fold_units: true makes each fold a unit of work, up to {busy * protocol.folds})")


def with_workers(jobs: int, gpus: int) -> str:
    """What N workers take of the training: 1/N on the CPU; on ``gpus`` GPUs 1/min(N, ``gpus``) (``cost.SHARED_GPU``)."""
    if not gpus:
        return "with N workers about 1/N of the training"
    return f"with N workers on {gpus} GPU(s) about 1/min(N, {gpus}) of the training (--jobs {jobs}: 1/{min(jobs, gpus)})"


def hours(seconds: float) -> str:
    """``seconds`` as ``H h MM min SS s``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min {seconds % 60:02d} s"
