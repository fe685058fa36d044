"""Training beside another CPU job, with OpenMP's default (spinning) and passive wait policies.

A two-thread training run (``configs/glyphs.yaml``, one short epoch) is timed in a fresh process
under each ``OMP_WAIT_POLICY`` (it is read once, when torch loads its OpenMP runtime, so it cannot
change inside one process), first on the quiet machine, then while a competing process keeps the
cores busy (by default another two-thread torch job, like a second benchmark started beside it).
Reported per policy: wall seconds per training step and CPU seconds per step of the training
process. Rounds alternate the policies so both see the same load; compare only within one run.

    python benchmarks/oversubscription.py                 # 3 rounds of 30 steps
    python benchmarks/oversubscription.py --rounds 5 --competitor busy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLICIES = ("default", "PASSIVE")

# One short training run, measured from inside: seconds and CPU seconds of the steps alone.
_TRAIN = """
import json, resource, sys, time
from pathlib import Path
from dmlbench import config as config_module
from dmlbench.training import records, train
config = config_module.load(sys.argv[1], ["training.epochs=1", f"training.max_steps_per_epoch={sys.argv[2]}",
                                          "training.num_threads=2"])
cpu = resource.getrusage(resource.RUSAGE_SELF)
train(config, Path(sys.argv[3]), progress=False)
used = resource.getrusage(resource.RUSAGE_SELF)
epoch = records.read_metrics(Path(sys.argv[3]))[-1]
print(json.dumps({"step": epoch["seconds"] / epoch["steps"],
                  "cpu": (used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime) / epoch["steps"]}))
"""

# What competes for the cores: a two-thread torch job that never sleeps, or plain busy loops.
_COMPETITORS = {
    "torch": "import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n",
    "busy": "import multiprocessing as m\n"
            "def spin():\n    while True:\n        pass\n"
            "if __name__ == '__main__':\n    [m.Process(target=spin).start() for _ in range(2)]\n    spin()\n",
}


def timed_run(policy: str, steps: int, directory: Path) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    run_dir = directory / f"{policy}-{time.monotonic_ns()}"
    output = subprocess.run([sys.executable, "-c", _TRAIN, str(REPO / "configs" / "glyphs.yaml"), str(steps),
                             str(run_dir)], env=env, check=True, capture_output=True, text=True, cwd=REPO)
    return json.loads(output.stdout.strip().splitlines()[-1])


def measure(label: str, rounds: int, steps: int, directory: Path) -> dict[str, dict[str, float]]:
    samples: dict[str, dict[str, list[float]]] = {policy: {"step": [], "cpu": []} for policy in POLICIES}
    for round_ in range(rounds):
        order = POLICIES if round_ % 2 == 0 else POLICIES[::-1]
        for policy in order:
            result = timed_run(policy, steps, directory)
            for key in ("step", "cpu"):
                samples[policy][key].append(result[key])
            print(f"{label}, round {round_}, {policy}: {result['step']:.3f} s/step, {result['cpu']:.3f} CPU s/step "
                  f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    return {policy: {key: statistics.median(values) for key, values in by_key.items()}
            for policy, by_key in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--competitor", choices=sorted(_COMPETITORS), default="torch")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        timed_run("default", 2, directory)  # generate and cache the dataset before timing anything
        quiet = measure("quiet", arguments.rounds, arguments.steps, directory)
        competitor = subprocess.Popen([sys.executable, "-c", _COMPETITORS[arguments.competitor]],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(2)
            loaded = measure(f"beside a {arguments.competitor} job", arguments.rounds, arguments.steps, directory)
        finally:
            os.killpg(competitor.pid, 9)
            competitor.wait()
    for label, result in (("quiet", quiet), (f"beside a {arguments.competitor} job", loaded)):
        ratio = result["PASSIVE"]["step"] / result["default"]["step"]
        cpu_ratio = result["PASSIVE"]["cpu"] / result["default"]["cpu"]
        print(f"{label}: step time PASSIVE / default {ratio:.2f}, CPU time PASSIVE / default {cpu_ratio:.2f} "
              f"(default {result['default']['step']:.3f} s/step, PASSIVE {result['PASSIVE']['step']:.3f} s/step)")


if __name__ == "__main__":
    main()
