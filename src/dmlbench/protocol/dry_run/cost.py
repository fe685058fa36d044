"""``dmlbench benchmark --dry-run``: what a benchmark costs before it runs.

Counts the training runs and epochs the config implies (every method, and again for each repeat of
its search under ``protocol.search_repeats``: ``trials`` search trials and ``reproductions``
reproductions, each ``folds`` runs of at most ``epochs`` epochs; early stopping can only shorten
them) and estimates the wall time of the whole command from pieces measured here, on the first
fold, in this process (one worker):

- a training step of every method (its loss, miner and sampler; the first method's when several
  share them): ``timings.WARMUP_STEPS`` steps discarded (the first ones allocate memory and build the
  kernels), then the median of ``timings.TIMED_STEPS`` (a step of the real run is a warm one), taken by the
  training loop itself under a step budget (``training.loop.time_steps``), after its warm-up epochs;
  methods' steps differ by up to several times (a miner, a proxy loss), so one method's step would
  misjudge the others';
- per run: a validation pass (embedding and scoring the validation classes, at epoch 0 and on the
  ``eval_every`` schedule), a checkpoint per epoch (and per improving validation), and what else a
  run costs (set-up, records, provenance): real one-step runs in a temporary directory (the median
  of three), less their step, validation passes and checkpoints;
- per reproduction: each fold run opened and its embedding-space analysis (its training classes
  embedded; timed on the one-step run), the fold models' test embeddings, their scores and per-class
  sums; the test embeddings and scores for the untrained baseline. The test data is never opened
  here: an embedding's time is the validation pass's per image, the scoring is timed on random
  embeddings of the test split's size;
- per unit of work (a search trial, with ``protocol.fold_units`` each of its folds as well, a
  reproduction): the protocol's bookkeeping in the storage, timed on a throw-away storage of the kind
  the workers default to, which is created once;
- once: the command's start (from the process's start: imports, checks, the dataset, and what the
  first set-up, step, validation pass and run of a process pay beyond the others), and the report: the
  real report writer the command is given (``report.write_report``, so its reading of the storage,
  statistics, figures, files and first imports), timed on a benchmark of the same methods, trials,
  reproductions and folds stored with made-up results (``protocol.dry_run.rehearsal``).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dmlbench.protocol import layout
from dmlbench.protocol.design.plan import repeated_searches
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.dry_run import timings
from dmlbench.protocol.dry_run.rehearsal import SplitSize, rehearse
from dmlbench.protocol.dry_run.wording import hours, search_parallelism, with_workers
from dmlbench.protocol.run.record import ReportWriter
from dmlbench.training.placement import STANDALONE

# The search repeats a dry run rehearses the report with; more are extrapolated (``_report_seconds``).
REHEARSED_REPEATS = 2
ONE_STEP_RUNS = 3  # one run's overhead (a fraction of a second) varies several times on a busy machine
# No GPU has been measured with several workers on it: the dry run counts them as one at a time.
SHARED_GPU = "workers sharing a GPU are counted as one at a time (their speed together is unmeasured): an upper bound"


@dataclass(frozen=True)
class Measured:
    """Seconds of the pieces a benchmark is made of, measured on this machine (see the module docstring)."""

    startup: float
    setup: float
    step: float
    steps_per_epoch: int
    validation: float
    checkpoint: float
    run_overhead: float
    embed_per_image: float
    test_scoring: float
    class_sums: float
    fold_run: float
    unit: float
    look: float
    study: float
    storage_setup: float
    report: float
    test_images: int
    # Each method's step where it differs from ``step`` (the first method's).
    method_steps: dict[str, float] = field(default_factory=dict)


def dry_run(prepared: Prepared, started: float | None = None, report: ReportWriter | None = None) -> str:
    """The lines ``--dry-run`` prints; ``started``: ``time.monotonic()`` when the command's process
    began (its imports and checks are part of the real run's time too); ``report``: the report writer
    the real run is given, timed here (``None``: no report is counted)."""
    from dmlbench.training.placement import worker_gpus

    protocol = prepared.spec.protocol
    methods, searches = len(prepared.configs), len(searched_methods(prepared))
    runs = searches * (protocol.trials + protocol.reproductions) * protocol.folds
    config = next(iter(prepared.configs.values()))
    epochs = config.training.epochs
    measured = measure(prepared, 0.0 if started is None else time.monotonic() - started, report)
    total = estimate(prepared, measured)
    gpus = worker_gpus(config.training.device)
    return "\n".join([
        (f"{methods} methods" if searches == methods else
         f"{searches} searches ({methods} methods, {searches - methods} repeated searches: protocol.search_repeats)")
        + f" x ({protocol.trials} search trials + {protocol.reproductions} reproductions) x "
        f"{protocol.folds} folds = {runs} training runs",
        f"at most {epochs} epochs each = {runs * epochs} epochs of {measured.steps_per_epoch} steps "
        f"({runs * epochs * measured.steps_per_epoch * config.training.batch_size:,} training samples)",
        f"measured here (method {next(iter(prepared.configs))!r}, fold 0): {measured.step:.3f} s per training step "
        f"(median of {timings.TIMED_STEPS} after {timings.WARMUP_STEPS} warm-up steps{_other_steps(measured)}), "
        f"{measured.setup:.2f} s to set up a model, "
        f"{measured.validation:.2f} s per validation pass, {measured.checkpoint:.3f} s per checkpoint, "
        f"{measured.run_overhead:.2f} s more per run (set-up, records), "
        f"{measured.test_scoring:.2f} s to score the test split ({measured.class_sums:.2f} s for its per-class sums), "
        f"{measured.fold_run:.2f} s to open a fold run and analyse its embedding space, "
        f"{measured.unit:.2f} s of storage per unit of work ({measured.look:.2f} s per look at a finished one, "
        f"{measured.storage_setup:.2f} s to create it), "
        f"{measured.startup:.1f} s to start (imports, checks, the data, first calls), "
        f"{measured.report:.1f} s for the report (its reading, statistics, figures and files, and their imports; "
        + ("timed on a benchmark of this size stored with made-up results)"
           if prepared.spec.protocol.search_repeats <= REHEARSED_REPEATS else
           f"timed with {REHEARSED_REPEATS} and {REHEARSED_REPEATS - 1} of its {prepared.spec.protocol.search_repeats} "
           "search repeats stored with made-up results, each further repeat at their difference: an upper bound)"),
        f"estimate: {hours(total)} of wall time for one worker at this speed (early stopping can only shorten it; "
        f"a machine busy with other work makes it longer); {with_workers(prepared.jobs, gpus)}",
        *([SHARED_GPU] if gpus else []),
        search_parallelism(protocol, searches),
        *([_rounds_line(prepared, measured)] if protocol.sequential else []),
        "this is an estimate: nothing was stored (the measured steps, the one-step runs and the report's rehearsal "
        "used a temporary directory)",
    ])


def _rounds_line(prepared: Prepared, measured: Measured) -> str:
    """A sequential study's line: the estimate above is its most (every comparison open to ``max_searches``); its
    first round costs this, and no round starts that the budget cannot pay for."""
    protocol = prepared.spec.protocol
    first = {name: protocol.round_searches for name in prepared.plans}
    seconds = estimate(replace(prepared, search_limits=first), measured)
    return (f"a sequential study (protocol.sequential): the estimate above is its most, every comparison open to "
            f"{protocol.max_searches} searches; its first round ({protocol.round_searches} searches of each method) "
            f"about {hours(seconds)} for one worker here, each later round as much for the methods still open; no "
            f"round starts that the budget ({protocol.budget or 'none'} unless --budget says otherwise) cannot pay for")


def estimate(prepared: Prepared, measured: Measured) -> float:
    """Seconds the whole benchmark takes one worker: every run's set-up, steps, validation passes and
    checkpoints, the reproductions' and the baseline's test embeddings and scores, the storage's work
    per unit, the command's start and the report (which reads every study back)."""
    protocol = prepared.spec.protocol
    searched = searched_methods(prepared)  # a repeated search costs what a method's search does
    searches, folds = len(searched), protocol.folds
    runs_per_search = (protocol.trials + protocol.reproductions) * folds
    training = sum(runs_per_search * run_seconds(prepared, measured, method) for method in searched)
    # A reproduction opens each fold run (its embedding-space analysis embeds the training classes) and embeds
    # the test split with it, then scores them concatenated and per fold; each baseline likewise, untrained.
    test_embedding = measured.embed_per_image * measured.test_images
    trained_reproduction = folds * (measured.fold_run + test_embedding)
    scoring = (1 + folds) * measured.test_scoring
    reproductions = searches * protocol.reproductions * (trained_reproduction + scoring + measured.class_sums)
    # A baseline's reproduction embeds the test split once and gives that embedding to every fold (the
    # folds split only the development classes); only the untrained one builds a model.
    baselines, untrained = len(protocol.baselines), protocol.baselines.count(layout.UNTRAINED)
    baseline = protocol.reproductions * (untrained * measured.setup + baselines * (test_embedding + scoring))
    # With ``protocol.fold_units`` a search has a second study, its fold units, and a trial is a unit per
    # fold and one of its own (its fold mean); before that one, the fold units say once that they wait.
    search_studies, trial_units, waits = (2, folds + 1, 1) if protocol.fold_units else (1, 1, 0)
    units = searches * (protocol.trials * trial_units + protocol.reproductions) + baselines * protocol.reproductions
    studies = (search_studies + 1) * searches + baselines  # every search (and its folds) and its reproductions, the baselines
    # The one scheduling loop starts from the first study after every unit: a unit of the k-th study
    # (searches, then reproductions, then the baselines) first looks at the k - 1 before it.
    looks = (protocol.trials * (search_studies * trial_units * searches * (searches - 1) // 2 + waits * searches)
             + protocol.reproductions * (search_studies * searches * searches + searches * (searches - 1) // 2
                                         + baselines * (search_studies + 1) * searches + baselines * (baselines - 1) // 2)
             + studies)
    storage = measured.storage_setup + units * measured.unit + looks * measured.look + studies * measured.study
    return measured.startup + training + reproductions + baseline + storage + measured.report


def searched_methods(prepared: Prepared) -> list[str]:
    """The method each search trains, once per method and once more per repeated search
    (``protocol.search_repeats``), each with its trials and the reproductions of its best trial."""
    return [*prepared.plans, *(name for name, _ in repeated_searches(prepared.plans, prepared.spec.protocol,
                                                                      prepared.search_limits))]


def estimate_round(prepared: Prepared) -> float:
    """Seconds one worker needs for ``prepared`` (a sequential study's round, ``protocol.run.rounds``), measured
    here as the dry run measures (the report is not counted)."""
    return estimate(prepared, measure(prepared))


def run_seconds(prepared: Prepared, measured: Measured, method: str | None = None) -> float:
    """Seconds of one training run of ``method`` (default: the first) of at most ``training.epochs``
    epochs: its steps, validation passes and checkpoints, and what else a run costs (its set-up,
    records, provenance)."""
    config = next(iter(prepared.configs.values()))
    epochs, every = config.training.epochs, config.training.eval_every
    validations = 1 + epochs // every + (epochs % every != 0)  # epoch 0, the schedule, the last epoch
    step = measured.method_steps.get(method, measured.step) if method is not None else measured.step
    # Every epoch writes the last checkpoint, an improving validation the best checkpoint too.
    return (measured.run_overhead + epochs * (measured.steps_per_epoch * step + measured.checkpoint)
            + validations * measured.validation + (validations - 1) * measured.checkpoint)


def measure(prepared: Prepared, startup: float = 0.0, report: ReportWriter | None = None) -> Measured:
    """The pieces of ``Measured`` on the first method's first fold; ``startup``: seconds the command
    took to get here; ``report``: the report writer to time (``None``: the report counts 0 s)."""
    import torch

    from dmlbench.training.setup import set_up_training

    config = next(iter(prepared.plans.values())).run_config({}, prepared.layout.folds[0])
    # One worker's speed, as a process of its own measures it (the estimate divides by the workers).
    torch.set_num_threads(STANDALONE.threads(config.training.num_threads))
    device = STANDALONE.device(config.training.device)
    started = time.perf_counter()
    set_up_training(config, device)  # the first set-up reads the data, once for every run of the process
    first_setup = time.perf_counter() - started
    started = time.perf_counter()
    setup = set_up_training(config, device)
    setup_seconds = time.perf_counter() - started
    # What only the first set-up of a process pays (reading the data, torch's lazy imports on the first
    # optimiser) is part of the command's start: seconds on a small benchmark.
    startup += max(first_setup - setup_seconds, 0.0)
    step, steps_per_epoch, first_step = timings.step_seconds(config, setup, device)
    method_steps = _method_steps(prepared, device)
    validation, embed_per_image, width, first_validation = timings.validation_seconds(config, setup, device)
    startup += first_step + first_validation  # likewise once: what the process's first step and pass pay more
    domains = len(setup.dataset.images_per_domain() or {}) if config.evaluation.cross_domain else 0
    test = SplitSize(len(setup.full_splits.test), len(prepared.layout.test_classes), width, domains)
    test_scoring, class_sums = timings.scoring_seconds(config, test, prepared.spec.protocol.folds, device)
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = timings.checkpoint_seconds(setup, Path(directory))
        run_overhead, first_run = _run_overhead(config, Path(directory), step, validation, checkpoint)
        fold_run = timings.fold_run_seconds(Path(directory) / "run")
        unit, look, study, storage_setup = _storage_seconds(prepared, Path(directory))
        rehearsal = Path(directory) / "rehearsal"
        report_seconds = 0.0 if report is None else _report_seconds(prepared, rehearsal, test, report)
    return Measured(
        startup=startup + first_run, setup=setup_seconds, step=step, steps_per_epoch=steps_per_epoch,
        validation=validation, checkpoint=checkpoint, run_overhead=run_overhead, embed_per_image=embed_per_image, test_scoring=test_scoring,
        class_sums=class_sums, fold_run=fold_run, unit=unit, look=look, study=study, storage_setup=storage_setup,
        report=report_seconds, test_images=test.images, method_steps=method_steps,
    )


def _method_steps(prepared: Prepared, device: Any) -> dict[str, float]:
    """The step of every method after the first whose training differs from the first's (loss,
    miner, sampler, optimiser, model), on the first fold with the method's default parameters."""
    from dmlbench.training.setup import set_up_training

    (first, *others) = prepared.plans.values()
    seen = {timings.training_identity(first.run_config({}, prepared.layout.folds[0]))}
    steps = {}
    for plan in others:
        config = plan.run_config({}, prepared.layout.folds[0])
        if (identity := timings.training_identity(config)) in seen:
            continue
        seen.add(identity)
        steps[plan.name] = timings.step_seconds(config, set_up_training(config, device), device)[0]
    return steps


def _run_overhead(config: Any, directory: Path, step: float, validation: float, checkpoint: float) -> tuple[float, float]:
    """Seconds a run costs besides its steps, validation passes and checkpoints (set-up, records,
    provenance): the median of ``ONE_STEP_RUNS`` real runs of one step (untracked; the first in
    ``directory / "run"``), less those pieces; and what the process's first run took more."""
    from dmlbench import config as config_module
    from dmlbench.training import train

    one_step = config_module.from_dict(config_module.assign(config.model_dump(mode="json"), {
        "training.epochs": 1, "training.max_steps_per_epoch": 1, "training.early_stopping_patience": None,
        "tracking.backend": "none"}))
    seconds = []
    for index in range(ONE_STEP_RUNS):
        started = time.perf_counter()
        train(one_step, directory / ("run" if index == 0 else f"run {index}"), progress=False)
        seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    return max(median - step - 2 * validation - 2 * checkpoint, 0.0), max(seconds[0] - median, 0.0)


def _storage_seconds(prepared: Prepared, directory: Path) -> tuple[float, float, float, float]:
    """Seconds of the storage's work, on a throw-away storage of the kind the benchmark's workers
    default to: one unit (claim it, record its start, heartbeat and end; the second of two), a look
    at a finished study (a claim that finds nothing left), opening a study, and creating the storage
    (its tables, with the first study, in the process's first call)."""
    from dmlbench.protocol.queue import storage, work
    from dmlbench.protocol.units.unit import claim_reproduction, open_unit_study

    started = time.perf_counter()
    worker = work.Worker(storage.default_url(directory, prepared.jobs))
    settings = replace(prepared.reproduction, reproductions=2)
    open_unit_study(worker, "tables", {"method": "tables"})
    creation = time.perf_counter() - started
    started = time.perf_counter()
    study = open_unit_study(worker, "cost", {"method": "cost"})
    opening = time.perf_counter() - started
    unit = 0.0
    for _ in range(settings.reproductions):
        started = time.perf_counter()
        claimed = claim_reproduction(study, worker, settings)
        assert isinstance(claimed, work.Claim), claimed
        work.execute(study, claimed, worker, lambda attributes: 0.0, lambda: work.Cost.since(work.Cost.start(), 0))
        unit = time.perf_counter() - started
    started = time.perf_counter()
    assert claim_reproduction(study, worker, settings) == work.DONE
    return unit, time.perf_counter() - started, opening, max(creation - opening, 0.0)


def _report_seconds(prepared: Prepared, directory: Path, test: SplitSize, report: ReportWriter) -> float:
    """Seconds of ``report`` on the benchmark stored with made-up results. Up to ``REHEARSED_REPEATS`` search
    repeats it is the benchmark itself; beyond, a rehearsal of every unit would take as long as the search
    repeats are many (68 repeats: more than 18 minutes), so the report is timed with 2 repeats and with 1,
    and each further repeat costs their difference: an upper bound, since only the first report of a
    process pays the report's imports, as the real run's first does."""
    repeats = prepared.spec.protocol.search_repeats
    if repeats <= REHEARSED_REPEATS:
        return _timed_report(prepared, directory, test, report)
    most = _timed_report(_with_repeats(prepared, REHEARSED_REPEATS), directory / "most", test, report)
    fewer = _timed_report(_with_repeats(prepared, REHEARSED_REPEATS - 1), directory / "fewer", test, report)
    return most + (repeats - REHEARSED_REPEATS) * max(most - fewer, 0.0)


def _timed_report(prepared: Prepared, directory: Path, test: SplitSize, report: ReportWriter) -> float:
    """Seconds of ``report`` on ``prepared`` stored in ``directory`` with made-up results."""
    rehearsed = rehearse(prepared, directory, test)
    started = time.perf_counter()
    report(rehearsed.output_dir, rehearsed.storage)
    return time.perf_counter() - started


def _with_repeats(prepared: Prepared, repeats: int) -> Prepared:
    """``prepared`` with ``repeats`` searches per repeated method (``protocol.search_repeats``); a sequential
    study's rounds left out (its report's sequential part costs next to nothing)."""
    protocol = prepared.spec.protocol.model_copy(update={"search_repeats": repeats, "sequential": False, "max_searches": None})
    return replace(prepared, spec=prepared.spec.model_copy(update={"protocol": protocol}))


def _other_steps(measured: Measured) -> str:
    """The other methods' steps, for the dry run's line: ``; per method: name 0.123 s, ...``."""
    if not measured.method_steps:
        return ""
    return "; the others: " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in measured.method_steps.items())
