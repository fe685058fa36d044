"""The report's page: the order of its sections, Markdown inline marks in the HTML, the figures' axes
and styles, the protocol in words and the set-up section, on a constructed ``ReportData``."""

import inspect
import itertools
from pathlib import Path

import numpy as np
import optuna
import pytest
from matplotlib.colors import to_rgba

from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord, StoredMethod, StoredSpec
from dmlbench.protocol.units.results import MethodReproductions, ReproductionOutcome
from dmlbench.report import plots, render, tables
from dmlbench.report.analysis import analyse
from dmlbench.report.data import ReportData
from dmlbench.report.sections import Section, _saturation_section, sections

METHODS = ["contrastive", "triplet", "margin", "fastap"]
SPEC = {
    "base": {"seed": 0, "data": {"name": "glyphs", "options": {"max_classes": 160, "image_size": 24}},
             "model": {"trunk": "small_cnn", "embedding_dim": 64, "options": {"width": 16}},
             "sampler": {"name": "spc", "params": {"samples_per_class": 4}},
             "optimizer": {"name": "adam", "lr": 0.001, "weight_decay": 0.0004},
             "training": {"epochs": 8, "batch_size": 64, "max_steps_per_epoch": 20}},
    "methods": [
        {"name": "contrastive", "overrides": {"loss.name": "contrastive", "loss.params": {"margin": 1.0}},
         "search": {"loss.params.margin": {"low": 0.5, "high": 1.5}}},
        {"name": "triplet", "overrides": {"loss.name": "triplet", "miner.name": "semihard"},
         "search": {"loss.params.margin": {"low": 0.05, "high": 0.5},
                    "miner.name": {"choices": ["semihard", "hard"]}}},
        {"name": "margin", "overrides": {"loss.name": "margin"},
         "search": {"loss.params.beta": {"low": 0.6, "high": 1.6, "log": True}}},
        {"name": "fastap", "overrides": {"loss.name": "fastap"},
         "search": {"loss.params.num_bins": {"low": 5, "high": 40, "type": "int"}}},
    ],
}


