"""A method's hyper-parameter search space, declared in the benchmark YAML and checked before training.

Musgrave et al. 2020 (seed 001) §3.3 tune every method's hyper-parameters with Bayesian optimisation
over a declared space; this module is that declaration. Each entry maps a dotted config key to a
range or a list of choices::

    search:
      loss.params.margin: {low: 0.01, high: 1.0, log: true}        # float (the default type)
      training.batch_size: {low: 32, high: 128, step: 16, type: int}
      miner.name: {choices: [semihard, hard]}                        # categorical
      miner.params.epsilon: {low: 0.0, high: 0.5, when: {miner.name: hard}}   # conditional

A conditional parameter is suggested only when every ``when`` key (itself a categorical search
parameter) has the given value (or one of a list of values). ``parse_search_space`` checks every
entry against the config schema and the component registries by validating the method's config with
each bound and each choice set, so an unknown key, a hyper-parameter a component does not accept, an
unknown component name, an empty range (``low >= high``) or an empty choice list is a one-line
``UserInputError`` naming the key before anything trains. ``SearchSpace.suggest`` turns an Optuna
trial into a ``{dotted key: value}`` assignment with ``trial.suggest_float`` / ``suggest_int`` /
``suggest_categorical``; ``config.assign`` writes it into a raw config mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from dmlbench import config as config_module
from dmlbench.errors import UserInputError

CategoricalValue = None | bool | int | float | str
_RANGE_FIELDS = {"low", "high", "log", "step", "type", "when"}
_CHOICE_FIELDS = {"choices", "when"}


@dataclass(frozen=True)
class Parameter:
    """One searched config key: a float/int range (``kind`` float or int) or a categorical ``choices`` list."""

    key: str
    kind: str  # "float" | "int" | "categorical"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[CategoricalValue, ...] = ()
    when: Mapping[str, tuple[CategoricalValue, ...]] = field(default_factory=dict)

    def active(self, assignment: Mapping[str, Any]) -> bool:
        """Whether every ``when`` condition holds in ``assignment`` (a parent not assigned: inactive)."""
        return all(key in assignment and assignment[key] in values for key, values in self.when.items())

    def representatives(self) -> list[Any]:
        """The values the schema check builds a config with: both bounds, or every choice."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclass(frozen=True)
