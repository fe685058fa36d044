"""Plugins: your own components in the same protocol as the built-in ones (issue 22 §1, §4, §5).

In-process tests register components under names no other test uses (the registries live as long
as the test process); the end-to-end tests run the installed console script in a fresh process.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from test_cli_process import console_script

from dmlbench import config as config_module
from dmlbench import evaluation, losses, mining, plugins
import dmlbench
from dmlbench.catalog import components
from dmlbench.cli import main
from dmlbench.errors import UserInputError
from dmlbench.mining.tuples import all_triplets

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

PLUGIN = '''
import dmlbench
from dmlbench.losses import MetricLoss


@dmlbench.register_loss("{name}")
class Scaled(MetricLoss):
    """A test loss, Nobody et al. 2026 eq. 1: scale times the mean squared embedding."""

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, embeddings, labels, tuples=None):
        return self.scale * embeddings.pow(2).mean()
'''


def write_plugin(directory: Path, name: str) -> Path:
    path = directory / f"{name}.py"
    path.write_text(PLUGIN.format(name=name))
    return path


def test_a_plugin_named_in_a_config_builds_like_a_built_in_loss(tmp_path: Path) -> None:
    write_plugin(tmp_path, "plugin_loss_a")
    config_path = tmp_path / "run.yaml"
    config_path.write_text("plugins: [plugin_loss_a.py]\nloss: {name: plugin_loss_a, params: {scale: 3.0}}\n")
    config = config_module.load(config_path)  # a path relative to the config file, wherever this runs
    assert config.plugins == [str((tmp_path / "plugin_loss_a.py").resolve())]
    loss = losses.build(config.loss.name, **config.loss.params)
    embeddings = torch.ones(4, 2)
    assert float(loss(embeddings, torch.zeros(4, dtype=torch.long))) == pytest.approx(3.0)
    with pytest.raises(UserInputError, match="has no parameter 'scal'; it accepts: scale"):
        config_module.from_dict({"loss": {"name": "plugin_loss_a", "params": {"scal": 1.0}}})
    with pytest.raises(UserInputError, match="did you mean 'plugin_loss_a'"):
        config_module.from_dict({"loss": {"name": "plugin_loss_b"}})
    (entry,) = [e for e in components("losses") if e["name"] == "plugin_loss_a"]
    assert entry["parameters"] == {"scale": 2.0} and entry["source"] == "plugin_loss_a.py"
    assert entry["summary"].startswith("A test loss, Nobody et al. 2026 eq. 1")
    (record,) = plugins.used(config.plugins)
    assert record["path"] == str((tmp_path / "plugin_loss_a.py").resolve())
    assert len(record["sha256"]) == 64 and record["version"] is None


def test_a_plugin_may_not_take_a_built_in_name(tmp_path: Path) -> None:
    write_plugin(tmp_path, "plugin_loss_clash").write_text(PLUGIN.format(name="triplet"))
    with pytest.raises(UserInputError, match="plugin .*plugin_loss_clash.py: loss 'triplet' is already registered"):
        plugins.load([str(tmp_path / "plugin_loss_clash.py")])


@pytest.mark.parametrize("source, expected", [
    ("import not_a_module_anywhere\n", "ModuleNotFoundError: No module named 'not_a_module_anywhere'"),
    ("def broken(:\n", "SyntaxError"),
])
def test_a_plugin_that_cannot_be_imported_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, expected: str
) -> None:
    (tmp_path / "broken.py").write_text(source)
    with pytest.raises(SystemExit) as stopped:
        main(["--plugin", str(tmp_path / "broken.py"), "list", "losses"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1
    assert error.startswith(f"dmlbench: error: plugin {tmp_path / 'broken.py'} cannot be imported: {expected}")
    with pytest.raises(SystemExit) as stopped:
        main(["list", "losses", "--plugin", str(tmp_path / "missing.py")])
    assert stopped.value.code == 2 and "no such file" in capsys.readouterr().err


def test_a_benchmark_without_plugins_keeps_the_config_hash_it_had_before_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming a benchmark compares config hashes: the plugins key must not change old ones (the
    smoke benchmark's hash at 8bc0caf, before plugins existed, which a benchmark started before the
    analysis entered the hash keeps), nor the hash of a benchmark whose analysis is fixed."""
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare

    monkeypatch.setattr(plugins, "_LOADED", {})  # the plugins earlier tests imported into this process
    prepared = prepare(load_spec(REPO / "configs" / "smoke.yaml"), tmp_path / "out")
    assert prepared.plugins == [] and prepared.config_hash == "31291e1e60f50613"
    prepared.analysis_in_hash = False
    assert prepared.config_hash == "78362e6a273e758f"


