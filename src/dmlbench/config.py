"""The typed run configuration: YAML + dotted command-line overrides; unknown keys are errors."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dmlbench import plugins
from dmlbench.errors import UserInputError

DEFAULT_METRICS = (
    "precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8",
    "r_precision", "map_at_r", "nmi",
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    name: str = "glyphs"
    options: dict[str, Any] = Field(default_factory=dict)
    validation_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    # File formats (cub200, cars196, sop, inshop, folder, csv) and emoji: the dataset folder, or the CSV file.
    root: str | None = None
    # Side of the square images of a file dataset (glyphs and emoji keep data.options.image_size).
    image_size: int = Field(224, ge=8)
    # Training augmentation preset (data/transforms.py); evaluation is always resize + centre crop.
    augmentation: Literal["none", "reality_check", "base", "reduced", "big", "advanced"] = "none"
    # Directory of the decoded-image cache of a file dataset (None: decode from the files every time).
    cache_dir: str | None = None
    # Explicit class-disjoint split of the development classes (a cross-validation fold, seed 001
    # §3.3): both or neither; when given, validation_fraction is not used. Test classes are refused.
    train_classes: list[int] | None = None
    val_classes: list[int] | None = None

    @model_validator(mode="after")
    def _explicit_classes(self) -> DataConfig:
        if (self.train_classes is None) != (self.val_classes is None):
            raise ValueError("data.train_classes and data.val_classes must be given together")
        if self.train_classes is not None and self.val_classes is not None:
            for key, classes in (("train_classes", self.train_classes), ("val_classes", self.val_classes)):
                if not classes:
                    raise ValueError(f"data.{key} must not be empty")
                if len(set(classes)) != len(classes):
                    raise ValueError(f"data.{key} must not repeat a class")
            shared = sorted(set(self.train_classes) & set(self.val_classes))
            if shared:
                raise ValueError(f"data.train_classes and data.val_classes share class {shared[0]}")
        return self


class ModelConfig(Section):
    # small_cnn, resnet50, bninception, googlenet or timm/<model_name> (README, "Backbones").
    trunk: str = "small_cnn"
    # false: random weights; true: the library's cache (torchvision's and BN-Inception's ImageNet weights
    # downloaded into torch's hub folder when absent; timm's Hugging Face cache, never downloaded); or a path.
    pretrained: bool | str = False
    pooling: Literal["avg", "max"] = "avg"
    embedding_dim: int = Field(128, gt=0)
    layer_norm: bool = True
    # Seed 002's head is layer_norm: true, bias: false, normalize: true.
    bias: bool = True
    normalize: bool = True
    # BatchNorm statistics and affine parameters of the trunk frozen (seeds 001 §4, 003 §4).
    freeze_bn: bool = False
    # Evaluate the sign of the embedding (seed 002 §4.3); training uses the float embedding.
    binarize: bool = False
    # Independent trunk + head pairs whose embeddings are concatenated (DREML with one network per learner).
    ensemble: int = Field(1, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)


class ComponentConfig(Section):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class LossConfig(ComponentConfig):
    name: str = "triplet"


class MinerConfig(Section):
    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    p_switch: float = Field(0.0, ge=0.0, le=1.0)


class SamplerConfig(ComponentConfig):
    name: str = "spc"


class OptimizerConfig(Section):
    name: Literal["adam", "adamw", "rmsprop", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0.0)
    # Learning rates of the trunk and of the head (default: lr) and of the loss's own parameters.
    trunk_lr: float | None = Field(None, gt=0.0)
    head_lr: float | None = Field(None, gt=0.0)
    loss_lr: float = Field(5e-4, gt=0.0)
    weight_decay: float = Field(4e-4, ge=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    # Per-epoch schedule of every group's learning rate: constant; step (times gamma from each epoch
    # in step_epochs on); cosine (from the full rate at epoch 1 towards 0 after the last epoch).
    schedule: Literal["constant", "step", "cosine"] = "constant"
    step_epochs: list[int] = Field(default_factory=list)
    gamma: float = Field(0.1, gt=0.0)

    @model_validator(mode="after")
    def _step_epochs(self) -> OptimizerConfig:
        if self.schedule == "step" and not self.step_epochs:
            raise ValueError("optimizer.schedule 'step' needs optimizer.step_epochs, e.g. [15]")
        if any(epoch < 1 for epoch in self.step_epochs):
            raise ValueError("optimizer.step_epochs must be epochs >= 1")
        return self


class TrainingConfig(Section):
    epochs: int = Field(10, gt=0)
    batch_size: int = Field(112, gt=1)
    eval_every: int = Field(1, gt=0)
    early_stopping_patience: int | None = Field(None, gt=0)
    max_steps_per_epoch: int | None = Field(None, gt=0)
    device: str = "auto"
    # torch's intra-op threads: a number, or auto (this worker's share of the available cores; README, "Threads").
    num_threads: int | Literal["auto"] = "auto"

    @field_validator("num_threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be a positive integer or 'auto', got {value!r}")
    # The first warmup_epochs epochs train only the new parameters (head, loss), seed 002 §4.1.
    warmup_epochs: int = Field(0, ge=0)
    # Batches whose gradients are summed (each loss divided by this) before one optimiser step.
    accumulation_steps: int = Field(1, ge=1)
    # Autocast of the training forward pass: auto (bf16 on a CUDA GPU that has it, else fp32), fp32
    # (none), bf16 or fp16 (CUDA and MPS only).
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # On CUDA: cuDNN's deterministic kernels and IEEE float32; false lets cuDNN pick kernels by timing
    # and float32 products round to TF32 (faster, no longer bit-repeatable). The CPU is repeatable either way.
    deterministic: bool = True
    # torch.compile the model for the training steps (benchmarks/compile.py, benchmarks/gpu.py measure it).
    compile: bool = False


class RerankConfig(Section):
    """Re-ranking after the first retrieval (``evaluation.rerank``): ``kind`` none, query_expansion or
    k_reciprocal with that kind's ``params`` (``dmlbench.evaluation.rerank``, checked by its ``build``)."""

    kind: str = "none"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _valid(self) -> RerankConfig:
        self.method()  # a UserInputError is a ValueError: pydantic reports it under evaluation.rerank
        return self

    def method(self) -> Any:
        """The validated re-ranking (``evaluation.rerank.Reranking``), or ``None`` for kind none."""
        from dmlbench.evaluation.rerank import build

        return build(self.kind, **self.params)