class SearchSpace:
    """The searched parameters of one method, parents before the parameters conditioned on them."""

    parameters: tuple[Parameter, ...] = ()

    def __len__(self) -> int:
        return len(self.parameters)

    def keys(self) -> list[str]:
        return [parameter.key for parameter in self.parameters]

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The ``{dotted key: value}`` assignment of an Optuna trial; inactive conditionals are left out."""
        assignment: dict[str, Any] = {}
        for parameter in self.parameters:
            if not parameter.active(assignment):
                continue
            if parameter.kind == "categorical":
                value: Any = trial.suggest_categorical(parameter.key, list(parameter.choices))
            elif parameter.kind == "int":
                value = trial.suggest_int(
                    parameter.key, int(parameter.low), int(parameter.high),  # type: ignore[arg-type]
                    step=int(parameter.step or 1), log=parameter.log,
                )
            else:
                value = trial.suggest_float(
                    parameter.key, float(parameter.low), float(parameter.high),  # type: ignore[arg-type]
                    step=parameter.step, log=parameter.log,
                )
            assignment[parameter.key] = value
        return assignment


def as_override_strings(assignment: Mapping[str, Any]) -> list[str]:
    """``key=value`` command-line overrides for an assignment, each value written as one line of YAML
    (so that it round-trips through ``config.parse_override``: ``1e-05`` is written ``1.0e-05``)."""
    return [f"{key}={_yaml_scalar(value)}" for key, value in assignment.items()]


def _yaml_scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31).strip()
    return text.removesuffix("...").strip()


def parse_search_space(
    raw: Mapping[str, Any] | None,
    base: Mapping[str, Any] | None = None,
    *,
    method: str | None = None,
    validate: Callable[[dict[str, Any]], Any] | None = None,
) -> SearchSpace:
    """Parse and check a ``search:`` mapping of one method.

    ``base`` is the method's raw config mapping (the benchmark's ``base`` with the method's overrides
    applied); every bound and every choice is written into it and the result validated with
    ``validate`` (default: ``dmlbench.config.from_dict``, which checks the schema, component names and
    their hyper-parameter names). Errors are one line: ``method 'm': search key 'k': reason``.
    """
    where = f"method {method!r}: " if method is not None else ""
    if raw is None:
        return SearchSpace()
    if not isinstance(raw, Mapping):
        raise UserInputError(f"{where}search must be a mapping of dotted config keys to ranges or choices")
    parameters = {key: _parse_entry(str(key), spec, where) for key, spec in raw.items()}
    ordered = _parents_first(parameters, where)
    space = SearchSpace(tuple(ordered))
    _check_against_schema(space, dict(base or {}), validate or config_module.from_dict, where)
    return space


def _parse_entry(key: str, spec: Any, where: str) -> Parameter:
    prefix = f"{where}search key {key!r}"
    if not key or any(not part for part in key.split(".")):
        raise UserInputError(f"{prefix}: not a dotted config key")
    if not isinstance(spec, Mapping):
        raise UserInputError(f"{prefix}: expected a mapping with low/high or choices, got {spec!r}")
    when = _parse_when(spec.get("when", {}), prefix)
    if "choices" in spec:
        unknown = sorted(set(spec) - _CHOICE_FIELDS)
        if unknown:
            raise UserInputError(f"{prefix}: unknown field {unknown[0]!r} for a categorical parameter")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise UserInputError(f"{prefix}: choices must be a non-empty list")
        for choice in choices:
            if choice is not None and not isinstance(choice, (bool, int, float, str)):
                raise UserInputError(f"{prefix}: choice {choice!r} is not a number, string, boolean or null")
        if len(set(map(repr, choices))) != len(choices):
            raise UserInputError(f"{prefix}: choices must not repeat a value")
        return Parameter(key=key, kind="categorical", choices=tuple(choices), when=when)
    unknown = sorted(set(spec) - _RANGE_FIELDS)
    if unknown:
        raise UserInputError(f"{prefix}: unknown field {unknown[0]!r} (a range has low, high, log, step, type, when)")
    if "low" not in spec or "high" not in spec:
        raise UserInputError(f"{prefix}: a range needs both low and high (or give choices)")
    kind = spec.get("type", "float")
    if kind not in ("float", "int"):
        raise UserInputError(f"{prefix}: type must be float or int, got {kind!r}")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserInputError(f"{prefix}: {name} must be a finite number, got {value!r}")
        if kind == "int" and not float(value).is_integer():
            raise UserInputError(f"{prefix}: {name} of an int range must be an integer, got {value!r}")
    if not isinstance(log, bool):
        raise UserInputError(f"{prefix}: log must be true or false, got {log!r}")
    if low >= high:
        raise UserInputError(f"{prefix}: empty range, low ({low}) must be less than high ({high})")
    if log and low <= 0:
        raise UserInputError(f"{prefix}: a log-scale range needs low > 0, got {low}")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
            raise UserInputError(f"{prefix}: step must be a positive number, got {step!r}")
        if log:
            raise UserInputError(f"{prefix}: step and log cannot be combined")
        if kind == "int" and not float(step).is_integer():
            raise UserInputError(f"{prefix}: step of an int range must be an integer, got {step!r}")
    if kind == "int":
        return Parameter(key=key, kind="int", low=int(low), high=int(high), log=log,
                         step=None if step is None else int(step), when=when)
    return Parameter(key=key, kind="float", low=float(low), high=float(high), log=log,
                     step=None if step is None else float(step), when=when)


def _parse_when(raw: Any, prefix: str) -> dict[str, tuple[CategoricalValue, ...]]:
    if not isinstance(raw, Mapping):
        raise UserInputError(f"{prefix}: when must map search keys to a value or a list of values")
    when = {}
    for key, value in raw.items():
        values = tuple(value) if isinstance(value, list) else (value,)
        if not values:
            raise UserInputError(f"{prefix}: when {key!r} lists no values")
        when[str(key)] = values
    return when


def _parents_first(parameters: dict[str, Parameter], where: str) -> list[Parameter]:
    """Declaration order, except that a parameter comes after every parameter it is conditioned on."""
    for parameter in parameters.values():
        for parent_key, values in parameter.when.items():
            parent = parameters.get(parent_key)
            prefix = f"{where}search key {parameter.key!r}"
            if parent is None or parent.kind != "categorical":
                raise UserInputError(f"{prefix}: when refers to {parent_key!r}, which is not a categorical search key")
            for value in values:
                if value not in parent.choices:
                    raise UserInputError(f"{prefix}: when {parent_key!r} = {value!r} is not one of its choices")
    ordered: list[Parameter] = []
    placed: set[str] = set()
    visiting: set[str] = set()

    def place(key: str) -> None:
        if key in placed:
            return
        if key in visiting:
            raise UserInputError(f"{where}search key {key!r}: its when conditions form a cycle")
        visiting.add(key)
        for parent_key in parameters[key].when:
            place(parent_key)
        visiting.discard(key)
        placed.add(key)
        ordered.append(parameters[key])

    for key in parameters:
        place(key)
    return ordered


def _check_against_schema(
    space: SearchSpace, base: dict[str, Any], validate: Callable[[dict[str, Any]], Any], where: str
) -> None:
    """Validate the config with every bound / choice of each parameter (its conditions made true)."""
    for parameter in space.parameters:
        for value in parameter.representatives():
            assignment = _representative_assignment(space, parameter, value)
            try:
                validate(config_module.assign(base, assignment))
            except UserInputError as error:
                raise UserInputError(f"{where}search key {parameter.key!r} = {value!r}: {error}") from None


def _representative_assignment(space: SearchSpace, target: Parameter, value: Any) -> dict[str, Any]:
    """``target = value`` with the parents that make it active, and every unconditional parameter at its
    first value. Other conditional parameters are left at the base config, so that an error is
    attributed to the parameter that causes it (a choice is not blamed for its children's keys)."""
    required: dict[str, Any] = {}

    def require(parameter: Parameter) -> None:
        for parent_key, values in parameter.when.items():
            required.setdefault(parent_key, values[0])
            require(next(p for p in space.parameters if p.key == parent_key))

    require(target)
    required[target.key] = value
    assignment: dict[str, Any] = {}
    for parameter in space.parameters:
        if parameter.key in required:
            assignment[parameter.key] = required[parameter.key]
        elif not parameter.when:
            assignment[parameter.key] = parameter.representatives()[0]
    return assignment
