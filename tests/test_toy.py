"""``dmlbench toy``: the 2-D rho-regularisation toy example (Roth et al. 2020 Fig. 6, supp. G)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from dmlbench import toy
from dmlbench.errors import UserInputError
from dmlbench.evaluation import embedding_space, evaluate
from dmlbench.toy import experiment

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FAST = 30  # iterations in the tests; the command's default is the paper's 200


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, toy.ToyResult]:
    output = tmp_path_factory.mktemp("toy")
    return output, toy.run(output, seeds=3, p_switches=(0.001, 0.3), iterations=FAST)


def test_lines_have_four_classes_of_fifteen_points() -> None:
    for variant in toy.VARIANTS:
        data = toy.make_lines(variant, torch.Generator().manual_seed(0))
        for points, labels in ((data.train_points, data.train_labels), (data.test_points, data.test_labels)):
            assert points.shape == (60, 2) and labels.tolist() == [c for c in range(4) for _ in range(15)]
            assert float(points.abs().max()) <= 1.25
    axes = toy.make_lines("axes", torch.Generator().manual_seed(0))
    # training lines differ only in x, test lines only in y
    for label in range(4):
        assert axes.train_points[axes.train_labels == label, 0].unique().numel() == 1
        assert axes.test_points[axes.test_labels == label, 1].unique().numel() == 1


def test_files_and_json_structure(small_run: tuple[Path, toy.ToyResult]) -> None:
    output, result = small_run
    assert (output / "toy.png").read_bytes()[:8] == PNG_SIGNATURE
    summary = json.loads((output / "toy.json").read_text())
    assert summary == json.loads(json.dumps(result.summary))
    assert summary["settings"]["seeds"] == [0, 1, 2]
    assert summary["settings"]["p_switch"] == [0.0, 0.001, 0.3]
    assert set(summary["variants"]) == {"diagonal", "axes"}
    for entry in summary["variants"].values():
        assert [model["name"] for model in entry["models"]] == ["plain", "rho_p0.001", "rho_p0.3"]
        assert [difference["p_switch"] for difference in entry["differences"]] == [0.001, 0.3]
        for block in [*entry["models"], *entry["differences"]]:
            for key in ("rho", "recall_at_1"):
                stats = block[key]
                assert len(stats["per_seed"]) == 3
                assert math.isclose(stats["mean"], sum(stats["per_seed"]) / 3, rel_tol=1e-12, abs_tol=1e-15)
                low, high = stats["ci95"]
                assert low <= stats["mean"] <= high
        for model in entry["models"]:
            assert all(0.0 <= value <= 1.0 for value in model["recall_at_1"]["per_seed"])
            assert len(model["switched_tuples"]) == 3 and len(model["singular_values"]) == 3
            assert all(len(values) == 2 for values in model["singular_values"])
        plain, _, strong = entry["models"]
        assert plain["switched_tuples"] == [0, 0, 0]
        assert all(count > 0 for count in strong["switched_tuples"])


def test_interval_is_the_student_t_interval() -> None:
    from scipy import stats

    values = [0.2, 0.5, 0.4, 0.9]
    result = experiment.interval(values)
    expected = stats.t.interval(0.95, 3, loc=sum(values) / 4, scale=stats.sem(values))
    assert result["ci95"] == pytest.approx(list(expected), rel=1e-12)
    assert experiment.interval([0.5, 0.5])["ci95"] == [0.5, 0.5]


def test_rho_and_recall_come_from_the_library(small_run: tuple[Path, toy.ToyResult]) -> None:
    _, result = small_run
    summary = result.summary
    for variant, by_p in result.runs.items():
        for index, (p_switch, runs) in enumerate(by_p.items()):
            stored = summary["variants"][variant]["models"][index]
            assert stored["p_switch"] == p_switch
            for seed, run in enumerate(runs):
                analysis = embedding_space.analyze(run.train_embeddings, run.data.train_labels, drop=0)
                assert stored["rho"]["per_seed"][seed] == analysis["rho"]
                assert stored["singular_values"][seed] == analysis["singular_values"]
                recall = evaluate(run.test_embeddings, run.data.test_labels, metrics=["recall_at_1"])["recall_at_1"]
                assert stored["recall_at_1"]["per_seed"][seed] == recall
                norms = run.train_embeddings.norm(dim=1)
                assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def test_rho_is_computed_by_embedding_space_analyze(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []
    original = embedding_space.analyze

    def spy(embeddings, labels, **kwargs):  # noqa: ANN001, ANN202
        result = original(embeddings, labels, **kwargs)
        calls.append((embeddings.clone(), kwargs, result["rho"]))
        return result

    monkeypatch.setattr(embedding_space, "analyze", spy)
    result = toy.run(tmp_path, variants=["axes"], seeds=2, iterations=5, figure=False)
    by_p = result.runs["axes"]
    runs = [by_p[p_switch][seed] for seed in range(2) for p_switch in by_p]  # training order: seed, then model
    assert len(calls) == len(runs) == 4
    for (embeddings, kwargs, rho), run in zip(calls, runs):
        assert kwargs == {"drop": 0}
        assert torch.equal(embeddings, run.train_embeddings) and rho == run.rho


def test_models_of_one_seed_differ_only_by_switches(tmp_path: Path) -> None:
    data = toy.make_lines("diagonal", experiment.data_generator(0))
    plain = toy.train_model(data, 0, 0.0, iterations=FAST)
    # p_switch so small that no tuple is switched in FAST iterations: the model is the plain one
    tiny = toy.train_model(data, 0, 1e-9, iterations=FAST)
    assert tiny.switched_tuples == 0
    assert torch.equal(plain.train_embeddings, tiny.train_embeddings)
    switched = toy.train_model(data, 0, 0.5, iterations=FAST)
    assert switched.switched_tuples > 0
    assert not torch.equal(plain.train_embeddings, switched.train_embeddings)


def test_training_models_together_equals_training_each_alone() -> None:
    data = [toy.make_lines("axes", experiment.data_generator(seed)) for seed in (0, 1)]
    jobs = [(data[0], 0, 0.0), (data[0], 0, 0.3), (data[1], 1, 0.0)]
    together = experiment.train_models(jobs, iterations=FAST)
    for job, stacked in zip(jobs, together):
        alone = toy.train_model(*job, iterations=FAST)
        assert torch.equal(alone.train_embeddings, stacked.train_embeddings)
        assert torch.equal(alone.test_embeddings, stacked.test_embeddings)
        assert (alone.rho, alone.recall_at_1, alone.switched_tuples) == (stacked.rho, stacked.recall_at_1, stacked.switched_tuples)


def test_same_seed_gives_identical_json(tmp_path: Path) -> None:
    texts = []
    for name in ("a", "b"):
        toy.run(tmp_path / name, variants=["diagonal"], seeds=2, iterations=FAST, figure=False)
        texts.append((tmp_path / name / "toy.json").read_text())
    assert texts[0] == texts[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variants": ["spiral"]}, "unknown toy variant 'spiral'"),
        ({"variants": []}, "at least one toy variant"),
        ({"seeds": 1}, "seeds must be an integer >= 2"),
        ({"seeds": 0}, "seeds must be an integer >= 2"),
        ({"p_switches": [1.5]}, "p_switch must lie in [0, 1]"),
        ({"p_switches": [-0.1]}, "p_switch must lie in [0, 1]"),
        ({"p_switches": [float("nan")]}, "p_switch must lie in [0, 1]"),
        ({"iterations": 0}, "iterations must be an integer >= 1"),
    ],
)
def test_bad_input_is_a_user_error(kwargs: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(UserInputError) as error:
        toy.run(tmp_path / "out", **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_option_parsing() -> None:
    assert toy.parse_p_switches("0, 0.001,0.3") == (0.0, 0.001, 0.3)
    assert toy.parse_variants("both") == ("diagonal", "axes")
    assert toy.parse_variants("axes") == ("axes",)
    with pytest.raises(UserInputError, match="comma list"):
        toy.parse_p_switches("0.1,abc")
    with pytest.raises(UserInputError, match="must lie in"):
        toy.parse_p_switches("2")
    with pytest.raises(UserInputError, match="unknown toy variant"):
        toy.parse_variants("diagonal,circles")


def _app() -> typer.Typer:
    from dmlbench.cli.toy import register

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """Test app."""

    register(app)
    return app


def test_command_through_typer(tmp_path: Path) -> None:
    output = tmp_path / "toy"
    result = CliRunner().invoke(
        _app(), ["toy", "--variant", "axes", "--seeds", "2", "--p-switch", "0.01,0.1", "--iterations", "20", "-o", str(output)]
    )
    assert result.exit_code == 0, result.output
    assert "rho_p0.01 - plain" in result.output and "Recall@1" in result.output
    summary = json.loads((output / "toy.json").read_text())
    assert list(summary["variants"]) == ["axes"]
    assert summary["settings"]["p_switch"] == [0.0, 0.01, 0.1]
    assert summary["settings"]["iterations"] == 20
    assert (output / "toy.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variant", "spiral"], "unknown toy variant"),
        (["--seeds", "1"], "seeds must be an integer >= 2"),
        (["--p-switch", "1.2"], "p_switch must lie in [0, 1]"),
        (["--p-switch", "0.1", "--sweep"], "not both"),
    ],
)
def test_command_bad_input_raises_user_error(argv: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["toy", *argv, "-o", str(tmp_path / "out")])
    assert isinstance(result.exception, UserInputError)
    assert message in str(result.exception)
    assert not (tmp_path / "out" / "toy.json").exists()


def test_command_module_imports_no_torch_or_matplotlib() -> None:
    code = "import sys, dmlbench.cli.toy; print(any(m in sys.modules for m in ('torch', 'matplotlib', 'dmlbench.toy')))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert completed.stdout.strip() == "False"