def _benchmark(**protocol: object) -> dict:
    settings = {"folds": 4, "fold_mode": "contiguous", "trials": 8, "epochs": 8, "patience": None, "sampler": "gp",
                "startup_trials": 4, "pruner": "none", "search_seed": 0, "reproductions": 5, "first_seed": 1000,
                "parallel_trials": 1, "frozen_trunk": False, **protocol}
    layout = {"k": 4, "mode": "contiguous", "development_classes": list(range(80)), "test_classes": list(range(80, 160)),
              "folds": [{"index": i, "train_classes": [c for c in range(80) if c // 20 != i],
                         "val_classes": list(range(20 * i, 20 * i + 20))} for i in range(4)]}
    return {"spec": {**SPEC, "protocol": settings}, "overrides": [], "protocol": settings, "methods": METHODS,
            "fold_layout": layout, "fold_layout_hash": "abc", "dataset": {"name": "glyphs", "content_hash": "123"},
            "analysis": {"references": ["contrastive", "triplet"]}, "storage": "sqlite:///x.db", "git_commit": "c0ffee"}


def _results(shifts: dict[str, float], seeds: int = 5) -> dict[str, MethodReproductions]:
    """Test scores ``shift`` + a seed effect shared by every method + a small per-method wiggle."""
    seed_effect = np.random.default_rng(7).normal(0.0, 0.03, size=seeds)
    results = {}
    for index, (name, shift) in enumerate(shifts.items()):
        result = MethodReproductions(name, {}, "abc")
        for r in range(seeds):
            value = shift + seed_effect[r] + 0.004 * ((r + index) % 3 - 1)
            scores = {mode: {"precision_at_1": value, "r_precision": value / 2, "map_at_r": value / 3}
                      for mode in ("concatenated", "separated")}
            space = [{"rho": 0.3 + 0.05 * index + 0.01 * fold, "pi_intra": 0.1, "pi_inter": 0.2, "pi_ratio": 0.5}
                     for fold in range(2)]
            result.outcomes.append(ReproductionOutcome(r, 1000 + r, [], scores, None, space))
        results[name] = result
    return results


def _data(**protocol: object) -> ReportData:
    shifts = {"contrastive": 0.60, "triplet": 0.59, "margin": 0.70, "fastap": 0.50}
    results = {**_results(shifts), **_results({"untrained": 0.3})}
    benchmark = _benchmark(**protocol)
    trials = {name: [{"number": n, "state": "COMPLETE", "value": 0.3 + 0.01 * n, "params": {}} for n in range(3)]
              for name in METHODS}
    data = ReportData(Path("."), BenchmarkRecord.model_validate(benchmark), list(METHODS), trials, results=results)
    data.claims = analyse(results, AnalysisSpec.in_force(benchmark["analysis"]), {}, ["precision_at_1", "r_precision", "map_at_r"])
    return data


FIGURE = ("A figure", "figure.png", b"\x89PNG")


def test_the_plots_follow_the_leaderboard_and_the_set_up_comes_before_the_claims() -> None:
    data = _data()
    titles = [part.title for part in sections(data, [FIGURE])]
    assert titles[:5] == [None, "Summary", "Results", "Plots", "Set-up"]
    assert titles.index("Set-up") < titles.index("Every method against the references") < titles.index("Protocol")
    data.failed["fastap"] = "no search trial completed (2 failed)"
    titles = [part.title for part in sections(data, [FIGURE])]
    assert titles[2:6] == ["Results", "Failed methods", "Plots", "Set-up"]
    page = render.markdown(sections(data, [FIGURE]))
    assert page.index("| untrained |") < page.index("![A figure](figure.png)") < page.index("## Set-up")


def test_html_turns_emphasis_and_code_into_tags_in_table_cells_while_the_markdown_keeps_them() -> None:
    part = Section("Cells", ["See *this* and `x < y`."], bullets=["*equivalent*: `a & b`"],
                   tables=[(["method", "*outcome*"], [["triplet", "*equivalent*"], ["memory", "`ru_maxrss` & <b>"]])])
    page = render.html_page([part])
    assert "<th><em>outcome</em></th>" in page and "<td><em>equivalent</em></td>" in page
    assert "<td><code>ru_maxrss</code> &amp; &lt;b&gt;</td>" in page
    assert "<p>See <em>this</em> and <code>x &lt; y</code>.</p>" in page
    assert "<li><em>equivalent</em>: <code>a &amp; b</code></li>" in page
    text = render.markdown([part])
    assert "| triplet | *equivalent* |" in text and "| memory | `ru_maxrss` & <b> |" in text and "| method | *outcome* |" in text


@pytest.mark.parametrize(
    ("text", "html"),
    [("p* < 0.05 and q*", "p* &lt; 0.05 and q*"), ("2 * 3 * 4", "2 * 3 * 4"), ("a*b*c", "a*b*c"),
     ("p*-values *better*", "p*-values <em>better</em>"), ("* not* and *not *", "* not* and *not *"),
     ("*better* / *worse*", "<em>better</em> / <em>worse</em>"), ("`*x*` *`y`*", "<code>*x*</code> <em><code>y</code></em>"),
     ("one ` tick", "one ` tick"), ("**", "**")],
)
def test_only_markdown_emphasis_becomes_em(text: str, html: str) -> None:
    assert render.inline_html(text) == html


def test_search_trials_get_integer_ticks() -> None:
    pyplot = plots._pyplot()
    figure, axes = pyplot.subplots()
    trials = {"a": [{"number": n, "state": "COMPLETE", "value": 0.1 * n} for n in range(3)]}
    plots.draw_search(axes, ["a"], trials)
    ticks = [tick for tick in axes.get_xticks() if axes.get_xlim()[0] <= tick <= axes.get_xlim()[1]]
    pyplot.close(figure)
    assert len(ticks) >= 2 and all(float(tick).is_integer() for tick in ticks), ticks


@pytest.mark.parametrize("count", [20, 30])
def test_every_method_gets_its_own_colour_and_marker(count: int) -> None:
    methods = [f"method_{index}" for index in range(count)]
    styles = plots.method_styles(methods)
    assert len(set(styles.values())) == count
    for first, second in itertools.pairwise(methods):  # neighbours in the legend differ in both
        assert styles[first][0] != styles[second][0] and styles[first][1] != styles[second][1]
    assert plots.method_styles(methods[:5]) == {m: styles[m] for m in methods[:5]}  # the same in every figure


def test_the_space_figure_draws_each_method_in_its_style(monkeypatch: pytest.MonkeyPatch) -> None:
    pyplot = plots._pyplot()
    kept = []
    monkeypatch.setattr(pyplot, "close", kept.append)  # keep the figure to look at its points
    png = plots.space_figure(_data().claims.points, methods=["unscored", *METHODS])[2]
    monkeypatch.undo()
    assert png.startswith(b"\x89PNG")
    styles = plots.method_styles(["unscored", *METHODS])  # the benchmark's order, as in the other figures
    drawn = {collection.get_label(): collection for collection in kept[0].axes[0].collections}
    pyplot.close(kept[0])
    assert set(drawn) == set(METHODS)
    for method in METHODS:
        assert tuple(drawn[method].get_facecolor()[0]) == pytest.approx(to_rgba(styles[method][0]))


def test_patience_none_reads_in_words() -> None:
    rows = dict(tables.parameters(_data()))
    assert rows["early stopping patience"].startswith("none: every run trains its fixed number of epochs")
    assert "best validation" in rows["early stopping patience"]
    assert "None" not in rows["early stopping patience"]
    assert rows["early stopping patience"].endswith("is kept")  # no method sets a patience of its own
    assert dict(tables.parameters(_data(patience=3)))["early stopping patience"].startswith("3 validation evaluations")
    data = _data()
    data.benchmark.spec.base = {**SPEC["base"], "training": {"early_stopping_patience": None}}
    assert "still applies" not in dict(tables.parameters(data))["early stopping patience"]  # set, but to none
    data.benchmark.overrides = ["training.early_stopping_patience=2"]
    assert "still applies" in dict(tables.parameters(data))["early stopping patience"]
    data = _data()
    data.benchmark.spec.methods = [StoredMethod(name="m", overrides={"training": {"early_stopping_patience": 2}})]
    assert "still applies" in dict(tables.parameters(data))["early stopping patience"]


@pytest.mark.parametrize(
    ("trials", "startup", "random"),
    [(8, 4, False), (8, 8, True), (8, 20, True), (8, None, True), (10, None, True), (11, None, False)],
)
def test_the_search_is_called_random_when_every_trial_is_a_start_up_trial(trials: int, startup: int | None,
                                                                         random: bool) -> None:
    search = dict(tables.parameters(_data(trials=trials, startup_trials=startup)))["search"]
    if random:
        assert search.startswith(f"random: all {trials} trials are start-up trials of Optuna's gp sampler"), search
    else:
        expected = "Optuna's default of 10" if startup is None else str(startup)
        assert search.startswith(f"Optuna gp sampler after {expected} random start-up trials"), search


def test_one_trial_and_one_reproduction_are_counted_in_the_singular() -> None:
    """A one-trial search (results/one_trial_searches_glyphs) read "1 trials" and "all 1 trials"."""
    rows = dict(tables.parameters(_data(trials=1, startup_trials=None)))
    assert rows["budget per method"].startswith("1 trial x "), rows["budget per method"]
    assert rows["search"].startswith("random: the one trial is a start-up trial of Optuna's gp sampler"), rows["search"]
    assert dict(tables.parameters(_data(trials=8, startup_trials=4)))["budget per method"].startswith("8 trials x ")


def test_the_default_start_up_count_is_optunas() -> None:
    for sampler in (optuna.samplers.GPSampler, optuna.samplers.TPESampler):
        assert inspect.signature(sampler).parameters["n_startup_trials"].default == tables.OPTUNA_STARTUP_TRIALS


def test_the_set_up_section_shows_search_ranges_base_config_and_test_set() -> None:
    page = render.markdown(sections(_data(), [FIGURE]))
    setup = page[page.index("## Set-up"):page.index("## Every method against the references")]
    assert "80 test classes" in setup and "80 development classes in 4 folds of 60 training and 20 validation" in setup
    assert "| contrastive | `loss.name` = contrastive; `loss.params.margin` = 1 | `loss.params.margin`: 0.5 .. 1.5 |" in setup
    assert "`miner.name`: one of semihard, hard" in setup and "0.6 .. 1.6 (log scale)" in setup
    assert "5 .. 40 (integers)" in setup
    for row in ("| trunk | `model.trunk` | small_cnn |", "| trunk width | `model.options.width` | 16 |",
                "| embedding size | `model.embedding_dim` | 64 |", "| weight decay | `optimizer.weight_decay` | 0.0004 |",
                "| steps per epoch (at most) | `training.max_steps_per_epoch` | 20 |"):
        assert row in setup, row
    assert "The `untrained` row is the same in both modes" in setup and "4 copies of one network" in setup
    # A benchmark stored before the spec was recorded still gets the section, with what it has.
    data = _data()
    data.benchmark.spec, data.benchmark.fold_layout = StoredSpec(), None
    bare = render.markdown(sections(data, [FIGURE]))
    assert "## Set-up" in bare and "test set's size is unknown" in bare


def test_the_set_up_section_gives_the_data_source_benchmark_json_records() -> None:
    """Test images, images per domain and licences where recorded; the older sentence where not."""
    data = _data()
    page = render.markdown(sections(data, [FIGURE]))
    assert "The number of test images is not stored in `benchmark.json` (data options: max_classes=160, image_size=24)." in page
    assert "Images per domain" not in page and "Licences" not in page
    data.benchmark.data_source = {"test_images": 3798, "images_per_domain": {"apple": 3783, "google": 3786},
                                  "licences": {"apple": "not licensed for commercial use", "google": "Apache-2.0"}}
    setup = render.markdown(sections(data, [FIGURE]))
    setup = setup[setup.index("## Set-up"):]
    assert "80 test classes of `fold_layout.test_classes` (3,798 images), which no search" in setup
    assert "20 validation classes (data options: max_classes=160, image_size=24)." in setup
    assert "not stored" not in setup
    assert "Images per domain (the whole dataset): apple 3,783, google 3,786." in setup
    assert "Licences, as the dataset's reader states them: apple: not licensed for commercial use; google: Apache-2.0." in setup


def test_k_copies_of_one_embedding_score_alike_concatenated_and_separated() -> None:
    """What the set-up section says of the untrained row, on the evaluation the reproductions use."""
    from dmlbench.evaluation.api import evaluate_many

    rng = np.random.default_rng(3)
    embedding, labels = rng.normal(size=(60, 8)), np.repeat(np.arange(12), 5)
    copies = {f"fold_{fold}": embedding.copy() for fold in range(4)}
    concatenated = evaluate_many(copies, labels, mode="concatenated", metrics=["precision_at_1", "map_at_r"])
    separated = evaluate_many(copies, labels, mode="separated", metrics=["precision_at_1", "map_at_r"])
    for metric in ("precision_at_1", "map_at_r"):
        assert concatenated[metric] == pytest.approx(separated[metric], abs=1e-12)


def test_the_saturation_counts_add_up_to_the_methods_that_are_not_references() -> None:
    claims = _data().claims
    header, rows = _saturation_section(claims).tables[0]
    outcomes = [header.index(outcome) for outcome in ("better", "equivalent", "worse", "inconclusive")]
    assert len(rows) == 2 * 2 * 2  # two modes, two metrics, two references
    for row in rows:
        # fastap and margin, not the other reference (its outcome is in its own column)
        assert row[header.index("methods")] == "2" and sum(int(row[i]) for i in outcomes) == 2, row
        assert row[header.index("the other references")].split(":")[0] in ("contrastive", "triplet")


def test_figures_of_methods_that_all_failed_draw_no_empty_legend() -> None:
    """Every trial and curve failed: the figures are still drawn, without matplotlib's warning about a
    legend with nothing in it (which the CLI would print as a warning line)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.search_figure(["a", "b"], {"a": [{"number": 0, "value": None, "state": "FAIL"}], "b": []})
        plots.curves_figure(["a", "b"], {"a": [[]], "b": []})


def test_the_cost_section_gives_the_time_in_which_at_least_one_unit_ran() -> None:
    """The union of the units' intervals: overlapping units count once, a gap (between sessions) not at all."""
    from datetime import datetime, timezone

    from dmlbench.report.data import _cost

    start = datetime(2026, 11, 26, 15, 8, tzinfo=timezone.utc).timestamp()
    cost = {"samples_seen": 10, "wall_seconds": 1.0, "cpu_seconds": 1.0, "peak_memory_kib": 1024}
    data = _data()
    assert tables.running_time_text(data) is None  # no unit records when it ran
    data.trials["contrastive"][0]["cost"] = {**cost, "started": start, "completed": start + 600}
    data.trials["triplet"][0]["cost"] = {**cost, "started": start + 300, "completed": start + 900}
    data.trials["margin"][0]["cost"] = cost  # recorded before the interval was: ignored
    data.reproduction_costs["contrastive"] = [{**cost, "started": start + 3600, "completed": start + 4200},
                                              {**cost, "started": start + 4100, "completed": start + 4500}, None]
    expected = ("Running time: the units ran from 2026-11-26 15:08 to 2026-11-26 16:23 UTC, and at least one was "
                "running during 0 h 30 min of that (the union of their intervals")
    assert tables.running_time_text(data).startswith(expected)
    page = render.markdown(sections(data, [FIGURE]))
    assert expected in page[page.index("## Cost"):page.index("## Protocol")]

    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("cost", cost)
    study.tell(trial, 0.5)
    frozen = study.trials[0]
    assert _cost(frozen) == {**cost, "started": frozen.datetime_start.timestamp(),
                             "completed": frozen.datetime_complete.timestamp()}


def test_cross_domain_results_get_their_ranking_section_and_column() -> None:
    """With cross-domain modes the report ranks the concatenated all-versus-all and cross-domain means
    against each other, and ``rankings.csv`` gains their column; without them neither appears."""
    data = _data()
    for trials in data.trials.values():
        for trial in trials:
            trial["curves"] = []
    assert "All-versus-all against cross-domain" not in render.markdown(sections(data, [FIGURE]))
    assert tables.claim_csvs(data)["rankings.csv"].splitlines()[0] == "metric,method,rank_concatenated,rank_separated"
    for name, result in data.results.items():
        for outcome in result.outcomes:
            swap = {"margin": -0.3, "fastap": 0.3}.get(name, 0.0)  # margin first all-vs-all, last cross-domain
            outcome.scores["concatenated_cross_domain"] = {k: v + swap for k, v in outcome.scores["concatenated"].items()}
    data.claims = analyse(data.results, AnalysisSpec(references=["contrastive", "triplet"]), {},
                          ["precision_at_1", "r_precision", "map_at_r"])
    page = render.markdown(sections(data, [FIGURE]))
    section = page[page.index("## All-versus-all against cross-domain (concatenated)"):]
    assert "| metric | Kendall tau | rank changes (all→cross-domain) | top 3 all | top 3 cross-domain |" in section
    assert "| P@1 | -0.67 (p=" in section and "margin 1→4, fastap 4→1" in section
    lines = tables.claim_csvs(data)["rankings.csv"].splitlines()
    assert lines[0] == "metric,method,rank_concatenated,rank_separated,rank_concatenated_cross_domain"
    assert "precision_at_1,margin,1,1,4" in lines


def test_the_class_bootstrap_covers_the_primary_endpoint_and_its_cross_domain_mode() -> None:
    """With cross-domain modes the test classes are resampled for the primary endpoint and for its
    cross-domain mode, from that mode's own per-class sums and query counts; a benchmark whose
    reproductions were scored before the cross-domain sums were stored says so in that section."""
    import torch

    from dmlbench.analysis.class_bootstrap import class_sums, queries_of
    from dmlbench.report import uncertainty

    data = _data()
    for result in data.results.values():
        for outcome in result.outcomes:
            outcome.scores["concatenated_cross_domain"] = {k: v - 0.1 for k, v in outcome.scores["concatenated"].items()}
    data.claims = analyse(data.results, AnalysisSpec(references=["contrastive", "triplet"]), {},
                          ["precision_at_1", "r_precision", "map_at_r"])
    generator = np.random.default_rng(3)
    labels, domains = torch.arange(36) % 6, (torch.arange(36) // 6) % 3

    def record(crossed: bool) -> dict:
        embeddings = {"fold 0": torch.from_numpy(generator.normal(size=(36, 4)))}
        return class_sums(embeddings, labels, ["precision_at_1", "map_at_r"], None, domains if crossed else None)

    data.class_scores = {name: {o.seed: record(True) for o in result.outcomes} for name, result in data.results.items()}
    page = render.markdown(sections(data, [FIGURE]))
    plain = page[page.index("## Uncertainty over the test classes (MAP@R (concatenated))"):]
    crossed = page[page.index("## Uncertainty over the test classes (MAP@R (concatenated_cross_domain))"):]
    assert "of all test images" in plain[:plain.index("\n## ", 3)] and "the other domains' test images" in crossed
    rows = [line.split(",") for line in uncertainty.uncertainty_csvs(data)["class_bootstrap.csv"].splitlines()[1:]]
    assert {row[0] for row in rows} == {"concatenated", "concatenated_cross_domain"}
    estimate = next(float(row[7]) for row in rows if row[:4] == ["concatenated_cross_domain", "map_at_r", "contrastive", ""])
    records = data.class_scores["contrastive"].values()
    assert estimate == pytest.approx(np.mean([sum(r["sums"]["concatenated_cross_domain"]["map_at_r"])
                                              / sum(queries_of(r, "concatenated_cross_domain")) for r in records]), abs=1e-12)
    data.class_scores["margin"] = {seed: record(False) for seed in data.class_scores["margin"]}
    page = render.markdown(sections(data, [FIGURE]))
    assert "`margin` has no per-class concatenated_cross_domain test scores" in page
    rows = [line.split(",") for line in uncertainty.uncertainty_csvs(data)["class_bootstrap.csv"].splitlines()[1:]]
    assert {row[0] for row in rows} == {"concatenated"}


@pytest.mark.parametrize(("seconds", "text"), [(90, "90 s"), (600, "10 minutes"), (7140, "119 minutes"), (313740, "87 hours")])
def test_a_planned_design_s_time_is_given_in_the_unit_one_plans_with(seconds: float, text: str) -> None:
    """The summary's "about N ..." of a design that would decide: 5,229 minutes read as 87 hours."""
    from dmlbench.report.sections import _duration

    assert _duration(seconds) == text


@pytest.mark.parametrize(("config_file", "command"), [
    ("built-in", "dmlbench benchmark protocol.reproductions=9 -o NEW_DIR"),
    ("configs/my benchmark.yaml", "dmlbench benchmark 'configs/my benchmark.yaml' protocol.reproductions=9 -o NEW_DIR"),
    (None, "dmlbench benchmark CONFIG protocol.reproductions=9 -o NEW_DIR"),  # a benchmark.json that does not record it
])
def test_the_next_step_the_report_prints_runs_as_printed(config_file: str | None, command: str) -> None:
    """The report's "what would decide the rest" command once read `dmlbench benchmark CONFIG ...`, which the
    built-in benchmark (no CONFIG) does not take; benchmark.json now records the command it was started with."""
    from dmlbench.report.sections import _benchmark_command

    data = _data()
    data.benchmark = BenchmarkRecord.model_validate({**_benchmark(), **({"config_file": config_file} if config_file else {})})
    assert _benchmark_command(data, "protocol.reproductions=9") == command
    data.benchmark.command_overrides = ["protocol.reproductions=2", "training.epochs=3", "analysis.references=[a, b]"]
    if config_file == "built-in":  # the run's own overrides stay, but for the keys the design sets
        assert _benchmark_command(data, "protocol.reproductions=9") == (
            "dmlbench benchmark training.epochs=3 'analysis.references=[a, b]' protocol.reproductions=9 -o NEW_DIR")


def test_benchmark_json_records_the_config_a_benchmark_was_started_from(tmp_path: Path) -> None:
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare
    from dmlbench.protocol.run.record import write_benchmark_file

    smoke = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"
    assert load_spec(None).config_file == "built-in"
    prepared = prepare(load_spec(smoke), tmp_path / "out", ["protocol.trials=3"])  # a benchmark override keeps it
    assert prepared.spec.config_file == str(smoke)
    assert write_benchmark_file(prepared).config_file == str(smoke)


def test_plan_without_a_config_plans_the_built_in_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    """`dmlbench plan` for the main job needed the path of the built-in config, which only docs/protocol.md named."""
    from cli_runner import run_cli

    code, out, err = run_cli(["plan", "protocol.reproductions=4", "--sd", "0.01"], capsys)
    assert code == 0, err
    assert out.startswith("power (concatenated map_at_r, the primary endpoint): 5 comparisons in one Holm family, 4 reproductions")


def test_best_marks_only_a_method_the_primary_tests_decided_better_than_every_other() -> None:
    """The results table once tagged the highest mean *best* when nothing was decided. With the declared
    comparisons (against contrastive and triplet) margin is never compared with fastap: no *best*; with every pair
    compared and margin clearly ahead of each, it is."""
    from dmlbench.report.tables import leaderboard

    declared = _data()
    _, rows = leaderboard(declared, declared.claims.primary)
    assert rows[0][0] == "margin" and not any("*best*" in row[0] for row in rows)
    every_pair = _data()
    every_pair.claims = analyse(every_pair.results, AnalysisSpec(), {}, ["precision_at_1", "r_precision", "map_at_r"])
    _, rows = leaderboard(every_pair, every_pair.claims.primary)
    assert rows[0][0] == "margin *best*" and sum("*best*" in row[0] for row in rows) == 1


def test_the_forest_plot_leaves_the_baselines_out_of_its_scale() -> None:
    """The untrained row (far below) once set the forest plot's scale and squeezed the methods' spread."""
    import io

    from matplotlib import image

    from dmlbench.protocol.units.results import result_rows
    from dmlbench.report import plots

    data = _data()
    rows = result_rows(data.results)
    title, name, png = plots.forest_figure(rows, ["precision_at_1"], {"precision_at_1": "P@1"}, ["contrastive"])
    assert name == "forest.png" and "baselines are in the results table" in title
    assert image.imread(io.BytesIO(png)).shape[0] == round((0.32 * 4 + 1.4) * 80)  # 4 methods' rows at 80 dpi, not 5


def test_the_differences_plot_shows_the_primary_family() -> None:
    from dmlbench.report import plots

    data = _data()
    family = data.claims.families[data.claims.primary]
    title, name, png = plots.differences_figure(family, "MAP@R (concatenated)", data.claims.margin, 0.05)
    assert name == "differences.png" and png.startswith(b"\x89PNG") and len(family) == 5
