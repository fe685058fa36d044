"""The protocol's one path in tests: a benchmark spec, its search stage, one method's units."""

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from dmlbench.protocol.design.benchmark import BenchmarkSpec
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord
from dmlbench.protocol.design.prepare import Prepared, prepare
from dmlbench.protocol.queue import work
from dmlbench.protocol.queue.storage import default_url
from dmlbench.protocol.run.schedule import context_of, drive, run_search_stage
from dmlbench.protocol.units.reproductions import MethodReproduction
from dmlbench.protocol.units.results import MethodReproductions
from dmlbench.protocol.units.search import MethodSearch, SearchResult


def benchmark_spec(base: dict[str, Any], *methods: dict[str, Any], **protocol: Any) -> BenchmarkSpec:
    return BenchmarkSpec.model_validate({"base": base, "methods": list(methods), "protocol": protocol})


def benchmark_record(**fields: Any) -> BenchmarkRecord:
    """A ``benchmark.json`` record with its required fields filled in, ``fields`` over them."""
    return BenchmarkRecord.model_validate({"protocol": {}, "methods": ["m"], "storage": "sqlite:///x.db",
                                           "dataset": {"name": "glyphs", "content_hash": "0"}, **fields})


def run_search(spec: BenchmarkSpec, output_dir: Path, overrides: list[str] | None = None) -> dict[str, SearchResult]:
    """``dmlbench search`` in process: prepare, then the scheduler's search stage."""
    return run_search_stage(prepare(spec, output_dir, overrides), progress=False)


def study(output_dir: Path, name: str) -> optuna.Study:
    """A study of the default (SQLite) storage of ``output_dir``."""
    return optuna.load_study(study_name=name, storage=default_url(output_dir, 1))


def method_search(prepared: Prepared, name: str) -> MethodSearch:
    prepared.output_dir.mkdir(parents=True, exist_ok=True)
    return MethodSearch(prepared.plans[name], prepared.search, context_of(prepared))


def reproduce(spec: BenchmarkSpec, output_dir: Path, name: str, params: dict[str, Any]) -> MethodReproductions:
    """Method ``name``'s reproductions with ``params`` (as if its search had chosen them), driven to the end."""
    prepared = prepare(spec, output_dir)
    prepared.output_dir.mkdir(parents=True, exist_ok=True)
    unit = MethodReproduction(prepared.plans[name], params, prepared.reproduction, context_of(prepared))
    drive(lambda: [unit])
    return unit.result()


def counting_claims(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the scheduler's claims from now on: ``worked`` (a unit taken) and ``looks`` (WAIT or DONE)."""
    claims = {"worked": 0, "looks": 0}
    real_claim = work.claim

    def counted_claim(*args: object, **kwargs: object) -> object:
        claimed = real_claim(*args, **kwargs)
        claims["worked" if isinstance(claimed, work.Claim) else "looks"] += 1
        return claimed

    monkeypatch.setattr(work, "claim", counted_claim)
    return claims


def kill_9_once_written(command: list[str], marker: Path, cwd: Path) -> None:
    """Start ``command``, SIGKILL it as soon as ``marker`` exists (within 120 s) and wait for it."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None, "the benchmark ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
