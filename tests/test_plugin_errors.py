"""Plugin mistakes and config mix-ups end as one line, never a traceback (issue 32, "Tracebacks").

Through the CLI in this process (``cli_runner.run_cli``). The registries live as long as the test
process, so every plugin here registers names no other test uses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest
from cli_runner import run_cli
from training_fixtures import TINY

from dmlbench.protocol import layout
from dmlbench.protocol.design.benchmark import load_spec
from dmlbench.protocol.design.prepare import prepare
from dmlbench.protocol.run.record import write_benchmark_file
from dmlbench.training import records

REPO = Path(__file__).resolve().parent.parent
GLYPHS = str(REPO / "configs" / "glyphs.yaml")
SMOKE = REPO / "configs" / "smoke.yaml"

# A loss without a constructor of its own (torch's refuses every argument), one with its own, a
# miner that inherits ``Miner.__init__(generator)``.
COMPONENTS = '''
import dmlbench
from dmlbench.losses import MetricLoss
from dmlbench.mining import all_triplets
from dmlbench.mining.base import Miner


@dmlbench.register_loss("errors_no_init")
class NoInit(MetricLoss):
    """A test loss without __init__."""

    def forward(self, embeddings, labels, tuples=None):
        return embeddings.pow(2).mean()


@dmlbench.register_loss("errors_scaled")
class Scaled(MetricLoss):
    """A test loss with one parameter."""

    uses_tuples = True

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, embeddings, labels, tuples=None):
        return self.scale * embeddings.pow(2).mean()


@dmlbench.register_miner("errors_every_triplet")
class EveryTriplet(Miner):
    """A test miner."""

    def mine(self, embeddings, labels):
        return all_triplets(labels)
'''

# ``forward`` calls a helper of the plugin that calls into the standard library, which raises: the
# line named is the helper's call, the last frame in the plugin, not json's own frames.
RAISING = '''
import json
import os

import dmlbench
from dmlbench.losses import MetricLoss


def _parse(text):
    return json.loads(text)


@dmlbench.register_loss("{name}")
class Raising(MetricLoss):
    """A test loss that fails on its first batch (unless ERRORS_PLUGIN_HEALED is set)."""

    def forward(self, embeddings, labels, tuples=None):
        if not os.environ.get("ERRORS_PLUGIN_HEALED"):
            _parse("{{not json")
        return embeddings.pow(2).mean()
'''
FORWARDING = '''
import dmlbench
from dmlbench.losses import MetricLoss


@dmlbench.register_loss("errors_forwarding")
class Forwarding(MetricLoss):
    """A test loss that hands unknown options to its base class."""

    def __init__(self, scale: float = 1.0, **options) -> None:
        super().__init__(**options)
        self.scale = scale

    def forward(self, embeddings, labels, tuples=None):
        return self.scale * embeddings.pow(2).mean()
'''
RAISING_LINE = RAISING.splitlines().index("    return json.loads(text)") + 1
FORWARD_LINE = RAISING.splitlines().index('            _parse("{{not json")') + 1
DECODE_ERROR = "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
SMALL = [*TINY, "training.epochs=1", "training.max_steps_per_epoch=2", "loss.params={}", "miner.name=null", "-q"]


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plugin") / "errors_components.py"
    path.write_text(COMPONENTS)
    return path


def one_line(error: str) -> str:
    """The single line of ``error`` (stderr), with no traceback."""
    assert "Traceback" not in error and error.count("\n") == 1, error
    return error.removesuffix("\n")


@pytest.mark.parametrize(("overrides", "message"), [
    (["loss.name=errors_no_init", "miner.name=null"],
     "loss.params of loss 'errors_no_init' has no parameter 'margin'; it accepts: none; loss.name changed from "
     "'triplet' to 'errors_no_init' but loss.params kept the old loss's: add loss.params={} to drop the old loss's parameters"),
    (["loss.name=errors_scaled", "loss.params.swap=true"],
     "loss.params of loss 'errors_scaled' has no parameters 'margin', 'swap'; it accepts: scale; loss.name changed from "
     "'triplet' to 'errors_scaled' but loss.params kept the old loss's: add loss.params={} to drop the old loss's parameters"),
    (["miner.name=errors_every_triplet", "miner.params={k: 3}"],
     "miner.params of miner 'errors_every_triplet' has no parameter 'k'; it accepts: generator"),
    (["loss.name=errors_no_init", "loss.params={scale: 2}", "miner.name=null"],
     "loss.params of loss 'errors_no_init' has no parameter 'scale'; it accepts: none"),
])
def test_a_plugin_parameter_its_constructor_does_not_take_is_refused_before_training(
    components: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], message: str
) -> None:
    """The first case is issue 32's: glyphs.yaml's margin given to a plugin loss without __init__ (a
    TypeError from torch's constructor, after the data was loaded, before this check)."""
    code, _, error = run_cli(["--plugin", str(components), "train", GLYPHS, *overrides, "-o", str(tmp_path / "run")], capsys)
    assert code == 2 and one_line(error) == f"dmlbench: error: {message}"
    assert not (tmp_path / "run").exists()


def test_a_benchmark_checks_every_method_s_plugin_parameters_before_anything_trains(
    components: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = yaml_of(SMOKE)
    spec["plugins"] = [str(components)]
    spec["base"]["loss"] = {"name": "triplet", "params": {"margin": 0.2}}
    spec["methods"][1]["overrides"] = {"loss.name": "errors_scaled"}
    spec["methods"][1]["search"] = {}
    config = tmp_path / "bench.yaml"
    config.write_text(json.dumps(spec))  # JSON is YAML
    code, _, error = run_cli(["benchmark", str(config), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and one_line(error) == (
        "dmlbench: error: method 'normalized_softmax': loss.params of loss 'errors_scaled' has no parameter 'margin'; "
        "it accepts: scale; loss.name changed from 'triplet' to 'errors_scaled' but loss.params kept the old loss's: "
        "add loss.params={} to drop the old loss's parameters")
    assert not (tmp_path / "out").exists()


def test_a_miner_named_none_says_that_null_turns_it_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, error = run_cli(["train", GLYPHS, "miner.name=none", "-o", str(tmp_path / "run")], capsys)
    line = one_line(error)
    assert code == 2 and line.startswith("dmlbench: error: unknown miner 'none'; known: ")
    assert line.endswith("; miner.name=null turns the miner off") and "semihard" in line
    assert not (tmp_path / "run").exists()


def test_a_parameter_the_config_itself_gives_a_loss_has_no_switch_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hint is for parameters kept from the loss an override replaced, not for a typo."""
    code, _, error = run_cli(["train", GLYPHS, "loss.params.margn=0.1", "-o", str(tmp_path / "run")], capsys)
    assert code == 2 and one_line(error) == ("dmlbench: error: loss.params of loss 'triplet' has no parameter 'margn'; "
                                             "it accepts: margin")


@pytest.mark.parametrize("name", ["smoke.yaml", "my_benchmark.yaml"])
def test_train_of_a_benchmark_config_says_what_it_is(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / ("configs" if name == "smoke.yaml" else "examples") / name
    code, _, error = run_cli(["train", str(path), "loss.name=triplet", "-o", str(tmp_path / "run")], capsys)
    assert code == 2 and one_line(error) == (
        f"dmlbench: error: {path} is a benchmark config (base, methods, protocol), not a run config: run it with "
        f"`dmlbench benchmark {path}`; to train one of its methods alone, give `dmlbench train` a run config "
        "(e.g. configs/glyphs.yaml) and the method's overrides (a method's run config is the benchmark's base with "
        "its overrides)")
    assert not (tmp_path / "run").exists()


def test_a_plugin_that_raises_in_forward_fails_the_run_with_one_line_and_an_error_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = tmp_path / "raising_forward.py"
    plugin.write_text(RAISING.format(name="errors_raising_forward"))
    run_dir = tmp_path / "run"
    code, _, error = run_cli(["--plugin", str(plugin), "train", GLYPHS, *SMALL, "loss.name=errors_raising_forward",
                              "-o", str(run_dir)], capsys)
    reason = f"plugin {plugin} raised {DECODE_ERROR} (at {plugin}:{RAISING_LINE} in _parse)"
    assert code == 1
    assert one_line(error) == f"dmlbench: error: {reason}; run {run_dir} marked failed, traceback in {run_dir / 'error.log'}"
    record = json.loads((run_dir / records.RUN_FILE).read_text())
    assert record["status"] == "failed" and record["reason"] == reason
    log = (run_dir / records.ERROR_LOG).read_text()
    assert log.startswith("Traceback (most recent call last):") and log.rstrip().endswith(f"json.decoder.{DECODE_ERROR}")
    # The whole chain: the plugin's forward and helper, then json's own frames below them.
    plugin_frames = re.findall(rf'File "{re.escape(str(plugin))}", line (\d+), in (\w+)', log)
    assert plugin_frames == [(str(FORWARD_LINE), "forward"), (str(RAISING_LINE), "_parse")]
    assert log.index(f'File "{plugin}", line {RAISING_LINE}') < log.index("json/decoder.py")


def test_a_failed_run_resumed_after_the_fix_drops_its_error_log_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = tmp_path / "raising_resume.py"
    plugin.write_text(RAISING.format(name="errors_raising_resume"))
    run_dir = tmp_path / "run"
    code, _, _ = run_cli(["--plugin", str(plugin), "train", GLYPHS, *SMALL, "loss.name=errors_raising_resume",
                          "-o", str(run_dir)], capsys)
    assert code == 1 and (run_dir / records.ERROR_LOG).is_file()
    monkeypatch.setenv("ERRORS_PLUGIN_HEALED", "1")
    code, out, error = run_cli(["--plugin", str(plugin), "train", "--resume", "-o", str(run_dir), "-q"], capsys)
    assert code == 0, error
    record = json.loads((run_dir / records.RUN_FILE).read_text())
    assert record["status"] == "completed" and "reason" not in record and len(record["resumed"]) == 1
    assert not (run_dir / records.ERROR_LOG).exists()


def test_a_plugin_constructor_that_raises_is_one_line_before_a_run_directory_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A constructor taking ``**kwargs`` cannot be checked before it runs: it passes glyphs.yaml's
    margin on to torch's constructor, which refuses it. Still one line, naming the plugin's line."""
    plugin = tmp_path / "forwarding_init.py"
    plugin.write_text(FORWARDING)
    code, _, error = run_cli(["--plugin", str(plugin), "train", GLYPHS, *TINY, "loss.name=errors_forwarding",
                              "miner.name=null", "-o", str(tmp_path / "run")], capsys)
    line = FORWARDING.splitlines().index("        super().__init__(**options)") + 1
    assert code == 1 and one_line(error) == (
        f"dmlbench: error: plugin {plugin} raised TypeError: Forwarding.__init__() got an unexpected keyword argument "
        f"'margin' (at {plugin}:{line} in __init__)")
    assert not (tmp_path / "run").exists()


def test_a_plugin_that_raises_in_a_benchmark_fails_its_unit_with_that_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = tmp_path / "raising_bench.py"
    plugin.write_text(RAISING.format(name="errors_raising_bench"))
    spec = yaml_of(SMOKE)
    spec["plugins"] = [str(plugin)]
    spec["base"]["data"]["options"]["max_classes"] = 40
    spec["base"]["training"]["max_steps_per_epoch"] = 2
    spec["protocol"].update(trials=1, reproductions=2)
    # A second method that works: the untrained baseline starts from it, and keeps it once the first is retried.
    spec["methods"] = [{"name": "raising", "overrides": {"loss.name": "errors_raising_bench"}},
                       {"name": "contrastive", "overrides": {"loss.name": "contrastive"}}]
    config = tmp_path / "bench.yaml"
    config.write_text(json.dumps(spec))
    output = tmp_path / "out"
    code, _, error = run_cli(["benchmark", str(config), "-o", str(output), "-q"], capsys)
    assert code == 1
    run_dir = layout.fold_dir(layout.trial_dir(output, "raising", 0), 0)
    record = json.loads((run_dir / records.RUN_FILE).read_text())
    reason = f"plugin {plugin} raised {DECODE_ERROR} (at {plugin}:{RAISING_LINE} in _parse)"
    full = f"{reason}; run {run_dir} marked failed, traceback in {run_dir / 'error.log'}"
    # The plugin's error on stderr (also under -q) and in report.md, with the way to run it again.
    assert "Traceback" not in error and f"dmlbench: error: raising trial 0 failed ({full})\n" in error
    assert f"dmlbench: error: method raising failed: no search trial completed (1 failed; the first: {full})\n" in error
    assert "run the same command with --retry-failed" in error
    assert f"- raising: no search trial completed (1 failed; the first: {full})" in (output / "report.md").read_text()
    assert record["status"] == "failed" and record["reason"] == reason
    assert "json.decoder.JSONDecodeError" in (run_dir / records.ERROR_LOG).read_text()
    study = optuna.load_study(study_name="raising", storage=f"sqlite:///{output / 'study.db'}")
    (trial,) = study.trials
    assert trial.user_attrs["fail_reason"] == full
    # status: nothing is left of a method whose search failed.
    code, out, _ = run_cli(["status", str(output)], capsys)
    assert "search failed" in out and "time left: none" in out
    # The same command again: still a failure, said so, not "done".
    code, _, error = run_cli(["benchmark", str(config), "-o", str(output), "-q"], capsys)
    assert code == 1 and "method raising failed" in error and "--retry-failed" in error
    # Its cause fixed, --retry-failed runs the failed unit again and the benchmark completes.
    monkeypatch.setenv("ERRORS_PLUGIN_HEALED", "1")
    code, _, error = run_cli(["benchmark", str(config), "-o", str(output), "-q", "--retry-failed"], capsys)
    assert code == 0, error
    assert "--retry-failed: 1 failed unit(s) to run again" in error
    assert "failed" not in (output / "report.md").read_text().split("## ")[1]  # the summary names no failure
    code, out, _ = run_cli(["status", str(output)], capsys)
    assert re.search(r"raising .* 2/2", out) and "time left: none" in out


def test_continuing_another_benchmark_names_what_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out"
    output.mkdir()
    # The benchmark.json a real start writes (its description, storage, hash and provenance).
    write_benchmark_file(prepare(load_spec(SMOKE), output))
    stored = (output / layout.BENCHMARK_FILE).read_bytes()
    code, _, error = run_cli(["benchmark", str(SMOKE), "protocol.trials=3", "training.epochs=2", "protocol.folds=3",
                              "-o", str(output), "--dry-run"], capsys)
    line = one_line(error)
    assert code == 2
    assert line.startswith(f"dmlbench: error: {output} holds a benchmark with other settings (spec.protocol.folds: 2 -> 3, "
                           'spec.protocol.trials: 2 -> 3, overrides: [] -> ["training.epochs=2"] and ')
    assert line.endswith(" more): re-run the command that started it, or use a new output directory")
    # Each difference once: protocol is also described inside spec; the rest is the fold layout.
    more = int(re.search(r" and (\d+) more\)", line).group(1))
    assert more >= 1 and "protocol.folds: 2 -> 3, protocol" not in line
    assert (output / layout.BENCHMARK_FILE).read_bytes() == stored  # nothing written over it


def yaml_of(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())
