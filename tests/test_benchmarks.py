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
    """Every section of benchmarks/gpu.py (steps, the tuned anchor, a train, evaluation and its check
    against the CPU path) on the CPU device, each ending in its target line."""
    lines = run(
        "gpu.py", "--device", "cpu", "--trunk", "small_cnn", "--image-size", "16", "--batch-size", "8",
        "--warmup", "1", "--steps", "2", "--modes", "default,fast", "--classes", "20", "--augmentations", "0",
        "--epochs", "2", "--n", "1000", "--check", "400",
    )
    assert lines[0].startswith("device: CPU") and "precision auto = fp32" in lines[0]
    assert [line.split()[:2] for line in lines[1:4]] == [["dmlbench", "default"], ["dmlbench", "fast"], ["anchor", "tuned"]]
    assert "evaluation of N=1,000 x 128 on cpu" in lines[4]
    assert "identical" in lines[5] and lines[5].endswith("largest metric difference 0.0e+00")
    assert lines[6].startswith("train     2 epochs of glyphs (20 classes)") and "'channels_last': False" in lines[6]
    targets = [line for line in lines if line.startswith("target ")]
    assert len(targets) == 6 and all(line.endswith("(CPU: not a target)") for line in targets)
    assert "not measured" in targets[3]  # GPU busy: no GPU to sample


def test_fold_units_sides_agree_on_one_method_of_a_benchmark_that_declares_comparisons() -> None:
    """The built-in benchmark names its references: one method of it runs with them dropped, both ways (one
    search of it: the fixed design, so that a method compared with nothing runs no rounds)."""
    config = BENCHMARKS.parent / "src" / "dmlbench" / "configs" / "benchmark.yaml"
    lines = run("fold_units.py", "--config", str(config), "--method", "multi_similarity", "--folds", "2",
                "protocol.trials=2", "protocol.reproductions=2", "protocol.epochs=1", "protocol.sequential=false",
                "protocol.max_searches=null")
    assert lines[-2] == "results.csv and runs.csv: identical"
    assert lines[-1].startswith("wall-time ratio fold_units / sequential: ") and float(lines[-1].rsplit(" ", 1)[1]) > 0


def test_tost_power_sides_agree_bit_for_bit_and_the_ratio_comes_last() -> None:
    lines = run("tost_power.py")
    assert lines[0] == "120 designs; values that differ: 0"
    assert lines[-1].startswith("ratio (scipy public) / (dmlbench): ")


@pytest.mark.slow
def test_slurm_overhead_runs_both_ways_on_a_cluster_and_their_results_agree() -> None:
    """Starts the tests' one-node SLURM (root and Debian's packages) when SLURM_CONF names none."""
    import slurm_cluster

    if slurm_cluster.missing_reason() is not None:
        pytest.skip(slurm_cluster.missing_reason())
    lines = run("slurm_overhead.py", "--rounds", "1")
    assert "round 0: results.csv and runs.csv identical: True" in lines
    assert lines[-1].startswith("ratio (--slurm) / (local): ")
