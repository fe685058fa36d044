"""``dmlbench benchmark --jobs N``: N worker processes on this machine, one of them this process.

The other N - 1 are started with ``multiprocessing``'s *spawn* method (a fresh interpreter: no
torch state copied by ``fork``), each preparing the same benchmark and working on the same storage
as any worker on any machine would (``schedule.run_benchmark``); the storage URL reaches them through
the spawn pipe, never on a command line. Each sets its own torch thread count from
``training.num_threads`` when it trains (``auto``: its 1/N share of the cores). Worker k (this
process is worker 0) trains on ``cuda:(k mod GPUs)`` where ``training.device`` is ``auto`` or
``cuda`` on CUDA (its ``placement.Placement``; ``cuda:N`` stays); a ``dmlbench benchmark`` started by hand
numbers only its own workers (with ``--jobs 1``: ``cuda``, as without workers). Ctrl-C stops every
worker (the terminal signals the whole process group); a SIGTERM or SIGINT sent to this process
alone is passed on to the workers; this process waits for them before it returns.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from dmlbench import files, plugins
from dmlbench.errors import RunInterrupted, StorageFailed, UserInputError
from dmlbench.files import describe, install_stop_handlers, received_signal, storage_error
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.layout import RESULTS_FILE
from dmlbench.protocol.run.record import BenchmarkOutcome, ReportWriter, write_benchmark_file
from dmlbench.protocol.run.rounds import RoundBudget
from dmlbench.protocol.run.schedule import owned_output, run_benchmark
from dmlbench.training.placement import Placement, worker_devices

STOPPED_EXIT_CODES = frozenset({128 + signal.SIGINT, 128 + signal.SIGTERM})


def run_jobs(prepared: Prepared, config_path: Path | None, overrides: list[str], *, progress: bool,
             report: ReportWriter | None = None, budget: RoundBudget = RoundBudget()) -> BenchmarkOutcome | None:
    """Run ``prepared.jobs`` workers; the outcome (read from the directory when another wrote it).
    ``report``: the report writer of ``run_benchmark``, a module-level function (it is sent to the workers).
    This process holds the output directory (shared, as each worker does) until every worker has ended;
    it is worker 0. ``budget``: a sequential study's, shared by every worker (``rounds``)."""
    if progress:
        _say_gpus(prepared)
    with owned_output(prepared):
        return _run_jobs(prepared, config_path, overrides, progress=progress, report=report, budget=budget)


def _say_gpus(prepared: Prepared) -> None:
    """On CUDA, one line on the GPUs the workers share (each run's ``run.json`` records its own)."""
    devices = worker_devices(next(iter(prepared.configs.values())).training.device, prepared.jobs)
    if devices[0].type == "cuda":
        shares = ", ".join(f"{devices.count(device)} worker(s) on {device}" for device in dict.fromkeys(devices))
        print(f"--jobs {prepared.jobs}: {shares}", file=sys.stderr, flush=True)


def _run_jobs(prepared: Prepared, config_path: Path | None, overrides: list[str], *, progress: bool,
              report: ReportWriter | None, budget: RoundBudget) -> BenchmarkOutcome | None:
    placement = Placement(worker=0, workers=prepared.jobs)
    write_benchmark_file(prepared, placement)
    context = multiprocessing.get_context("spawn")
    task = WorkerTask.of(prepared, config_path, overrides, progress=progress, report=report, budget=budget)
    workers = [context.Process(target=_worker, name=f"dmlbench-worker-{index}", args=(index, task))
               for index in range(1, prepared.jobs)]
    for process in workers:
        process.start()
    try:
        outcome = run_benchmark(prepared, progress=progress, report=report, placement=placement, budget=budget)
    except (RunInterrupted, KeyboardInterrupt):
        # A scheduler may signal this process alone (Kubernetes signals PID 1): pass the stop on, so
        # every worker marks its unit interrupted. A worker that got the signal itself ignores a second.
        for process in workers:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, received_signal())
        raise
    finally:
        for process in workers:
            process.join()
    failures = [f"{process.name} exited with code {process.exitcode}" for process in workers if process.exitcode not in (0,)]
    if any(process.exitcode in STOPPED_EXIT_CODES for process in workers):
        raise RunInterrupted(f"benchmark {prepared.output_dir} stopped; re-run the same command to continue")
    for failure in failures:
        print(f"dmlbench: warning: {failure}", file=sys.stderr, flush=True)
    if outcome is None and (prepared.output_dir / RESULTS_FILE).is_file():
        stored = files.read_json(prepared.output_dir / RESULTS_FILE)
        return BenchmarkOutcome(prepared.output_dir, {}, dict(stored.get("failed", {})))
    return outcome


@dataclass(frozen=True)
class WorkerTask:
    """What a worker started elsewhere (a spawned process, a SLURM task) needs to join a benchmark: the
    command's config, overrides and options, the storage URL, the report writer, the plugins the user
    loaded (imported first, as the user's process did)."""

    config_path: Path | None
    overrides: tuple[str, ...]
    output_dir: str
    storage: str
    jobs: int
    heartbeat: int
    retry_seconds: int
    progress: bool
    report: ReportWriter | None
    plugin_specs: tuple[str, ...]
    accept_plugin_changes: bool
    budget: RoundBudget = RoundBudget()

    @classmethod
    def of(cls, prepared: Prepared, config_path: Path | None, overrides: list[str], *, progress: bool,
           report: ReportWriter | None, storage: str | None = None, budget: RoundBudget = RoundBudget()) -> WorkerTask:
        """The task of a worker of ``prepared`` (``storage``: the URL it connects with, if not ``prepared``'s)."""
        return cls(config_path, tuple(overrides), str(prepared.output_dir), storage or prepared.storage, prepared.jobs,
                   prepared.heartbeat, prepared.retry_seconds, progress, report, tuple(plugins.command_line()),
                   bool(prepared.plugin_changes), budget)

    def run(self, placement: Placement) -> None:
        """Prepare the benchmark as the user's process did and work on it at ``placement``; exit codes as
        the CLI's (2 bad input, 1 a storage failure or a full disk, 128 + the signal when stopped)."""
        import logging

        import optuna

        from dmlbench.protocol.design.benchmark import load_spec
        from dmlbench.protocol.design.prepare import prepare

        optuna.logging.set_verbosity(logging.WARNING)
        install_stop_handlers()
        try:
            plugins.load_from_command_line(list(self.plugin_specs))
            prepared = prepare(load_spec(self.config_path), Path(self.output_dir), list(self.overrides), self.storage,
                               jobs=self.jobs, heartbeat=self.heartbeat, retry_seconds=self.retry_seconds,
                               accept_plugin_changes=self.accept_plugin_changes)
            run_benchmark(prepared, progress=self.progress, report=self.report, placement=placement, budget=self.budget)
        except UserInputError as error:
            print(f"dmlbench: error: {error.as_options()}", file=sys.stderr, flush=True)
            sys.exit(2)
        except (RunInterrupted, KeyboardInterrupt):
            sys.exit(128 + received_signal())
        except StorageFailed as error:
            print(f"dmlbench: error: {error}", file=sys.stderr, flush=True)
            sys.exit(1)
        except Exception as error:
            full = storage_error(error)
            if full is None:
                raise
            print(f"dmlbench: error: {describe(full)}", file=sys.stderr, flush=True)
            sys.exit(1)


def _worker(index: int, task: WorkerTask) -> None:
    """Spawned worker ``index``: the same checks and the same loop as the parent on its share of the GPUs."""
    task.run(Placement(worker=index, workers=task.jobs))
