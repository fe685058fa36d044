"""One training run in every process of a job: a single process, the ranks ``torchrun`` starts, or the
tasks of a SLURM job (``training.slurm``). Each joins the process group its environment describes,
takes rank 0's run directory and trains; rank 0 writes the directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dmlbench.config import Config
from dmlbench.provenance import default_output
from dmlbench.training import distributed
from dmlbench.training.loop import train
from dmlbench.training.step import TrainingDiverged, TrainResult


@dataclass(frozen=True)
class RankOutcome:
    """What one process of the job ends with: its ``group``, the ``run_dir`` every rank trained, and the
    run's ``result`` (``None`` when the run diverged: ``diverged`` says how; the run is marked failed)."""

    group: distributed.ProcessGroup
    run_dir: Path
    result: TrainResult | None
    diverged: str = ""

    @property
    def divergence(self) -> str:
        """What a diverged run's processes report: ``training diverged (...); run DIR marked failed``."""
        return f"training diverged ({self.diverged}); run {self.run_dir} marked failed"


def train_ranks(config: Config, output: Path | None, *, resume: bool, progress: bool) -> RankOutcome:
    """Train ``config`` in this process's place of the job. ``output``: the run directory (default:
    ``runs/<loss>-<time>`` by rank 0's clock, which may differ from the other ranks')."""
    started_group = distributed.init_from_environment(config.training.device)
    try:
        group = distributed.current()
        run_dir = distributed.broadcast(output or default_output(config.loss.name), group)
        try:
            return RankOutcome(group, run_dir, train(config, run_dir, resume=resume, progress=progress))
        except TrainingDiverged as error:
            return RankOutcome(group, run_dir, None, str(error))
    finally:
        if started_group:
            import torch.distributed

            torch.distributed.destroy_process_group()
