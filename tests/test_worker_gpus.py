"""``benchmark --jobs N`` on CUDA: worker k trains on ``cuda:(k mod GPUs)``, and the dry run counts workers
sharing a GPU as one. Checked on a made-up CUDA machine (``torch.cuda`` patched): no CUDA tensor is made."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import torch

from dmlbench.protocol.design.benchmark import load_spec
from dmlbench.protocol.design.prepare import Prepared, prepare
from dmlbench.protocol.dry_run import cost
from dmlbench.protocol.run import jobs
from dmlbench.training import placement as placement_module
from dmlbench.training.placement import STANDALONE, Placement, resolve_device, worker_devices, worker_gpus

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def fake_cuda(monkeypatch: pytest.MonkeyPatch, gpus: int) -> list[torch.device]:
    """This process sees ``gpus`` CUDA devices; the returned list fills with ``torch.cuda.set_device``'s calls."""
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(placement_module, "reproducible_cuda", lambda: None)  # global torch flags this test process keeps
    return chosen


@pytest.mark.parametrize("gpus", [1, 2])
def test_worker_k_trains_on_cuda_k_mod_gpus(gpus: int, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = fake_cuda(monkeypatch, gpus)
    expected = [torch.device("cuda", worker % gpus) for worker in range(5)]
    for worker in range(5):
        placement = Placement(worker=worker, workers=5)
        assert placement.device("auto") == placement.device("cuda") == expected[worker]
    assert chosen == [device for device in expected for _ in range(2)]  # torch's current device follows
    assert worker_devices("auto", 5) == worker_devices("cuda", 5) == expected and worker_gpus("auto") == gpus


def test_an_explicit_cuda_index_stays_for_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = fake_cuda(monkeypatch, 2)
    for worker in range(3):
        assert Placement(worker=worker, workers=3).device("cuda:1") == torch.device("cuda", 1)
    assert chosen == [] and worker_devices("cuda:1", 3) == [torch.device("cuda", 1)] * 3 and worker_gpus("cuda:1") == 1


def test_no_worker_and_the_cpu_resolve_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = fake_cuda(monkeypatch, 2)
    # No worker (``train``, a benchmark of one process, torchrun's ranks): ``cuda`` without an index, as before.
    assert STANDALONE.device("auto") == resolve_device("auto") == torch.device("cuda") and chosen == []
    assert Placement(worker=1, workers=2).device("cpu") == torch.device("cpu") and worker_gpus("cpu") == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and worker_devices("auto", 2) == [torch.device("cpu")] * 2
    assert chosen == [] and worker_gpus("auto") == 0


def test_a_placement_leaves_no_state_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Placing one worker changes nothing for the next caller in the process: the placement is a value."""
    chosen = fake_cuda(monkeypatch, 2)
    assert Placement(worker=1, workers=2).device("cuda") == torch.device("cuda", 1)
    assert STANDALONE.device("cuda") == torch.device("cuda") and chosen == [torch.device("cuda", 1)]


class FakeProcess:
    """A spawned worker that is never started: the test calls its target in this process."""

    started: list[FakeProcess] = []

    def __init__(self, target: Any, name: str, args: tuple[Any, ...]) -> None:
        self.target, self.name, self.args, self.exitcode, self.pid = target, name, args, 0, None

    def start(self) -> None:
        FakeProcess.started.append(self)

    def join(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False


def test_run_jobs_numbers_its_workers_and_says_how_they_share_the_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_cuda(monkeypatch, 2)
    trained_on: list[torch.device] = []
    placements: list[Placement] = []

    def run_benchmark(prepared: Any, *, placement: Placement, **kwargs: Any) -> None:
        trained_on.append(placement.device("auto"))
        placements.append(placement)

    FakeProcess.started.clear()
    monkeypatch.setattr(jobs, "multiprocessing", SimpleNamespace(get_context=lambda method: SimpleNamespace(Process=FakeProcess)))
    monkeypatch.setattr(jobs, "owned_output", lambda prepared: contextlib.nullcontext())
    monkeypatch.setattr(jobs, "write_benchmark_file", lambda prepared, placement: None)
    monkeypatch.setattr(jobs, "run_benchmark", run_benchmark)
    prepared = SimpleNamespace(jobs=4, output_dir=tmp_path, storage="journal", heartbeat=30, retry_seconds=0, plugin_changes=[],
                               configs={"method": SimpleNamespace(training=SimpleNamespace(device="auto"))})
    assert jobs.run_jobs(prepared, None, [], progress=True) is None  # type: ignore[arg-type]
    assert capsys.readouterr().err == "--jobs 4: 2 worker(s) on cuda:0, 2 worker(s) on cuda:1\n"
    assert placements == [Placement(worker=0, workers=4)]  # the parent is worker 0 of 4
    # Each spawned worker, run here: the same loop, on its own share of the GPUs.
    monkeypatch.setattr("dmlbench.protocol.design.benchmark.load_spec", lambda path: None)
    monkeypatch.setattr("dmlbench.protocol.design.prepare.prepare", lambda *args, **kwargs: None)
    monkeypatch.setattr(jobs, "install_stop_handlers", lambda: None)
    verbosity = optuna.logging.get_verbosity()
    try:
        for process in FakeProcess.started:
            process.target(*process.args)
    finally:
        optuna.logging.set_verbosity(verbosity)
    assert [process.args[0] for process in FakeProcess.started] == [1, 2, 3]
    assert trained_on == [torch.device("cuda", index) for index in (0, 1, 0, 1)]
    assert placements == [Placement(worker=index, workers=4) for index in range(4)]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    return prepare(load_spec(SMOKE), tmp_path_factory.mktemp("dry") / "out", jobs=4)


def made_up_measure(prepared: Prepared, startup: float = 0.0, report: Any = None) -> cost.Measured:
    numbers = {field.name: 0.5 for field in dataclasses.fields(cost.Measured) if field.name != "method_steps"}
    return cost.Measured(**{**numbers, "steps_per_epoch": 5, "test_images": 10})


@pytest.mark.parametrize(("gpus", "share"), [(1, "1/1"), (2, "1/2")])
def test_the_dry_run_counts_workers_sharing_a_gpu_as_one(gpus: int, share: str, smoke: Prepared,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost, "measure", made_up_measure)
    cpu = cost.dry_run(smoke).splitlines()
    fake_cuda(monkeypatch, gpus)
    cuda = cost.dry_run(smoke).splitlines()
    at = next(index for index, line in enumerate(cpu) if line.startswith("estimate: "))
    assert cpu[at].endswith("; with N workers about 1/N of the training") and cost.SHARED_GPU not in cpu
    assert cuda[at].endswith(f"; with N workers on {gpus} GPU(s) about 1/min(N, {gpus}) of the training (--jobs 4: {share})")
    assert cuda[at + 1] == cost.SHARED_GPU and cuda[:at] + cuda[at + 2:] == cpu[:at] + cpu[at + 1:]
