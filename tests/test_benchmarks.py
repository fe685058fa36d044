"""The benchmark scripts run end to end at tiny sizes and end with their ratio (their figures are measured
by hand on a quiet machine; here only that they work and that their sides agree)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def run(script: str, *arguments: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments], capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout.strip().splitlines()


def test_evaluation_sides_agree_exactly_and_the_cli_ratio_comes_last() -> None:
    lines = run("evaluation.py", "--n", "1500", "--per-class", "3", "--threads", "1")
    assert [line.split()[0] for line in lines[1:5]] == ["floor", "dmlbench", "cli", "peer"]
    assert "largest metric difference between sides = 0" in lines
    assert lines[-1].startswith("time ratio cli / peer = ")
    assert float(lines[-1].rsplit("=", 1)[1]) > 0


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_evaluation_of_an_approximate_index_measures_its_recall(kind: str) -> None:
    lines = run("evaluation.py", "--n", "3000", "--kind", kind, "--skip-peer", "--skip-cli", "--threads", "1")
    recall = next(line for line in lines if line.startswith("recall"))
    # Noisy 128-d classes are hard for an index: an eighth of the inverted lists finds under half.
    assert 0.2 < float(recall.rsplit(" ", 1)[1]) <= 1.0
    assert lines[-1].startswith("time ratio dmlbench / floor = ")


def test_gpu_figures_run_on_a_cpu_at_tiny_sizes() -> None:
    lines = run(
        "gpu.py", "--device", "cpu", "--trunk", "small_cnn", "--image-size", "16", "--batch-size", "8",
        "--warmup", "1", "--steps", "2", "--modes", "fp32,bf16", "--n", "1000",
    )
    assert lines[0].startswith("device: CPU")
    assert [line.split()[0] for line in lines[1:3]] == ["fp32", "bf16"]
    assert "evaluation of N=1,000 x 128" in lines[3]
    assert lines[-1].startswith("fastest mode ")
