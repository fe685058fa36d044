"""``schedule.Schedule`` as an ordered list of stages (``protocol.run.stages``): the same order of work as
the single generator it replaced, checked against that generator on scripted units, with workers
elsewhere (``WAIT``), searches that never find a best trial and repeated searches."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dmlbench.protocol.queue import work
from dmlbench.protocol.run import schedule as schedule_module
from dmlbench.protocol.run import stages as stages_module


class ScriptedUnit:
    """A unit whose ``step`` returns the states of its script in turn, then ``DONE`` for ever."""

    def __init__(self, name: str, script: list[str], log: list[tuple[str, str]]) -> None:
        self.name, self.script, self.log = name, list(script), log
        self.done = False
        self.plan = SimpleNamespace(name=name)
        self.study = name

    def step(self) -> str:
        state = self.script.pop(0) if self.script else work.DONE
        self.done = state == work.DONE
        self.log.append((self.name, state))
        return state


def _script(rng: random.Random) -> list[str]:
    """Some slots run here (``worked``) or elsewhere (``WAIT``), then ``DONE``."""
    return [rng.choice(["worked", "worked", work.WAIT]) for _ in range(rng.randrange(0, 5))] + [work.DONE]


class Scenario:
    """One benchmark's scripted units: methods (a repeat among them), which have a best trial, and the
    scripts every unit follows; ``build`` makes fresh units that log their steps and creations."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.plans = [f"m{index}" for index in range(rng.randrange(1, 4))]
        self.repeats = [f"{self.plans[0]}@search1"] if rng.random() < 0.5 else []
        self.best = {name: rng.random() < 0.8 for name in self.plans + self.repeats}
        if not any(self.best[name] for name in self.plans):
            # Only a repeat with a best trial leaves the baselines no reference method: the generator
            # these tests compare with raised StopIteration there (the stages make no baselines).
            self.best.update(dict.fromkeys(self.repeats, False))
        self.scripts = {name: _script(rng) for name in self.plans + self.repeats}
        self.scripts.update({f"reproductions:{name}": _script(rng) for name in self.plans + self.repeats})
        self.baselines = rng.choice([["untrained"], ["untrained", "raw_pixels"], []])
        self.scripts.update({f"baseline:{kind}": _script(rng) for kind in self.baselines})
        self.steps: list[tuple[str, str]] = []
        self.made: list[str] = []

    def searches(self) -> dict[str, ScriptedUnit]:
        return {name: ScriptedUnit(name, self.scripts[name], self.steps) for name in self.plans + self.repeats}

    def reproduction(self, plan: Any, params: dict[str, Any], settings: Any, context: Any) -> ScriptedUnit:
        self.made.append(f"reproductions:{plan.name}")
        unit = ScriptedUnit(f"reproductions:{plan.name}", self.scripts[f"reproductions:{plan.name}"], self.steps)
        unit.params = params
        return unit

    def baseline(self, kind: str, reference: Any, params: dict[str, Any], settings: Any, context: Any) -> ScriptedUnit:
        self.made.append(f"baseline:{kind}:{reference.name}")
        return ScriptedUnit(f"baseline:{kind}", self.scripts[f"baseline:{kind}"], self.steps)

    def best_trial(self, study: str) -> Any:
        return SimpleNamespace(params={"of": study}) if self.best[study] else None

    def prepared(self) -> Any:
        return SimpleNamespace(plans={name: SimpleNamespace(name=name) for name in self.plans}, reproduction=None,
                               spec=SimpleNamespace(protocol=SimpleNamespace(baselines=self.baselines)))


