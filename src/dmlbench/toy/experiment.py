"""The 2-D rho-regularisation toy experiment of Roth et al. 2020 (Fig. 6; supp. G, Fig. 12).

Settings from supp. G: a fully-connected network with two hidden layers of 30 units, 2-D input,
2-D embedding L2-normalised onto the unit circle; four training and four test lines of 15 points
(``dmlbench.toy.lines``; the points are drawn along the lines anew for every seed); 200
iterations, batch size 24, learning rate 0.03, the contrastive loss of supp. eq. 1
(``dmlbench.losses.build("contrastive", margin=0.1)``); the regularised model switches negatives
with ``p_switch = 0.001`` (``dmlbench.mining.base.RhoRegularizedMiner``).

Choices where the paper is silent (the same for every model):

* network: ``Linear(2, 30) - ReLU - Linear(30, 30) - ReLU - Linear(30, 2)``, then L2
  normalisation; weights and biases drawn U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's default
  range) from the seed's generator. All models of a variant are trained together as one stack of
  independent networks (``ToyNets``), which changes nothing but the speed;
* optimiser: Adam (the optimiser of the paper's benchmark training, supp. A), lr 0.03, no weight decay;
* batches: SPC-6 (``dmlbench.sampling`` ``spc``, 4 classes x 6 points = 24): every batch holds
  all four training classes; 2 batches per epoch, 100 epochs = 200 iterations;
* pairs: the ``random`` miner, one random positive and one random negative per anchor (24
  triplets, i.e. 24 positive and 24 negative pairs per batch); the contrastive loss averages over
  these 48 pairs. The regularised model wraps the same miner in ``RhoRegularizedMiner``: with
  probability ``p_switch`` per triplet, ``(a, p, n)`` becomes ``(a, a, s)`` with ``s`` a random
  classmate of ``a``, so the loss pushes ``s`` away from ``a`` when they are closer than the margin;
* pairing of the models: for one seed, both models start from the same weights, see the same
  batches and draw the same random tuples (the inner miner has its own generator; the switch coins
  come from a separate one), so a switched tuple is the only difference between them;
* rho: ``dmlbench.evaluation.embedding_space.analyze`` on the embedded training data with
  ``drop=0`` (no centering). With a 2-D embedding the library's default ``drop=1`` leaves a single
  singular value and rho would be 0 for every model; with ``drop=0``,
  rho = KL(U_2 || s / sum s) is 0 for a round spectrum and grows as the embedding collapses onto
  one direction;
* Recall@1: ``dmlbench.evaluation.evaluate`` on the 60 embedded test points (every test point is
  a query against the other 59; ties ordered by index);
* statistics: mean over seeds and the 95% Student-t interval ``mean +- t_{0.975, n-1} s / sqrt n``
  (``scipy.stats.t``), per model and for the per-seed difference regularised - plain.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dmlbench import losses, mining, sampling
from dmlbench.errors import UserInputError
from dmlbench.evaluation import embedding_space, evaluate
from dmlbench.files import atomic_write
from dmlbench.mining.base import RhoRegularizedMiner
from dmlbench.sampling.base import derived_generator
from dmlbench.toy.lines import VARIANTS, LineData, check_variant, make_lines
from dmlbench.toy.plot import write_figure
from dmlbench.toy.results import DEFAULT_P_SWITCH, DEFAULT_SEEDS, ITERATIONS, ModelRun, ToyResult, ToySettings
from dmlbench.training.step import apply_gradients
from dmlbench.validation import check_probability

JSON_FILE = "toy.json"
FIGURE_FILE = "toy.png"

SWEEP = (0.0, 0.001, 0.01, 0.1, 0.3)
BATCH_SIZE = 24
SAMPLES_PER_CLASS = 6
LEARNING_RATE = 0.03
MARGIN = 0.1
HIDDEN = 30
DROP = 0  # singular values left out of rho; see the module docstring
CONFIDENCE = 0.95


def parse_p_switches(text: str) -> tuple[float, ...]:
    """``"0.001"`` or a comma list ``"0,0.001,0.01"``; each value must lie in [0, 1]."""
    values = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise UserInputError(f"p_switch must be a number or a comma list of numbers in [0, 1], got {part!r}") from None
        values.append(check_probability("p_switch", value))
    return tuple(values)


def parse_variants(text: str) -> tuple[str, ...]:
    """``"both"`` (or ``"all"``), ``"diagonal"``, ``"axes"`` or a comma list of variants."""
    if text.strip() in ("both", "all"):
        return VARIANTS
    return tuple(check_variant(part.strip()) for part in text.split(","))


class ToyNets(nn.Module):
    """``count`` independent networks ``Linear(2, 30) - ReLU - Linear(30, 30) - ReLU - Linear(30, 2)``
    with L2-normalised output, evaluated together by batched matrix products.

    Network ``k`` draws its weights (as ``nn.Linear``'s ``[out, in]`` matrix) and biases
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), layer by layer, from ``generators[k]`` alone. Training the
    stack with the sum of the per-network losses and Adam is training each network on its own:
    a network's loss reaches only its own slice of the parameters, and Adam works element by
    element. Stacking only saves the per-operation overhead of many tiny networks.
    """

    def __init__(self, generators: Sequence[torch.Generator], hidden: int = HIDDEN) -> None:
        super().__init__()
        self.sizes = ((2, hidden), (hidden, hidden), (hidden, 2))
        count = len(generators)
        weights = [torch.empty(count, fan_in, fan_out) for fan_in, fan_out in self.sizes]
        biases = [torch.empty(count, 1, fan_out) for _, fan_out in self.sizes]
        for k, generator in enumerate(generators):
            for layer, (fan_in, fan_out) in enumerate(self.sizes):
                bound = 1.0 / math.sqrt(fan_in)
                weights[layer][k] = torch.empty(fan_out, fan_in).uniform_(-bound, bound, generator=generator).T
                biases[layer][k, 0] = torch.empty(fan_out).uniform_(-bound, bound, generator=generator)
        self.weights = nn.ParameterList(weights)
        self.biases = nn.ParameterList(biases)

    def forward(self, points: Tensor) -> Tensor:
        """``points [count, n, 2]`` -> embeddings ``[count, n, 2]`` on the unit circle."""
        hidden = points
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            hidden = torch.baddbmm(bias, hidden, weight)
            if layer < len(self.sizes) - 1:
                hidden = hidden.relu()
        return nn.functional.normalize(hidden, dim=2)


def data_generator(seed: int) -> torch.Generator:
    """The generator that places the points of seed ``seed`` on the lines (the same for every model)."""
    return derived_generator(seed, 3)


def batch_schedule(labels: Tensor, seed: int, iterations: int) -> Tensor:
    """The training batches ``[iterations, 24]`` of seed ``seed``: SPC-6 batches, epoch after epoch."""
    sampler = sampling.build("spc", labels=labels, batch_size=BATCH_SIZE, samples_per_class=SAMPLES_PER_CLASS, seed=seed)
    batches: list[list[int]] = []
    epoch = 0
    while len(batches) < iterations:
        sampler.set_epoch(epoch)
        batches.extend(sampler)
        epoch += 1
    return torch.tensor(batches[:iterations])


def train_model(data: LineData, seed: int, p_switch: float, iterations: int = ITERATIONS) -> ModelRun:
    """Train one toy model; ``p_switch = 0`` is the plain model. Deterministic in ``(data, seed, p_switch)``."""
    return train_models([(data, seed, p_switch)], iterations)[0]


def train_models(jobs: Sequence[tuple[LineData, int, float]], iterations: int = ITERATIONS) -> list[ModelRun]:
    """Train one model per ``(data, seed, p_switch)`` job, all at once (see ``ToyNets``).

    A model's randomness comes from its seed alone: initial weights ``derived_generator(seed, 0)``,
    batches ``batch_schedule(..., seed)``, random tuples ``derived_generator(seed, 1)``, switch
    coins and classmates ``derived_generator(seed, 2)``; ``p_switch = 0`` is the plain model.
    """
    for _, _, p_switch in jobs:
        check_probability("p_switch", p_switch)
    count = len(jobs)
    nets = ToyNets([derived_generator(seed, 0) for _, seed, _ in jobs])
    optimizer = torch.optim.Adam(nets.parameters(), lr=LEARNING_RATE)
    loss_fn = losses.build("contrastive", margin=MARGIN)
    miners: list[mining.Miner] = []
    for _, seed, p_switch in jobs:
        miner: mining.Miner = mining.build("random", generator=derived_generator(seed, 1))
        miners.append(RhoRegularizedMiner(miner, p_switch, generator=derived_generator(seed, 2)) if p_switch > 0 else miner)
    schedules: dict[tuple[int, int], Tensor] = {}
    for data, seed, _ in jobs:
        if (id(data), seed) not in schedules:
            schedules[(id(data), seed)] = batch_schedule(data.train_labels, seed, iterations)
    schedule = torch.stack([schedules[(id(data), seed)] for data, seed, _ in jobs], dim=1)  # [iterations, count, 24]
    train_points = torch.stack([data.train_points for data, _, _ in jobs])
    train_labels = torch.stack([data.train_labels for data, _, _ in jobs])
    rows = torch.arange(count).unsqueeze(1)
    switched = [0] * count
    final_losses = [0.0] * count
    for step in range(iterations):
        index = schedule[step]
        labels = train_labels[rows, index]
        embeddings = nets(train_points[rows, index])
        step_losses = []
        for k in range(count):
            tuples = miners[k](embeddings[k], labels[k])
            # a switched triplet is (a, a, s); the random miner never draws the anchor as its positive
            switched[k] += int((tuples.positives == tuples.anchors).sum())
            step_losses.append(loss_fn(embeddings[k], labels[k], tuples))
        torch.stack(step_losses).sum().backward()
        apply_gradients(optimizer)  # the training loop's optimiser step (it clears the gradients after it)
        final_losses = [float(loss.detach()) for loss in step_losses]
    with torch.no_grad():
        train_embeddings = nets(train_points)
        test_embeddings = nets(torch.stack([data.test_points for data, _, _ in jobs]))
    runs = []
    for k, (data, seed, p_switch) in enumerate(jobs):
        analysis = embedding_space.analyze(train_embeddings[k], data.train_labels, drop=DROP)
        recall = evaluate(test_embeddings[k], data.test_labels, metrics=["recall_at_1"])["recall_at_1"]
        runs.append(ModelRun(
            p_switch=p_switch,
            seed=seed,
            data=data,
            train_embeddings=train_embeddings[k].clone(),
            test_embeddings=test_embeddings[k].clone(),
            rho=float(analysis["rho"]),
            singular_values=[float(v) for v in analysis["singular_values"]],
            recall_at_1=float(recall),
            switched_tuples=switched[k],
            final_loss=final_losses[k],
        ))
    return runs


def interval(values: Sequence[float]) -> dict[str, Any]:
    """Per-seed values, their mean and the 95% Student-t interval (scipy.stats.t)."""
    from scipy import stats

    array = np.asarray(values, dtype=np.float64)
    if len(array) < 2:
        raise UserInputError("a 95% interval needs at least two seeds")
    mean = float(array.mean())
    spread = float(array.std(ddof=1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(array) - 1)) * spread / math.sqrt(len(array))
    return {"per_seed": [float(v) for v in array], "mean": mean, "ci95": [mean - half, mean + half]}


def _model_name(p_switch: float) -> str:
    return "plain" if p_switch == 0 else f"rho_p{p_switch:g}"


def summarize(result: ToyResult) -> dict[str, Any]:
    """The content of ``toy.json`` (documented in ``dmlbench.toy``)."""
    settings = result.settings
    variants: dict[str, Any] = {}
    for variant, by_p in result.runs.items():
        models = []
        for p_switch, runs in by_p.items():
            models.append({
                "name": _model_name(p_switch),
                "p_switch": p_switch,
                "rho": interval([run.rho for run in runs]),
                "recall_at_1": interval([run.recall_at_1 for run in runs]),
                "switched_tuples": [run.switched_tuples for run in runs],
                "singular_values": [run.singular_values for run in runs],
            })
        plain = by_p[0.0]
        differences = []
        for p_switch, runs in by_p.items():
            if p_switch == 0:
                continue
            differences.append({
                "name": f"{_model_name(p_switch)} - plain",
                "p_switch": p_switch,
                "rho": interval([run.rho - base.rho for run, base in zip(runs, plain)]),
                "recall_at_1": interval([run.recall_at_1 - base.recall_at_1 for run, base in zip(runs, plain)]),
            })
        variants[variant] = {"models": models, "differences": differences}
    return {
        "experiment": "rho-regularisation 2-D toy example, Roth et al. 2020 Fig. 6 / supp. G, Fig. 12",
        "settings": {
            "variants": list(settings.variants),
            "seeds": list(range(settings.seeds)),
            "p_switch": list(settings.models),
            "iterations": settings.iterations,
            "batch_size": BATCH_SIZE,
            "sampler": f"spc, {SAMPLES_PER_CLASS} samples per class",
            "learning_rate": LEARNING_RATE,
            "optimizer": "adam",
            "loss": {"name": "contrastive", "margin": MARGIN},
            "miner": "random (one positive, one negative per anchor)",
            "network": f"2-{HIDDEN}-{HIDDEN}-2 MLP, ReLU, L2-normalised output",
            "samples_per_line": 15,
            "rho": {"data": "training embeddings", "drop": DROP, "center": False},
            "recall_at_1": "test embeddings, query = reference",
            "interval": "95% Student-t over seeds (scipy.stats.t)",
        },
        "variants": variants,
    }


def run(
    output: Path | str,
    *,
    variants: Iterable[str] = VARIANTS,
    seeds: int = DEFAULT_SEEDS,
    p_switches: Iterable[float] = (DEFAULT_P_SWITCH,),
    iterations: int = ITERATIONS,
    figure: bool = True,
    progress: Any = None,
) -> ToyResult:
    """Train the plain and regularised models for every variant and seed; write ``toy.json`` and ``toy.png``.

    Every model draws its randomness from its seed alone (``derived_generator(seed, ...)``), so the
    same arguments give the same files. ``progress(message)`` is called after each variant when
    given. The figure is written first and the JSON last (both atomically), so a ``toy.json`` is
    always the record of a finished run.
    """
    settings = ToySettings(tuple(variants), seeds, tuple(p_switches), iterations)
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise UserInputError(f"output {output} exists and is not a directory")
    output.mkdir(parents=True, exist_ok=True)
    result = ToyResult(settings)
    for variant in settings.variants:
        jobs = []
        for seed in range(settings.seeds):
            data = make_lines(variant, data_generator(seed))
            jobs.extend((data, seed, p_switch) for p_switch in settings.models)
        by_p: dict[float, list[ModelRun]] = {p: [] for p in settings.models}
        for model in train_models(jobs, iterations):  # seed by seed, each seed's models in order
            by_p[model.p_switch].append(model)
        result.runs[variant] = by_p
        if progress is not None:
            progress(f"{variant}: trained {len(settings.models)} model(s) x {settings.seeds} seeds")
    result.summary = summarize(result)
    if figure:
        write_figure(result, output / FIGURE_FILE)
    text = json.dumps(result.summary, indent=2) + "\n"
    atomic_write(output / JSON_FILE, lambda stream: stream.write(text.encode()))
    return result


def format_summary(summary: dict[str, Any]) -> str:
    """The terminal table: per variant and model, mean and 95% interval of rho and test Recall@1."""
    header = ["variant", "model", "p_switch", "rho (train)", "Recall@1 (test)", "switches/run"]
    rows = []

    def cell(stats: dict[str, Any], digits: int) -> str:
        low, high = stats["ci95"]
        return f"{stats['mean']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"

    for variant, entry in summary["variants"].items():
        for model in entry["models"]:
            switches = np.mean(model["switched_tuples"])
            rows.append([variant, model["name"], f"{model['p_switch']:g}", cell(model["rho"], 4),
                         cell(model["recall_at_1"], 3), f"{switches:.1f}"])
        for difference in entry["differences"]:
            rows.append([variant, "  " + difference["name"], f"{difference['p_switch']:g}",
                         cell(difference["rho"], 4), cell(difference["recall_at_1"], 3), ""])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    seeds = len(summary["settings"]["seeds"])
    lines.append(f"mean [95% t-interval] over {seeds} seeds; rows '- plain' are per-seed paired differences")
    return "\n".join(lines)


