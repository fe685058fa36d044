"""``dmlbench benchmark --dry-run``: what a benchmark costs before it runs.

Counts the training runs and epochs the config implies (every method: ``trials`` search trials and
``reproductions`` reproductions, each ``folds`` runs of at most ``epochs`` epochs; early stopping can
only shorten them) and estimates the wall time of the whole command from pieces measured here, on
the first fold, in this process (one worker):

- a training step of every method (its loss, miner and sampler; the first method's when several
  share them): ``WARMUP_STEPS`` steps discarded (the first ones allocate memory and build the
  kernels), then the median of ``TIMED_STEPS`` (a step of the real run is a warm one), taken by the
  training loop itself under a step budget (``training.loop.time_steps``), after its warm-up epochs;
  methods' steps differ by up to several times (a miner, a proxy loss), so one method's step would
  misjudge the others';
- per run: a validation pass (embedding and scoring the validation classes, at epoch 0 and on the
  ``eval_every`` schedule), a checkpoint per epoch (and per improving validation), and what else a
  run costs (set-up, records, provenance): a real one-step run in a temporary directory, less its
  step, validation passes and checkpoints;
- per reproduction: its fold models' test embeddings and scores, and the training classes embedded
  for the embedding-space analysis; the same for the untrained baseline. The test data is never
  opened here: an embedding's time is the validation pass's per image, the scoring is timed on
  random embeddings of the test split's size;
- per unit of work (a search trial, a reproduction): the protocol's bookkeeping in the storage,
  timed on a throw-away SQLite storage;
- once: the command's start (imports, checks, the dataset, and what the first set-up of a process
  pays beyond the others), the report's figures and its statistics
  (every pair of methods per mode and metric, the declared comparisons at three margins and their
  power), timed on random scores of the benchmark's methods and reproductions.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dmlbench.protocol.prepare import Prepared
from dmlbench.training.threads import resolve_threads

WARMUP_STEPS = 3
TIMED_STEPS = 10
REPORT_FIGURES = 4  # search, validation curves, forest plot, embedding space (report.build)


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
    unit: float
    look: float
    study: float
    report: float
    statistics: float
    test_images: int
    train_images: int
    # Each method's step where it differs from ``step`` (the first method's).
    method_steps: dict[str, float] = field(default_factory=dict)


def dry_run(prepared: Prepared, started: float | None = None) -> str:
    """The lines ``--dry-run`` prints; ``started``: ``time.monotonic()`` when the command began (its
    imports and checks are part of the real run's time too)."""
    protocol = prepared.spec.protocol
    methods = len(prepared.configs)
    runs = methods * (protocol.trials + protocol.reproductions) * protocol.folds
    config = next(iter(prepared.configs.values()))
    epochs = config.training.epochs
    measured = measure(prepared, 0.0 if started is None else time.monotonic() - started)
    total = estimate(prepared, measured)
    return "\n".join([
        f"{methods} methods x ({protocol.trials} search trials + {protocol.reproductions} reproductions) x "
        f"{protocol.folds} folds = {runs} training runs",
        f"at most {epochs} epochs each = {runs * epochs} epochs of {measured.steps_per_epoch} steps "
        f"({runs * epochs * measured.steps_per_epoch * config.training.batch_size:,} training samples)",
        f"measured here (method {next(iter(prepared.configs))!r}, fold 0): {measured.step:.3f} s per training step "
        f"(median of {TIMED_STEPS} after {WARMUP_STEPS} warm-up steps{_other_steps(measured)}), "
        f"{measured.setup:.2f} s to set up a model, "
        f"{measured.validation:.2f} s per validation pass, {measured.checkpoint:.3f} s per checkpoint, "
        f"{measured.run_overhead:.2f} s more per run (set-up, records), "
        f"{measured.test_scoring:.2f} s to score the test split, {measured.unit:.2f} s of storage per unit of work "
        f"({measured.look:.2f} s per look at a finished one), "
        f"{measured.startup:.1f} s to start, {measured.report:.1f} s for the report's figures, "
        f"{measured.statistics:.1f} s for its statistics",
        f"estimate: {_hours(total)} of wall time for one worker at this speed (early stopping can only shorten it; "
        f"a machine busy with other work makes it longer); with N workers about 1/N of the training",
        "this is an estimate: nothing was stored (the measured steps and the one-step run used a temporary directory)",
    ])


def estimate(prepared: Prepared, measured: Measured) -> float:
    """Seconds the whole benchmark takes one worker: every run's set-up, steps, validation passes and
    checkpoints, the reproductions' and the baseline's test embeddings and scores, the storage's work
    per unit, the command's start and the report."""
    protocol = prepared.spec.protocol
    methods, folds = len(prepared.plans), protocol.folds
    runs_per_method = (protocol.trials + protocol.reproductions) * folds
    training = sum(runs_per_method * run_seconds(prepared, measured, method) for method in prepared.plans)
    # A reproduction embeds the test split with each fold model (and, for its embedding-space analysis,
    # the fold's training classes), then scores it concatenated and per fold; each baseline likewise, untrained.
    test_embedding = measured.embed_per_image * measured.test_images
    trained_reproduction = folds * (test_embedding + measured.embed_per_image * measured.train_images)
    scoring = (1 + folds) * measured.test_scoring
    reproductions = methods * protocol.reproductions * (trained_reproduction + scoring)
    baselines = len(protocol.baselines)
    baseline = baselines * protocol.reproductions * (folds * (measured.setup + test_embedding) + scoring)
    units = methods * (protocol.trials + protocol.reproductions) + baselines * protocol.reproductions
    studies = 2 * methods + baselines  # every method's search and reproductions, the baselines
    # The one scheduling loop starts from the first study after every unit: a unit of the k-th study
    # (searches, then reproductions, then the baseline) first looks at the k - 1 before it.
    looks = (protocol.trials * methods * (methods - 1) // 2
             + protocol.reproductions * (methods * methods + methods * (methods - 1) // 2 + 2 * methods) + studies)
    storage = units * measured.unit + looks * measured.look + studies * measured.study
    # The report reads every study back and draws its figures.
    return (measured.startup + training + reproductions + baseline + storage
            + studies * measured.study + measured.report + measured.statistics)


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


def measure(prepared: Prepared, startup: float = 0.0) -> Measured:
    """The pieces of ``Measured`` on the first method's first fold; ``startup``: seconds the command
    took to get here."""
    import torch

    from dmlbench.training.embed import resolve_device
    from dmlbench.training.setup import set_up_training

    config = next(iter(prepared.plans.values())).run_config({}, prepared.layout.folds[0])
    torch.set_num_threads(resolve_threads(config.training.num_threads))
    device = resolve_device(config.training.device)
    started = time.perf_counter()
    set_up_training(config, device)  # the first set-up reads the data, once for every run of the process
    first_setup = time.perf_counter() - started
    started = time.perf_counter()
    setup = set_up_training(config, device)
    setup_seconds = time.perf_counter() - started
    # What only the first set-up of a process pays (reading the data, torch's lazy imports on the first
    # optimiser) is part of the command's start: seconds on a small benchmark.
    startup += max(first_setup - setup_seconds, 0.0)
    step, steps_per_epoch = _step_seconds(config, setup, device)
    method_steps = _method_steps(prepared, device)
    validation, embed_per_image, width = _validation_seconds(config, setup, device)
    test_images = len(setup.full_splits.test)
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = _checkpoint_seconds(setup, Path(directory))
        run_overhead = _run_overhead(config, Path(directory), step, validation, checkpoint)
        unit, look, study = _storage_seconds(prepared, Path(directory))
    return Measured(
        startup=startup, setup=setup_seconds, step=step, steps_per_epoch=steps_per_epoch, validation=validation,
        checkpoint=checkpoint, run_overhead=run_overhead, embed_per_image=embed_per_image,
        test_scoring=_scoring_seconds(config, test_images, len(prepared.layout.test_classes), width), unit=unit,
        look=look, study=study, report=_report_seconds(), statistics=_statistics_seconds(prepared),
        test_images=test_images, train_images=len(setup.splits.train),
        method_steps=method_steps,
    )


def _method_steps(prepared: Prepared, device: Any) -> dict[str, float]:
    """The step of every method after the first whose training differs from the first's (loss,
    miner, sampler, optimiser, model), on the first fold with the method's default parameters."""
    from dmlbench.training.setup import set_up_training

    (first, *others) = prepared.plans.values()
    seen = {_training_identity(first.run_config({}, prepared.layout.folds[0]))}
    steps = {}
    for plan in others:
        config = plan.run_config({}, prepared.layout.folds[0])
        if (identity := _training_identity(config)) in seen:
            continue
        seen.add(identity)
        steps[plan.name] = _step_seconds(config, set_up_training(config, device), device)[0]
    return steps


def _training_identity(config: Any) -> str:
    """What sets a step's cost, less the seed (methods often differ only by their seeds)."""
    dumped = config.model_dump(mode="json")
    return repr([dumped.get(key) for key in ("loss", "miner", "sampler", "optimizer", "model", "training")])


def _step_seconds(config: Any, setup: Any, device: Any) -> tuple[float, int]:
    """The median seconds of a training step after the warm-up, and the steps of an epoch."""
    from dmlbench.training.loop import ImageBatches, time_steps

    steps_per_epoch = len(setup.sampler)
    if config.training.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, config.training.max_steps_per_epoch)
    timings = time_steps(config, ImageBatches(config, setup), device, WARMUP_STEPS + TIMED_STEPS)
    timed = timings[WARMUP_STEPS:] or timings
    return (statistics.median(timed) if timed else 0.0), steps_per_epoch


def _validation_seconds(config: Any, setup: Any, device: Any) -> tuple[float, float, int]:
    """Seconds of a warm validation pass (embedding and scoring), seconds to embed one image, and the
    embedding's width."""
    from dmlbench.evaluation import evaluate
    from dmlbench.training.embed import embed

    model, validation_set, batch_size = setup.components.model, setup.validation_set, config.evaluation.batch_size
    embed(model, validation_set, batch_size, device)  # warm-up: the first pass at the evaluation's batch shapes
    started = time.perf_counter()
    embeddings, labels = embed(model, validation_set, batch_size, device)
    embedded = time.perf_counter()
    evaluate(embeddings, labels, metrics=config.evaluation.metrics, seed=config.seed, rerank=config.evaluation.rerank.method())
    scored = time.perf_counter()
    return scored - started, (embedded - started) / max(len(validation_set), 1), int(embeddings.shape[1])


def _scoring_seconds(config: Any, images: int, classes: int, width: int) -> float:
    """Seconds to score a test split of ``images`` images of ``classes`` classes, timed on random unit
    vectors (the test data itself is opened only by the reproductions)."""
    import torch

    from dmlbench.evaluation import evaluate

    if images == 0:
        return 0.0
    generator = torch.Generator().manual_seed(config.seed)
    embeddings = torch.nn.functional.normalize(torch.randn(images, width, generator=generator), dim=1)
    labels = torch.arange(images) % max(classes, 1)
    started = time.perf_counter()
    evaluate(embeddings, labels, metrics=config.evaluation.metrics, seed=config.seed)
    if config.evaluation.rerank.kind != "none":  # the test split is scored raw and re-ranked
        evaluate(embeddings, labels, metrics=config.evaluation.metrics, seed=config.seed, rerank=config.evaluation.rerank.method())
    return time.perf_counter() - started


def _checkpoint_seconds(setup: Any, directory: Path) -> float:
    """Seconds to write one checkpoint of the run's model, loss and optimiser (every epoch writes one)."""
    from dmlbench import files

    components = setup.components
    payload = {"model": components.model.state_dict(), "loss": components.loss.state_dict(),
               "optimizer": components.optimizer.state_dict()}
    started = time.perf_counter()
    files.atomic_torch_save(directory / "checkpoint.pt", payload)
    return time.perf_counter() - started


def _run_overhead(config: Any, directory: Path, step: float, validation: float, checkpoint: float) -> float:
    """Seconds a run costs besides its steps, validation passes and checkpoints (set-up, records,
    provenance): a real run of one step (untracked), less those pieces."""
    from dmlbench import config as config_module
    from dmlbench.training import train

    one_step = config_module.from_dict(config_module.assign(config.model_dump(mode="json"), {
        "training.epochs": 1, "training.max_steps_per_epoch": 1, "training.early_stopping_patience": None,
        "tracking.backend": "none"}))
    started = time.perf_counter()
    train(one_step, directory / "run", progress=False)
    return max(time.perf_counter() - started - step - 2 * validation - 2 * checkpoint, 0.0)


def _storage_seconds(prepared: Prepared, directory: Path) -> tuple[float, float, float]:
    """Seconds of the storage's work, on a throw-away storage of the kind the benchmark's workers
    default to: one unit (claim it, record its start, heartbeat and end; the second of two, the first
    also creates the tables), a look at a finished study (a claim that finds nothing left) and
    opening a study."""
    from dmlbench.protocol import storage, work
    from dmlbench.protocol.units import claim_reproduction, open_unit_study

    worker = work.Worker(storage.default_url(directory, prepared.jobs))
    settings = replace(prepared.reproduction, reproductions=2)
    open_unit_study(worker, "tables", {"method": "tables"})
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
    return unit, time.perf_counter() - started, opening


def _statistics_seconds(prepared: Prepared) -> float:
    """Seconds of the report's statistics on random scores of the benchmark's methods and
    reproductions (the scores' values do not change the work): every pair of methods per mode and
    metric, the declared comparisons at half, once and twice the margin, and their power."""
    import warnings

    import numpy as np

    from dmlbench.protocol.power import comparison_power, comparisons_of
    from dmlbench.protocol.results import MODES
    from dmlbench.protocol.statistics import compare_methods, compare_pairs

    protocol, margin = prepared.spec.protocol, prepared.spec.analysis.equivalence_margin
    metrics = next(iter(prepared.configs.values())).evaluation.metrics
    generator = np.random.default_rng(0)
    scores = {name: dict(enumerate(generator.random(protocol.reproductions).tolist())) for name in prepared.plans}
    declared = comparisons_of(prepared.spec)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(len(MODES) * len(metrics)):
            compare_methods(scores, margin)
        for factor in (0.5, 1.0, 2.0):
            compare_pairs(scores, declared, factor * margin)
        for a, b in declared:
            comparison_power(a, b, protocol.reproductions, 0.01, margin, len(declared), 0.05)
    return time.perf_counter() - started


def _report_seconds() -> float:
    """Seconds to draw the report's figures: pyplot's import (once) and ``REPORT_FIGURES`` figures of
    two panels of a few lines (the report's have one to four), saved as PNG as the report saves them."""
    import io

    started = time.perf_counter()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    for _ in range(REPORT_FIGURES):
        figure, panels = pyplot.subplots(1, 2, figsize=(9, 4))
        for axes in panels:
            for line in range(5):
                axes.plot(range(10), [line + step / 10 for step in range(10)], marker="o", label=f"method {line}")
            axes.legend()
        figure.savefig(io.BytesIO(), format="png", dpi=80)
        pyplot.close(figure)
    return time.perf_counter() - started


def _other_steps(measured: Measured) -> str:
    """The other methods' steps, for the dry run's line: ``; per method: name 0.123 s, ...``."""
    if not measured.method_steps:
        return ""
    return "; the others: " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in measured.method_steps.items())


def _hours(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min {seconds % 60:02d} s"
