"""Hyper-parameter search spaces: parsing, checks against the registries, Optuna suggestions."""

import copy
import math

import optuna
import pytest

from dmlbench import config as config_module
from dmlbench.config import parse_override
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark import BenchmarkSpec
from dmlbench.protocol.design.search_space import (
    SearchSpace,
    as_override_strings,
    parse_search_space,
)

BASE = {"loss": {"name": "triplet"}, "miner": {"name": "semihard"}}
SPACE = {
    "loss.params.margin": {"low": 0.01, "high": 1.0, "log": True},
    "miner.name": {"choices": ["semihard", "multi_similarity"]},
    "miner.params.epsilon": {"low": 0.0, "high": 0.5, "when": {"miner.name": "multi_similarity"}},
    "training.batch_size": {"low": 16, "high": 64, "step": 16, "type": "int"},
}


def space() -> SearchSpace:
    return parse_search_space(SPACE, BASE, method="m")


def test_parses_ranges_choices_and_conditionals() -> None:
    parsed = space()
    by_key = {parameter.key: parameter for parameter in parsed.parameters}
    assert by_key["loss.params.margin"].kind == "float" and by_key["loss.params.margin"].log
    assert by_key["miner.name"].choices == ("semihard", "multi_similarity")
    assert by_key["miner.params.epsilon"].when == {"miner.name": ("multi_similarity",)}
    assert (by_key["training.batch_size"].kind, by_key["training.batch_size"].step) == ("int", 16)
    assert parsed.keys().index("miner.name") < parsed.keys().index("miner.params.epsilon")


def test_a_conditional_declared_before_its_parent_is_suggested_after_it() -> None:
    reordered = {"miner.params.epsilon": SPACE["miner.params.epsilon"], "miner.name": SPACE["miner.name"]}
    assert parse_search_space(reordered, BASE).keys() == ["miner.name", "miner.params.epsilon"]


def test_trials_become_valid_configs_with_conditionals_respected() -> None:
    parsed = space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_names = set()
    for _ in range(12):
        trial = study.ask()
        assignment = parsed.suggest(trial)
        assert 0.01 <= assignment["loss.params.margin"] <= 1.0
        assert assignment["training.batch_size"] in (16, 32, 48, 64)
        seen_names.add(assignment["miner.name"])
        assert ("miner.params.epsilon" in assignment) == (assignment["miner.name"] == "multi_similarity")
        assert set(trial.params) == set(assignment)
        config = config_module.from_dict(config_module.assign(BASE, assignment))
        assert config.loss.params["margin"] == assignment["loss.params.margin"]
        # The override strings say the same thing.
        assert config_module.from_dict(copy.deepcopy(BASE), as_override_strings(assignment)) == config
        study.tell(trial, 0.0)
    assert seen_names == {"semihard", "multi_similarity"}
    distributions = study.trials[0].distributions
    assert isinstance(distributions["loss.params.margin"], optuna.distributions.FloatDistribution)
    assert distributions["loss.params.margin"].log
    assert isinstance(distributions["training.batch_size"], optuna.distributions.IntDistribution)
    assert isinstance(distributions["miner.name"], optuna.distributions.CategoricalDistribution)


def test_override_strings_round_trip_small_floats() -> None:
    (override,) = as_override_strings({"optimizer.lr": 1e-5})
    assert parse_override(override) == (["optimizer", "lr"], 1e-5)


def test_assign_does_not_modify_its_input_and_shares_the_override_setter() -> None:
    raw = {"loss": {"name": "triplet", "params": {"margin": 0.1}}}
    updated = config_module.assign(raw, {"loss.params.margin": 0.3, "optimizer.lr": 1e-5})
    assert raw == {"loss": {"name": "triplet", "params": {"margin": 0.1}}}
    assert updated == {"loss": {"name": "triplet", "params": {"margin": 0.3}}, "optimizer": {"lr": 1e-5}}
    assert updated == config_module.apply_overrides(copy.deepcopy(raw), ["loss.params.margin=0.3", "optimizer.lr=1.0e-05"])
    for wrong in (lambda: config_module.assign(raw, {"loss.name.x": 1}),
                  lambda: config_module.apply_overrides(copy.deepcopy(raw), ["loss.name.x=1"])):
        with pytest.raises(UserInputError, match=r"config key 'loss.name' is not a section \(setting 'loss.name.x'\)"):
            wrong()


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"loss.params.marginn": {"low": 0.1, "high": 1.0}},
         r"search key 'loss.params.marginn' = 0.1: loss.params of loss 'triplet' has no parameter 'marginn'"),
        ({"miner.name": {"choices": ["semihard", "hard"]},
          "miner.params.epsilon": {"low": 0.0, "high": 0.5, "when": {"miner.name": "hard"}}},
         r"search key 'miner.params.epsilon' = 0.0: .*miner 'hard' has no parameter 'epsilon'"),
        ({"loss.params.margin": {"low": 1.0, "high": 1.0}}, r"search key 'loss.params.margin': empty range"),
        ({"loss.params.margin": {"low": 2.0, "high": 1.0}}, r"search key 'loss.params.margin': empty range"),
        ({"miner.name": {"choices": []}}, r"search key 'miner.name': choices must be a non-empty list"),
        ({"miner.name": {"choices": ["semihard", "hardest"]}}, r"search key 'miner.name' = 'hardest': unknown miner"),
        ({"training.epochz": {"low": 1, "high": 3, "type": "int"}}, r"search key 'training.epochz' = 1: unknown config key"),
        ({"training.epochs": {"low": 1.5, "high": 3.0}}, r"search key 'training.epochs' = 1.5: config key 'training.epochs'"),
        ({"optimizer.lr": {"low": 0.0, "high": 0.1, "log": True}}, r"search key 'optimizer.lr': a log-scale range needs low > 0"),
        ({"optimizer.lr": {"low": 0.001}}, r"search key 'optimizer.lr': a range needs both low and high"),
        ({"optimizer.lr": {"low": 0.001, "high": 0.1, "scale": "log"}}, r"search key 'optimizer.lr': unknown field 'scale'"),
        ({"optimizer.lr": [0.001, 0.1]}, r"search key 'optimizer.lr': expected a mapping"),
        ({"miner.params.epsilon": {"low": 0.0, "high": 0.5, "when": {"miner.name": "hard"}}},
         r"search key 'miner.params.epsilon': when refers to 'miner.name', which is not a categorical search key"),
        ({"miner.name": {"choices": ["semihard"]},
          "miner.params.margin": {"low": 0.0, "high": 0.5, "when": {"miner.name": "hard"}}},
         r"search key 'miner.params.margin': when 'miner.name' = 'hard' is not one of its choices"),
    ],
)
def test_mistakes_are_one_line_errors_naming_the_key(entry: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message) as error:
        parse_search_space(entry, BASE, method="m")
    assert str(error.value).startswith("method 'm': search key ")
    assert "\n" not in str(error.value)


def test_no_search_space_is_empty() -> None:
    assert len(parse_search_space(None, BASE)) == 0
    assert len(parse_search_space({}, BASE)) == 0


def test_benchmark_methods_declare_a_search_space() -> None:
    spec = BenchmarkSpec.model_validate(
        {"base": BASE, "methods": [{"name": "triplet", "search": SPACE}, {"name": "plain"}]}
    )
    assert spec.methods[0].search == SPACE and spec.methods[1].search == {}
    assert math.isclose(parse_search_space(spec.methods[0].search, spec.base).parameters[0].high, 1.0)