def test_the_python_api_is_what_the_package_exports() -> None:
    assert dmlbench.register_loss is plugins.register_loss
    embeddings, labels = torch.eye(4), torch.tensor([0, 0, 1, 1])
    scores = dmlbench.evaluate(embeddings, labels, metrics=["precision_at_1"])
    # All distances tie: ties go to the lower index, so queries 0 and 1 find each other, 2 and 3 find 0.
    assert scores["precision_at_1"] == 0.5 and scores == evaluation.evaluate(embeddings, labels, metrics=["precision_at_1"])
    with pytest.raises(AttributeError):
        dmlbench.not_an_export  # noqa: B018


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def test_the_worked_example_ranks_a_plugin_a_pml_loss_and_built_ins_and_catches_changed_plugin_code(
    tmp_path: Path,
) -> None:
    """issue 22's done-means: examples/my_benchmark.yaml as docs/your-method.md runs it, on --jobs 2."""
    examples = tmp_path / "examples"
    shutil.copytree(EXAMPLES, examples)
    output = tmp_path / "out"
    result = run(["benchmark", "examples/my_benchmark.yaml", "-o", str(output), "-q", "--jobs", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    tables = dmlbench.load_results(output)
    methods = {row["method"] for row in tables["results"]}
    assert methods == {"soft_triplet", "pml_multi_similarity", "contrastive", "triplet_semihard", "untrained"}
    assert all(isinstance(row["mean"], float) and row["n"] == 2 for row in tables["results"])
    report = (output / "report.md").read_text()
    assert "soft_triplet" in report and "pml_multi_similarity" in report and "Every method against the references" in report
    benchmark = json.loads((output / "benchmark.json").read_text())
    assert [p["plugin"] for p in benchmark["plugins"]] == ["my_loss.py"]
    run_record = json.loads(next((output / "soft_triplet").glob("*/fold_0/run.json")).read_text())
    assert run_record["plugins"][0]["sha256"] == benchmark["plugins"][0]["sha256"]
    assert run(["audit", str(output)], tmp_path).returncode == 0

    listed = run(["--plugin", "examples/my_loss.py", "list", "losses", "--json"], tmp_path)
    (entry,) = [e for e in json.loads(listed.stdout) if e["name"] == "soft_triplet"]
    assert entry["parameters"] == {"scale": 1.0} and entry["source"] == "my_loss.py"

    with open(examples / "my_loss.py", "a") as stream:
        stream.write("# changed\n")
    refused = run(["benchmark", "examples/my_benchmark.yaml", "-o", str(output), "-q"], tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "plugin my_loss.py changed since the benchmark started" in refused.stderr and "--accept-plugin-changes" in refused.stderr
    accepted = run(["benchmark", "examples/my_benchmark.yaml", "-o", str(output), "-q", "--accept-plugin-changes"], tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    benchmark = json.loads((output / "benchmark.json").read_text())
    assert benchmark["plugins"][0]["sha256"] == run_record["plugins"][0]["sha256"]  # the benchmark's identity is kept
    (change,) = benchmark["plugin_changes_accepted"]
    assert change["changes"][0].startswith("plugin my_loss.py changed") and change["plugins"][0]["sha256"] != benchmark["plugins"][0]["sha256"]


def test_the_listing_tells_a_required_parameter_from_a_default_of_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``required`` names the parameters without a default; a default of ``None`` (the component
    chooses: emoji's ``vendors`` is every vendor found) is listed as ``None``, never as required."""
    (tmp_path / "plugin_required.py").write_text('''
import dmlbench
from dmlbench.losses import MetricLoss


@dmlbench.register_loss("plugin_required_scale")
class Required(MetricLoss):
    """A test loss whose scale must be given, and whose offset the loss chooses when not."""

    def __init__(self, scale: float, offset: float | None = None) -> None:
        super().__init__()
        self.scale, self.offset = scale, offset

    def forward(self, embeddings, labels, tuples=None):
        return self.scale * embeddings.pow(2).mean()
''')
    plugins.load([str(tmp_path / "plugin_required.py")])
    (entry,) = [e for e in components("losses") if e["name"] == "plugin_required_scale"]
    assert entry["parameters"] == {"scale": None, "offset": None} and entry["required"] == ["scale"]
    (emoji,) = [e for e in components("datasets") if e["name"] == "emoji"]
    assert emoji["parameters"]["vendors"] is None and "vendors" not in emoji["required"]
    code, listed, _ = run_cli(["list", "losses"], capsys)
    assert code == 0 and "      scale=required, offset=None" in listed
    code, listed, _ = run_cli(["list", "datasets"], capsys)
    # a file dataset's root (data.root) is required; emoji's vendors=None chooses every vendor found
    assert code == 0 and "      root=required, vendors=None," in listed and "image_size=32, augmentations" in listed
    assert all(entry["required"] == (["root"] if "root" in entry["parameters"] else []) for entry in components("datasets"))


def test_every_kind_of_component_registers_through_the_public_api(tmp_path: Path) -> None:
    (tmp_path / "plugin_kinds.py").write_text('''
import dmlbench
from dmlbench.mining.base import Miner
from dmlbench.mining.tuples import all_triplets


@dmlbench.register_miner("plugin_every_triplet")
class EveryTriplet(Miner):
    """Every valid triplet of the batch (a test miner)."""

    def mine(self, embeddings, labels):
        return all_triplets(labels)
''')
    plugins.load([str(tmp_path / "plugin_kinds.py")])
    config = config_module.from_dict({"loss": {"name": "triplet"}, "miner": {"name": "plugin_every_triplet"}})
    miner = mining.build(config.miner.name, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 0, 1, 1])
    assert len(miner(torch.eye(4), labels)) == len(all_triplets(labels))
    assert {"plugin_every_triplet"} <= {entry["name"] for entry in components("miners")}
    for register in (dmlbench.register_sampler, dmlbench.register_trunk, dmlbench.register_dataset):
        assert register.__name__.startswith("register_")


def test_the_audit_names_a_run_that_used_other_plugin_code() -> None:
    from protocol_fixtures import benchmark_record

    from dmlbench.protocol.inspection.audit import _audit_plugins
    from dmlbench.protocol.design.benchmark_file import PluginChange

    benchmark = benchmark_record(plugins=[{"plugin": "my_loss.py", "sha256": "a" * 64}])
    same = {"plugins": [{"plugin": "/x/my_loss.py", "module": "dmlbench_plugin_my_loss_1", "path": "/x/my_loss.py",
                         "version": None, "sha256": "a" * 64}]}
    other = {"plugins": [{**same["plugins"][0], "sha256": "b" * 64}]}
    assert _audit_plugins("m/trial_0/fold_0", same, benchmark) == []
    (problem,) = _audit_plugins("m/trial_0/fold_0", other, benchmark)
    assert problem.startswith("m/trial_0/fold_0: plugin my_loss.py changed since the benchmark started")
    accepted = benchmark.model_copy(update={"plugin_changes_accepted": [PluginChange(
        time="2026-01-01T00:00:00Z", changes=["plugin my_loss.py changed"], plugins=[{"plugin": "my_loss.py", "sha256": "b" * 64}])]})
    assert _audit_plugins("m/trial_0/fold_0", other, accepted) == []


def test_an_installed_package_plugs_in_through_its_entry_point(tmp_path: Path) -> None:
    # What `pip install` leaves on the path: the module and a dist-info folder naming it in the group.
    write_plugin(tmp_path, "installed_loss_plugin")
    info = tmp_path / "installed_loss_plugin-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: installed-loss-plugin\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nscaled = installed_loss_plugin\n")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    completed = subprocess.run(
        [console_script(), "list", "losses", "--json"], capture_output=True, text=True, env=environment, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stderr
    listed = {entry["name"]: entry for entry in json.loads(completed.stdout)}
    assert "installed_loss_plugin" in listed
    assert "scale" in json.dumps(listed["installed_loss_plugin"])
    broken = tmp_path / "installed_loss_plugin.py"
    broken.write_text("raise ImportError('a missing dependency of the plugin')\n")
    completed = subprocess.run(
        [console_script(), "list", "losses"], capture_output=True, text=True, env=environment, timeout=300, check=False
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        "dmlbench: error: plugin entry-point:scaled (installed_loss_plugin) cannot be imported: ImportError: a missing dependency of the plugin"
    ]
