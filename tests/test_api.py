"""The Python API (docs/api.md) as a script uses it: in a process of its own, output included."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
import optuna
import dmlbench

optuna.logging.set_verbosity(optuna.logging.INFO)   # the caller's own choice, given back after the call
outcome = dmlbench.benchmark(sys.argv[1], sys.argv[2], ["protocol.trials=1"])
print(sorted(outcome.results), outcome.failed, optuna.logging.get_verbosity() == optuna.logging.INFO)
"""


def test_benchmark_without_progress_prints_nothing_and_keeps_the_callers_optuna_verbosity(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "configs" / "smoke.yaml"), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # Optuna logs "A new study created ..." per study at INFO; the call hides them (about 25 lines before).
    assert not [line for line in result.stderr.splitlines() if line.startswith("[I ")], result.stderr
    assert result.stdout == "['normalized_softmax', 'triplet_semihard', 'untrained'] {} True\n"
