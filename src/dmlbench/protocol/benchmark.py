"""A quick benchmark: several methods trained under one shared configuration, each selected on
validation and evaluated once on the test classes, beside the untrained model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.training import evaluate_run, records, train

DEFAULT_BENCHMARK = Path(__file__).resolve().parent.parent / "configs" / "benchmark.yaml"


class MethodSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    # The method's hyper-parameter search space (``dmlbench.protocol.search_space``); empty: nothing searched.
    search: dict[str, Any] = Field(default_factory=dict)


class BenchmarkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: dict[str, Any] = Field(default_factory=dict)
    methods: list[MethodSpec] = Field(min_length=1)


@dataclass
class MethodResult:
    name: str
    run_dir: Path
    status: str
    test: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


def load_spec(path: Path | None) -> BenchmarkSpec:
    path = path or DEFAULT_BENCHMARK
    if not path.is_file():
        raise UserInputError(f"benchmark config {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        spec = BenchmarkSpec.model_validate(raw)
    except yaml.YAMLError:
        raise UserInputError(f"benchmark config {path} is not valid YAML") from None
    except ValidationError as error:
        first = error.errors()[0]
        raise UserInputError(f"benchmark config key {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    names = [method.name for method in spec.methods]
    if len(set(names)) != len(names):
        raise UserInputError("benchmark method names must be unique")
    return spec


def method_configs(spec: BenchmarkSpec, overrides: list[str]) -> dict[str, config_module.Config]:
    """Every method's full config, validated before anything is trained."""
    configs = {}
    for method in spec.methods:
        method_overrides = [f"{key}={json.dumps(value)}" for key, value in method.overrides.items()]
        try:
            configs[method.name] = config_module.from_dict(
                yaml.safe_load(yaml.safe_dump(spec.base)) or {}, method_overrides + overrides
            )
        except UserInputError as error:
            raise UserInputError(f"method {method.name!r}: {error}") from None
    return configs


def run_benchmark(
    spec: BenchmarkSpec, output_dir: Path, overrides: list[str] | None = None, progress: bool = True
) -> list[MethodResult]:
    configs = method_configs(spec, overrides or [])
    output_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name, config in configs.items():
        run_dir = output_dir / name
        resume = (run_dir / records.RUN_FILE).exists()
        finished = resume and records.read_json(run_dir / records.RUN_FILE).get("status") == "completed"
        if not finished:
            if progress:
                print(f"== {name}: training ({config.loss.name}"
                      f"{' + ' + config.miner.name if config.miner.name else ''})", flush=True)
            try:
                train(config, run_dir, resume=resume, progress=progress)
            except RunInterrupted:
                raise RunInterrupted(
                    f"benchmark {output_dir} stopped while training {name}; re-run the same command to continue"
                ) from None
            except Exception as error:  # one failed method must not lose the others' results
                results.append(MethodResult(name, run_dir, "failed", reason=f"{type(error).__name__}: {error}"))
                continue
        results.append(MethodResult(name, run_dir, "completed", test=evaluate_run(run_dir)))
    records.write_json(output_dir / "results.json", [_as_json(result) for result in results])
    records.atomic_write_text(output_dir / "report.md", format_report(results))
    return results


def _as_json(result: MethodResult) -> dict[str, Any]:
    return {"name": result.name, "run_dir": str(result.run_dir), "status": result.status,
            "test": result.test, "reason": result.reason}


REPORT_COLUMNS = ("precision_at_1", "recall_at_4", "r_precision", "map_at_r", "nmi")


def format_report(results: list[MethodResult]) -> str:
    """A Markdown table of test metrics (in %), the untrained model first."""
    header = "| method | " + " | ".join(REPORT_COLUMNS) + " |"
    lines = [
        "# dmlbench quick benchmark (test classes, one run each, no confidence intervals yet)",
        "",
        header,
        "|" + " --- |" * (len(REPORT_COLUMNS) + 1),
    ]
    completed = [result for result in results if result.status == "completed"]
    if completed:
        untrained = completed[0].test["untrained"]
        lines.append("| untrained | " + " | ".join(_percent(untrained.get(key)) for key in REPORT_COLUMNS) + " |")
    for result in results:
        if result.status == "completed":
            lines.append(f"| {result.name} | " + " | ".join(_percent(result.test.get(key)) for key in REPORT_COLUMNS) + " |")
        else:
            lines.append(f"| {result.name} | failed: {result.reason} |" + " |" * (len(REPORT_COLUMNS) - 1))
    return "\n".join(lines) + "\n"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"
