"""A run trained with ``--plugin`` opens without it: evaluate, embed and export import the plugins
its run.json records, warn in one line when a plugin's source changed and refuse in one line (exit 2,
naming the file and ``--plugin``) when the file is gone (issue 32, leftovers).

Fresh processes throughout: in this one the plugin would already be registered, whatever the fix.
"""

import json
import subprocess
from pathlib import Path

import pytest
from test_cli_process import console_script
from test_plugins import write_plugin
from training_fixtures import TINY

REPO = Path(__file__).resolve().parent.parent


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.slow
def test_a_plugin_run_opens_without_plugin_and_names_a_changed_or_missing_plugin(tmp_path: Path) -> None:
    plugin = write_plugin(tmp_path, "recorded_plugin_scaled")
    overrides = [*TINY, "training.epochs=1", "evaluation.metrics=[map_at_r]", "loss.name=recorded_plugin_scaled",
                 "loss.params={}", "miner.name=null"]
    trained = run(["--plugin", "recorded_plugin_scaled.py", "train", str(REPO / "configs" / "glyphs.yaml"), *overrides,
                   "-o", "run", "-q"], tmp_path)
    assert trained.returncode == 0, trained.stderr
    (record,) = json.loads((tmp_path / "run" / "run.json").read_text())["plugins"]
    assert record["path"] == str(plugin.resolve())

    # Unchanged: no --plugin needed, and nothing to warn about.
    evaluated = run(["evaluate", "run", "--json", "metrics.json"], tmp_path)
    assert evaluated.returncode == 0 and evaluated.stderr == "", evaluated.stderr
    assert (tmp_path / "metrics.json").is_file()

    # Changed: one warning line naming the file, and the work is done.
    with open(plugin, "a") as stream:
        stream.write("# changed after training\n")
    embedded = run(["embed", "run", "-o", "emb", "--data", "glyphs", "-q"], tmp_path)
    assert embedded.returncode == 0, embedded.stderr
    (warning,) = embedded.stderr.splitlines()
    assert warning.startswith(f"dmlbench: warning: plugin {plugin.resolve()} changed since run run was trained")
    assert (tmp_path / "emb.npy").is_file()

    # Gone: one error line naming the file and --plugin, exit 2, nothing written.
    moved = tmp_path / "moved"
    moved.mkdir()
    plugin.rename(moved / plugin.name)
    refused = run(["export", "run", "--format", "onnx", "-o", "model.onnx"], tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"dmlbench: error: run run was trained with the plugin file {plugin.resolve()}, which no longer exists: "
        "give it with --plugin FILE"]
    assert not (tmp_path / "model.onnx").exists()

    # Given again from its new place (the same file name): accepted, with the changed source still named.
    exported = run(["--plugin", "moved/recorded_plugin_scaled.py", "export", "run", "--format", "onnx", "-o", "model.onnx"],
                   tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stderr.splitlines()) == 1
    assert f"plugin {(moved / plugin.name).resolve()} changed since run run was trained" in exported.stderr
    assert (tmp_path / "model.onnx").is_file()
