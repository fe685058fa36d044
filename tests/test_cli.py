import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import run_cli
from training_fixtures import TINY

REPO = Path(__file__).resolve().parent.parent


def test_python_dash_m_works() -> None:
    result = subprocess.run([sys.executable, "-m", "dmlbench", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for command in ("train", "evaluate", "benchmark", "search", "report", "audit", "data"):
        assert command in result.stdout


@pytest.mark.parametrize("command", [["train"], ["evaluate"], ["benchmark"], ["search"], ["report"], ["audit"], ["data"], ["data", "check"]])
def test_every_subcommand_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0 and "Usage" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "missing.yaml"], "config file missing.yaml does not exist"),
        (["train", str(REPO / "configs" / "glyphs.yaml"), "loss.name=nope"], "unknown loss 'nope'"),
        (["train", str(REPO / "configs" / "glyphs.yaml"), "training.batch_size=30"], "divisible"),
        (["train", "--resume"], "--resume needs --output"),
        (["evaluate", "no/such/run"], "does not exist"),
        (["benchmark", "missing.yaml"], "does not exist"),
        (["data", "check", "imagenet"], "unknown dataset 'imagenet'"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_train_then_evaluate_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code, out, err = run_cli(["train", str(REPO / "configs" / "glyphs.yaml"), *TINY, "--output", str(run_dir), "-q"], capsys)
    assert code == 0, err
    assert "best epoch" in out
    results_path = tmp_path / "test.json"
    code, out, err = run_cli(["evaluate", str(run_dir), "--json", str(results_path)], capsys)
    assert code == 0, err
    results = json.loads(results_path.read_text())
    for key in ("precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "r_precision", "map_at_r", "nmi"):
        assert 0.0 <= results[key] <= 1.0
        assert key in results["untrained"]
    assert "map_at_r" in out

    plot = tmp_path / "spectrum.png"
    code, out, err = run_cli(["evaluate", str(run_dir), "--analysis", "--plot", str(plot), "--json", str(results_path)], capsys)
    assert code == 0, err
    analysis = json.loads(results_path.read_text())["analysis"]
    assert analysis["rho"] > 0 and 0 < analysis["pi_ratio"]
    assert plot.stat().st_size > 0 and "train split" in out
    assert json.loads(results_path.read_text())["map_at_r"] == results["map_at_r"]

    code, _, err = run_cli(["train", "--resume", "--output", str(run_dir), "-q"], capsys)
    assert code == 0, err


def test_data_check_prints_classes_and_hash(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["data", "check", "glyphs", "max_classes=20", "augmentations_per_font=0", "image_size=16", "--json", "-"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["classes"] == 20
    assert len(summary["content_hash"]) == 64
    assert set(summary["splits"]) == {"train", "validation", "test"}


def test_builtin_benchmark_spec_is_valid() -> None:
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.plan import MethodPlan

    spec = load_spec(None)
    configs = {method.name: MethodPlan.build(spec, method.name, []).config for method in spec.methods}
    assert len(configs) >= 4
    assert len({config.loss.name for config in configs.values()}) == len(configs)


def test_main_called_again_registers_no_command_twice(capsys: pytest.CaptureFixture[str]) -> None:
    """A notebook or a test calls ``main`` many times in one process: each command is registered once,
    so a call does not rebuild the parameters of every earlier call's copies (each call grew slower)."""
    from dmlbench.cli import app

    for _ in range(3):
        assert run_cli(["list", "losses"], capsys)[0] == 0
        names = [command.name for command in app.registered_commands]
        assert len(names) == len(set(names)) and "train" in names
        assert [group.name for group in app.registered_groups] == ["data"]


def test_a_parameter_error_names_the_parameter_in_python_and_the_option_on_the_command_line(tmp_path: Path) -> None:
    """Library code names its parameters (``test_embeddings``); the command line shows the options
    that give them (``--test-embeddings``), the other words of the message untouched."""
    from dmlbench.deploy.images import list_images
    from dmlbench.errors import ParameterError, UserInputError

    error = ParameterError("embeddings", "a.npy holds 8-dimensional rows but `test_embeddings` b.npy 4-dimensional ones")
    assert str(error) == "embeddings a.npy holds 8-dimensional rows but `test_embeddings` b.npy 4-dimensional ones"
    assert error.as_options() == "--embeddings a.npy holds 8-dimensional rows but --test-embeddings b.npy 4-dimensional ones"
    # Any error may name a parameter beside its subject: `resume` for a Python caller, --resume on the command line.
    plain = UserInputError("run directory r already exists and is not empty (`resume` continues it)")
    assert plain.as_options() == "run directory r already exists and is not empty (--resume continues it)"
    assert UserInputError("a `b c` d").as_options() == "a `b c` d"  # a quoted command, not one name, is left as it is
    with pytest.raises(ParameterError, match=r"^images .* is not a directory$") as raised:
        list_images(tmp_path / "nowhere")
    assert raised.value.parameter == "images"
    # Through the command line: test_calibrate_cli (--fmr) and test_deploy (--label).
