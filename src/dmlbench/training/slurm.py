"""``dmlbench train --slurm``: one training run as one SLURM job of ``nodes x tasks_per_node`` processes.

Each SLURM task is one rank: submitit's ``TorchDistributedEnvironment`` exports the variables ``torchrun``
would (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and the task trains as a
torchrun rank does (``launch.train_ranks``: NCCL on CUDA, gloo on the CPU). A job that SLURM requeues
(preemption, the time-limit warning through submitit's ``checkpoint``) starts again and resumes the run
from its last epoch: every rank decides to resume from the run directory before the ranks meet, so that
no rank can see what another wrote.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench import slurm
from dmlbench.config import Config
from dmlbench.training import records

class SlurmTraining:
    """The callable each task of the job runs (pickled by submitit)."""

    def __init__(self, config: Config, run_dir: Path, resume: bool) -> None:
        self.config, self.run_dir, self.resume = config, run_dir, resume

    def __call__(self) -> str:
        import submitit

        from dmlbench.files import install_stop_handlers
        from dmlbench.training.launch import train_ranks

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        # The threads torchrun gives each of several ranks (OMP_NUM_THREADS=1), here the CPUs SLURM gives the
        # task: training.num_threads=auto reads it, and a thread count changes a run's last digits.
        os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("SLURM_CPUS_PER_TASK", "1"))
        install_stop_handlers()
        resume = self.resume or records.is_run_dir(self.run_dir)  # before the ranks meet (see the module docstring)
        outcome = train_ranks(self.config, self.run_dir, resume=resume, progress=False)
        if outcome.result is None:
            raise RuntimeError(outcome.divergence)
        return str(outcome.run_dir)

    def checkpoint(self) -> Any:
        """What submitit requeues when the time limit is near: the same run, resumed when it starts again."""
        import submitit

        return submitit.helpers.DelayedSubmission(SlurmTraining(self.config, self.run_dir, self.resume))


@dataclass(frozen=True)
class TrainingJob:
    """A submitted training run: its SLURM ``job_id``, ``tasks`` (processes), ``run_dir`` and log ``folder``."""

    job_id: str
    tasks: int
    run_dir: Path
    folder: Path

    def _line(self, states: list[slurm.TaskState]) -> str:
        return f"SLURM job {self.job_id}: {states[0].state}" + (f" ({states[0].reason})" if states[0].reason else "")

    def wait(self, *, progress: bool) -> bool:
        """Follow the job until it ends (``slurm.follow_tasks``); whether the run completed (its ``run.json``
        says so)."""
        state = slurm.follow_tasks(self.job_id, 1, self.folder, line=self._line, progress=progress)[0]
        completed = records.is_run_dir(self.run_dir) and records.read_run_record(self.run_dir).get("status") == "completed"
        if not completed:
            print(f"dmlbench: error: SLURM job {self.job_id} ended with the run not completed ({state.state}); its logs "
                  f"are in {self.folder}; continue it with --resume", file=sys.stderr, flush=True)
        return completed


def submit_training(config: Config, run_dir: Path, options: slurm.SlurmOptions, *, nodes: int, tasks_per_node: int,
                    resume: bool) -> TrainingJob:
    """Submit the run ``config`` in ``run_dir`` (its SLURM scripts and logs in ``run_dir``'s sibling
    ``RUN.slurm``, outside the run directory, which a new run needs empty)."""
    run_dir = run_dir.resolve()
    folder = run_dir.with_name(run_dir.name + ".slurm")
    job = slurm.executor(folder, options, name=f"dmlbench-train-{run_dir.name}", nodes=nodes, tasks_per_node=tasks_per_node)
    folder.mkdir(parents=True, exist_ok=True)
    with slurm.refusal_in_one_line():
        submitted = job.submit(SlurmTraining(config, run_dir, resume))
    return TrainingJob(str(submitted.job_id), nodes * tasks_per_node, run_dir, folder)
