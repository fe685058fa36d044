import re
from pathlib import Path

import pytest

from dmlbench import config as config_module
from dmlbench.errors import UserInputError

REPO = Path(__file__).resolve().parent.parent


def test_defaults_validate() -> None:
    config = config_module.load(None)
    assert config.loss.name == "triplet" and config.training.batch_size > 1


def test_shipped_config_loads() -> None:
    config = config_module.load(REPO / "configs" / "glyphs.yaml")
    assert config.data.name == "glyphs"


def test_dotted_overrides_parse_yaml_values() -> None:
    config = config_module.load(None, ["training.epochs=3", "loss.name=contrastive", "optimizer.lr=0.01",
                                       "model.layer_norm=false", "sampler.params.samples_per_class=2"])
    assert config.training.epochs == 3
    assert config.loss.name == "contrastive"
    assert config.optimizer.lr == 0.01
    assert config.model.layer_norm is False
    assert config.sampler.params == {"samples_per_class": 2}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.epoch=3"], "unknown config key 'training.epoch'"),
        (["training.epochs=many"], "config key 'training.epochs'"),
        (["training.epochs=0"], "config key 'training.epochs'"),
        (["loss.name=tripletz"], "unknown loss 'tripletz'"),
        (["loss.params.margn=0.1"], "has no parameter 'margn'"),
        (["miner.p_switch=1.5"], "config key 'miner.p_switch'"),
        (["nonsense"], "not of the form"),
        (["miner.p_switch=0.3"], "needs a miner"),
        (["loss.name=normalized_softmax", "miner.name=semihard"], "does not use mined tuples"),
        (["evaluation.selection_metric=nmi", "evaluation.metrics=[map_at_r]"], "selection_metric"),
    ],
)
def test_bad_overrides_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        config_module.load(None, overrides)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        config_module.load(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("training: [1, 2\n")
    with pytest.raises(UserInputError, match="not valid YAML"):
        config_module.load(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(UserInputError, match="mapping"):
        config_module.load(scalar)


def test_yaml_round_trip(tmp_path: Path) -> None:
    config = config_module.load(None, ["training.epochs=2", "loss.params.margin=0.3"])
    path = tmp_path / "resolved.yaml"
    path.write_text(config_module.to_yaml(config))
    assert config_module.load(path) == config


@pytest.mark.parametrize(
    "override",
    ["loss.params.num_classes=3", "sampler.params.batch_size=8", "sampler.params.seed=1", "miner.params.p_switch=0.5"],
)
def test_keys_the_run_sets_are_reserved(override: str) -> None:
    with pytest.raises(UserInputError, match="the run sets it"):
        config_module.load(None, ["miner.name=random", override])


@pytest.mark.parametrize(("overrides", "suggestion"), [
    (["trainng.epochs=1"], "unknown config key 'trainng' (did you mean 'training'?)"),
    (["training.epoch=3"], "unknown config key 'training.epoch' (did you mean 'training.epochs'?)"),
    (["evaluation.rerank.kindd=none"], "unknown config key 'evaluation.rerank.kindd' (did you mean 'evaluation.rerank.kind'?)"),
    (["training.zzzz=1"], "unknown config key 'training.zzzz'$"),  # nothing close: no guess
])
def test_an_unknown_key_gets_the_closest_key_of_its_own_section(overrides: list[str], suggestion: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(suggestion.removesuffix("$")) + ("$" if suggestion.endswith("$") else "")):
        config_module.load(None, overrides)


def test_a_benchmark_key_gets_a_suggestion_at_every_level() -> None:
    from dmlbench.protocol.design.benchmark import BenchmarkSpec

    assert config_module.did_you_mean(BenchmarkSpec, ("protocol", "trails")) == " (did you mean 'protocol.trials'?)"
    assert config_module.did_you_mean(BenchmarkSpec, ("analysis", "primary", "metrc")) == " (did you mean 'analysis.primary.metric'?)"
    assert config_module.did_you_mean(BenchmarkSpec, ("base", "anything")) == ""  # a free mapping: no model to ask


@pytest.mark.parametrize(("text", "cause"), [
    ("seed: 0\ndata:\n\tname: glyphs\n",
     "at line 3, column 1: found character '\\t' that cannot start any token (YAML indents with spaces, never tabs)"),
    ("training: [1, 2\n", "at line 2, column 1: expected ',' or ']', but got '<stream end>'"),
])
def test_a_yaml_error_says_where_and_why(text: str, cause: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    with pytest.raises(UserInputError) as raised:
        config_module.load(broken)
    assert str(raised.value) == f"config file {broken} is not valid YAML {cause}"