def _generator_units(scenario: Scenario, searches: dict[str, ScriptedUnit]) -> Any:
    """The schedule as it was before the stages: one generator making reproductions right after a
    done search is passed, the baselines after every search (the reference for the stages)."""
    reproductions: dict[str, ScriptedUnit] = {}
    baselines: list[ScriptedUnit] = []
    prepared = scenario.prepared()

    def units() -> Iterator[ScriptedUnit]:
        for name, search in searches.items():
            yield search
            if search.done and name not in reproductions and (best := scenario.best_trial(search.study)) is not None:
                reproductions[name] = scenario.reproduction(search.plan, dict(best.params), None, None)
        if not baselines and reproductions and all(search.done for search in searches.values()):
            reference = next(name for name in prepared.plans if name in reproductions)
            baselines.extend(scenario.baseline(kind, prepared.plans[reference], reproductions[reference].params, None, None)
                             for kind in prepared.spec.protocol.baselines)
        yield from reproductions.values()
        yield from baselines

    return units


def _staged(scenario: Scenario, monkeypatch: pytest.MonkeyPatch, search_only: bool = False) -> schedule_module.Schedule:
    def search_stage(prepared: Any, context: Any) -> stages_module.SearchStage:
        stage = stages_module.SearchStage.__new__(stages_module.SearchStage)
        stage.searches, stage.repeats = scenario.searches(), {}  # the repeats' own settings do not change the order
        return stage

    monkeypatch.setattr(schedule_module, "SearchStage", search_stage)
    monkeypatch.setattr(stages_module, "MethodReproduction", scenario.reproduction)
    monkeypatch.setattr(stages_module, "Baseline", scenario.baseline)
    monkeypatch.setattr(stages_module, "best_trial", scenario.best_trial)
    monkeypatch.setattr(stages_module, "recorded_reference", lambda context, kinds: None)  # no storage here
    return schedule_module.Schedule(scenario.prepared(), SimpleNamespace(), search_only=search_only)


@pytest.mark.parametrize("seed", range(60))
def test_stages_take_the_units_in_the_order_of_the_single_generator(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule_module, "POLL_SECONDS", 0.0)
    before = Scenario(seed)
    schedule_module.drive(_generator_units(before, before.searches()))
    after = Scenario(seed)
    schedule = _staged(after, monkeypatch)
    schedule_module.drive(schedule.units)
    assert after.steps == before.steps
    assert after.made == before.made  # the same studies opened in the same order
    # every method with a best trial reproduced, in the order its search was found done
    assert set(schedule.reproductions) == {name for name in after.plans + after.repeats if after.best[name]}
    assert [f"reproductions:{name}" for name in schedule.reproductions] == [made for made in after.made
                                                                           if made.startswith("reproductions:")]
    assert len(schedule.baselines) == (len(after.baselines) if any(after.best.values()) else 0)


def test_a_method_is_reproduced_only_after_its_search_and_the_baselines_after_every_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule_module, "POLL_SECONDS", 0.0)
    scenario = Scenario(0)
    scenario.plans, scenario.repeats, scenario.baselines = ["a", "b"], [], ["untrained", "raw_pixels"]
    scenario.best = {"a": False, "b": True}  # a's every trial failed: b is the baselines' reference
    scenario.scripts = {"a": ["worked", work.DONE], "b": [work.WAIT, "worked", work.DONE],
                        "reproductions:b": ["worked", work.DONE],
                        "baseline:untrained": ["worked", work.DONE], "baseline:raw_pixels": [work.DONE]}
    schedule = _staged(scenario, monkeypatch)
    schedule_module.drive(schedule.units)
    assert scenario.made == ["reproductions:b", "baseline:untrained:b", "baseline:raw_pixels:b"]
    first_reproduction = scenario.steps.index(("reproductions:b", "worked"))
    assert ("b", work.DONE) in scenario.steps[:first_reproduction]
    assert scenario.steps.index(("baseline:untrained", "worked")) > scenario.steps.index(("b", work.DONE))


def test_the_search_alone_makes_no_reproduction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(schedule_module, "POLL_SECONDS", 0.0)
    scenario = Scenario(3)
    scenario.best = {name: True for name in scenario.best}
    schedule = _staged(scenario, monkeypatch, search_only=True)
    schedule_module.drive(schedule.units)
    assert scenario.made == [] and schedule.reproductions == {} and schedule.baselines == []
    assert {name for name, state in scenario.steps} == set(scenario.plans + scenario.repeats)