class EvaluationConfig(Section):
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS))
    selection_metric: str = "map_at_r"
    batch_size: int = Field(256, gt=0)
    # Test metrics also with each query's gallery restricted to the other domains (datasets whose
    # images carry a domain, e.g. emoji's vendors): the *_cross_domain modes of results.csv.
    cross_domain: bool = False
    # Validation (so the search) re-ranked; test metrics raw and re-ranked (the *_reranked modes).
    rerank: RerankConfig = Field(default_factory=RerankConfig)


class TrackingConfig(Section):
    """Where a run is tracked besides ``metrics.jsonl`` (the ``tracking:`` section): ``none``, ``mlflow``
    (``uri``: a tracking server or database; unset: ``MLFLOW_TRACKING_URI``, else MLflow's default,
    ``sqlite:///mlflow.db`` in the working directory) or ``tensorboard`` (event files in the run directory)."""

    backend: Literal["none", "mlflow", "tensorboard"] = "none"
    uri: str | None = None
    experiment: str = Field("dmlbench", min_length=1)


class Config(Section):
    seed: int = Field(0, ge=0)
    plugins: list[str] = Field(default_factory=list)  # modules or .py files that register components
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    miner: MinerConfig = Field(default_factory=MinerConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _selection_metric_is_computed(self) -> Config:
        if self.evaluation.selection_metric not in self.evaluation.metrics:
            raise ValueError(
                f"evaluation.selection_metric {self.evaluation.selection_metric!r} "
                "is not among evaluation.metrics"
            )
        if self.model.binarize and self.evaluation.rerank.kind != "none":
            raise ValueError("evaluation.rerank needs float embeddings; model.binarize evaluates sign bits")
        return self


def parse_override(override: str) -> tuple[list[str], Any]:
    """``'training.epochs=3'`` -> ``(['training', 'epochs'], 3)``; the value is read as YAML."""
    key, separator, raw_value = override.partition("=")
    if not separator or not key or any(not part for part in key.split(".")):
        raise UserInputError(f"override {override!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw_value) if raw_value else ""
    except yaml.YAMLError:
        value = raw_value
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` with each ``key=value`` command-line override (a YAML value) set in place."""
    for override in overrides:
        path, value = parse_override(override)
        _set(raw, path, value)
    return raw


def assign(raw: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each dotted key of ``values`` set to its value, as a Python object
    (no string round trip, so ``1e-05`` stays a float): search assignments, fold classes, seeds."""
    result = copy.deepcopy(dict(raw))
    for key, value in values.items():
        _set(result, key.split("."), copy.deepcopy(value))
    return result


def _set(node: dict[str, Any], path: list[str], value: Any) -> None:
    """The one dotted-key setter: sections on the way are created; a value on the way is an error."""
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserInputError(f"config key {'.'.join(path[: depth + 1])!r} is not a section "
                                 f"(setting {'.'.join(path)!r})")
        node = child
    node[path[-1]] = value


def _validation_message(error: ValidationError) -> str:
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "config"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key!r}{did_you_mean(Config, first['loc'])}"
    return f"config key {key!r}: {message}" if first["loc"] else f"config: {message}"


def did_you_mean(model: type[BaseModel], location: Sequence[str | int]) -> str:
    """`` (did you mean 'a.b'?)`` for an unknown key at ``location`` of ``model``: the closest key of the section
    it was found in, at any depth; "" when none is close or the section is no model (a free mapping)."""
    section: Any = model
    for part in location[:-1]:
        field = section.model_fields.get(str(part)) if isinstance(section, type) and issubclass(section, BaseModel) else None
        section = None if field is None else field.annotation
    if not (isinstance(section, type) and issubclass(section, BaseModel)):
        return ""
    close = difflib.get_close_matches(str(location[-1]), list(section.model_fields), n=1)
    return f" (did you mean {'.'.join([*map(str, location[:-1]), close[0]])!r}?)" if close else ""


def from_dict(raw: dict[str, Any], overrides: list[str] | None = None, *,
              previous: Mapping[str, Any] | None = None) -> Config:
    """The validated config of ``raw`` with ``overrides`` applied. ``previous``: the raw config
    before whatever changed it (default: ``raw`` before ``overrides``), so that an error can name
    the fix when an override switched a component but kept the old one's parameters."""
    if previous is None and overrides:
        previous = copy.deepcopy(raw)
    raw = apply_overrides(raw, overrides or [])
    try:
        config = Config.model_validate(raw)
    except ValidationError as error:
        raise UserInputError(_validation_message(error)) from None
    plugins.load(config.plugins)
    check_component_names(config, previous)
    _check_selection_direction(config)
    return config


def _check_selection_direction(config: Config) -> None:
    """The best epoch and the search take the largest value of the selection metric, so a metric
    registered as lower-is-better cannot select (an unknown name is left to ``evaluate``'s message)."""
    from dmlbench.evaluation.metrics import METRICS

    name = config.evaluation.selection_metric
    if name in METRICS and not METRICS.get(name).higher_is_better:
        raise UserInputError(f"evaluation.selection_metric {name!r} is lower-is-better, but the best epoch and the "
                             "search take the largest value; select by a metric where higher is better")


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document in ``path``, or a one-line ``UserInputError`` that says what is wrong with
    the file (``what`` names it: "config file", "benchmark config")."""
    if path.is_dir():
        raise UserInputError(f"{what} {path} is a directory, not a YAML file")
    if not path.is_file():
        raise UserInputError(f"{what} {path} does not exist")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserInputError(f"{what} {path} is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UserInputError(f"{what} {path} is not valid YAML{_yaml_cause(error)}") from None


def _yaml_cause(error: yaml.YAMLError) -> str:
    """`` at line L, column C: <the parser's reason>``, with the usual fix for a tab."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = str(getattr(error, "problem", "") or "")
    hint = " (YAML indents with spaces, never tabs)" if "'\\t'" in problem else ""  # PyYAML writes the tab as '\t'
    return f"{where}: {problem}{hint}" if problem else where


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (``None``: the defaults), apply overrides and validate everything."""
    raw: Any = {}
    if path is not None:
        path = Path(path)
        raw = read_yaml(path, "config file")
        if raw is None:
            raise UserInputError(
                f"config file {path} is empty; name at least one section (configs/glyphs.yaml shows them all)"
            )
        if not isinstance(raw, dict):
            raise UserInputError(f"config file {path} must hold a mapping of sections")
        _refuse_benchmark_config(raw, path)
        raw = with_plugin_paths(raw, path.parent)
    return from_dict(raw, overrides)


BENCHMARK_KEYS = ("base", "methods", "protocol")


def _refuse_benchmark_config(raw: dict[str, Any], path: Path) -> None:
    """A benchmark config given where a run config belongs (``dmlbench train``): say what it is and
    what takes it, rather than that ``base`` is an unknown key."""
    found = [key for key in BENCHMARK_KEYS if key in raw]
    if not found or any(key in raw for key in Config.model_fields if key != "plugins"):
        return
    raise UserInputError(
        f"{path} is a benchmark config ({', '.join(found)}), not a run config: run it with `dmlbench benchmark {path}`; "
        "to train one of its methods alone, give `dmlbench train` a run config (e.g. configs/glyphs.yaml) and the "
        "method's overrides (a method's run config is the benchmark's base with its overrides)"
    )


def with_plugin_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """``raw`` with each ``plugins`` file path made absolute: a relative one is relative to the
    config file that names it, wherever the command runs."""
    names = raw.get("plugins")
    if not isinstance(names, list):
        return raw

    def absolute(name: Any) -> Any:
        text = str(name)
        if text.endswith(".py") or "/" in text:
            return str((base / text).resolve())
        return name
    return {**raw, "plugins": [absolute(name) for name in names]}


def check_component_names(config: Config, previous: Mapping[str, Any] | None = None) -> None:
    """Names and hyper-parameter keys must exist in their registries (values are checked on build);
    ``previous`` as in ``from_dict``."""
    from dmlbench import data, losses, mining, sampling
    from dmlbench.models import trunk_constructor
    from dmlbench.registry import check_kwargs

    reserved = {
        "model.options": {"pooling", "pretrained", "model_name"},
        "loss.params": {"num_classes", "embedding_dim", "seed"},
        "miner.params": {"generator", "p_switch"},
        "sampler.params": {"labels", "batch_size", "seed", "rank", "world_size"},
    }
    for section, keys in reserved.items():
        section_config = getattr(config, section.split(".")[0])
        params = section_config.options if section == "model.options" else section_config.params
        taken = sorted(keys & set(params))
        if taken:
            raise UserInputError(f"{section} may not set {taken[0]!r}: the run sets it")
    checks = [
        ("data.options", data.DATASETS, config.data.name, config.data.options),
        ("loss.params", losses.LOSSES, config.loss.name, config.loss.params),
        ("sampler.params", sampling.SAMPLERS, config.sampler.name, config.sampler.params),
    ]
    if config.miner.name is not None:
        checks.append(("miner.params", mining.MINERS, config.miner.name, config.miner.params))
    for section, registry, name, params in checks:
        try:
            constructor = registry.get(name)
        except UserInputError as error:
            if registry is mining.MINERS:
                raise UserInputError(f"{error}; miner.name=null turns the miner off") from None
            raise
        component = section.split(".")[0]
        check_kwargs(constructor, params, f"{section} of {registry.kind} {name!r}",
                     _kept_parameters_hint(component, name, constructor, params, previous))
    trunk = config.model.trunk
    check_kwargs(trunk_constructor(trunk)[0], config.model.options, f"model.options of trunk {trunk!r}")
    if config.model.ensemble > 1 and config.loss.name == "dreml":
        learners = config.loss.params.get("num_learners", 12)
        if config.model.ensemble != learners:
            raise UserInputError(
                f"model.ensemble={config.model.ensemble} must equal the dreml loss's num_learners={learners} "
                "(one network per learner) or be 1 (one shared trunk)"
            )
    if config.miner.p_switch > 0 and config.miner.name is None:
        raise UserInputError("miner.p_switch (rho-regularisation) needs a miner: set miner.name")
    if config.miner.name is not None and not getattr(losses.LOSSES.get(config.loss.name), "uses_tuples", False):
        raise UserInputError(f"loss {config.loss.name!r} does not use mined tuples: remove miner.name")


def _kept_parameters_hint(component: str, name: str, constructor: Any, params: Mapping[str, Any],
                          previous: Mapping[str, Any] | None) -> str:
    """The fix when an override switched ``component`` (loss, miner, sampler) to ``name`` but
    ``params`` still holds parameters of the old component that the new one does not take."""
    from dmlbench.registry import accepted_parameters

    old = (previous or {}).get(component)
    if not isinstance(old, Mapping) or not isinstance(old.get("params"), Mapping):
        return ""
    old_name = old.get("name", getattr(Config.model_fields[component].default_factory(), "name", None))
    accepted = accepted_parameters(constructor)
    if old_name == name or accepted is None or not (set(old["params"]) & set(params)) - accepted:
        return ""
    return (f"; {component}.name changed from {old_name!r} to {name!r} but {component}.params kept the old "
            f"{component}'s: add {component}.params={{}} to drop the old {component}'s parameters")


def to_yaml(config: Config) -> str:
    # Without plugins, tracking or re-ranking the file stays as it was before they existed (stored run
    # configs, and the config hashes of indexes and calibrations, compare equal).
    unset: dict[str, Any] = {name: True for name, default in (("plugins", []), ("tracking", TrackingConfig()))
                             if getattr(config, name) == default}
    if config.evaluation.rerank == RerankConfig():
        unset["evaluation"] = {"rerank"}
    return yaml.safe_dump(config.model_dump(mode="json", exclude=unset or None), sort_keys=False)
