"""Issue 49's figures for a GPU, each against its anchor measured in the same run.

1. **Training steps.** One step is what ``dmlbench train`` does per batch (``training.loop.Stepper``:
   autocast, channels_last for a convolutional trunk on CUDA; the loss through
   ``training.step.batch_loss``; ``backward``; ``apply_gradients``) on a batch of random images already
   on the device, for each dmlbench setting in ``--modes``: ``default`` (the config's defaults:
   ``training.precision: auto``, deterministic kernels), ``fp32``, ``bf16``, ``fast``
   (``training.deterministic: false``), each also ``+compile`` (``training.compile``). The anchor is a
   plain PyTorch loop over the same network, loss, batch and precision tuned as practitioners tune it
   (autocast, channels_last, ``cudnn.benchmark``, TF32, no deterministic algorithms), eager and
   compiled. Images/s are the median over ``--steps`` timed steps after ``--warmup`` untimed ones (a
   compiled mode compiles in its first steps).
2. **``dmlbench train``** on glyphs of the CUB-shaped workload's size (``--classes`` classes,
   ``--augmentations`` variants per font, ``--image-size`` px; ``configs/cub_shaped_glyphs.yaml``) for
   ``--epochs`` epochs with the default settings: the epochs' images/s against the default step's,
   and how busy the GPU was (NVML's utilisation sampled every 0.1 s, through ``torch.cuda.utilization``
   or ``nvidia-smi``) during the epochs and during the whole command.
3. **Exact evaluation** of ``--n`` x 128 synthetic embeddings on the device
   (``dmlbench.evaluation.evaluate`` with the embeddings on it: precision@1, R-precision, MAP@R)
   against the float32 ``N x N`` products on that device (the floor of any exact search; the symmetric
   search computes half of them); with ``--check N`` also the CPU path on N embeddings, which must
   give the same neighbour ids and the same metrics (to 1e-6).

They run in the order 1, 3, 2 (under a time limit the train's data generation is what may not fit).
The last lines compare every figure with its target in issue 49 (met / missed; on a CPU they are
shown but are no targets).

    python benchmarks/gpu.py                              # CUDA: ResNet-50 at 224 px, batch 256, N = 1,000,000
    python benchmarks/gpu.py --device cpu --trunk small_cnn --image-size 16 --batch-size 8 --steps 2 \\
        --modes default,fast --classes 24 --augmentations 0 --epochs 1 --n 2000 --check 500
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from dmlbench import config as config_module
from dmlbench import losses, models
from dmlbench.evaluation.knn_index import float32_products
from dmlbench.training import loop, records, train
from dmlbench.training.acceleration import AUTOCAST_DTYPES, resolve_precision
from dmlbench.training.placement import resolve_device
from dmlbench.training.setup import build_components
from dmlbench.training.step import apply_gradients, backward, batch_loss

MODES = ("default", "fp32", "bf16", "fast", "default+compile", "fast+compile")
METRICS = ["precision_at_1", "r_precision", "map_at_r"]
# dmlbench mode -> its config overrides.
MODE_OVERRIDES = {"default": [], "fp32": ["training.precision=fp32"], "bf16": ["training.precision=bf16"],
                  "fast": ["training.deterministic=false"]}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_images_per_second(step: object, args: argparse.Namespace, device: torch.device) -> float:
    """Images/s of ``step()`` (one training step), the median over the timed steps."""
    durations = []
    for index in range(args.warmup + args.steps):
        synchronize(device)
        started = time.perf_counter()
        step()  # type: ignore[operator]
        synchronize(device)
        if index >= args.warmup:
            durations.append(time.perf_counter() - started)
    return args.batch_size / statistics.median(durations)


def random_batch(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random images for every line, and labels of 4 images per class."""
    generator = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.batch_size, args.channels, args.image_size, args.image_size, generator=generator)
    return images.to(device), torch.arange(args.batch_size).div(4, rounding_mode="floor").to(device)


def run_config(args: argparse.Namespace, *overrides: str) -> config_module.Config:
    """A run config of the measured network, loss and batch on ``--device``, plus ``overrides``."""
    return config_module.load(None, [
        f"model.trunk={args.trunk}", f"model.embedding_dim={args.embedding_dim}",
        f"model.options={{in_channels: {args.channels}}}", f"loss.name={args.loss}", "optimizer.name=adamw",
        "optimizer.lr=0.00001", f"training.batch_size={args.batch_size}", f"training.device={args.device}",
        "evaluation.metrics=[precision_at_1, r_precision, map_at_r]", *overrides,
    ])


def dmlbench_step(mode: str, args: argparse.Namespace, device: torch.device) -> float:
    """Images/s of dmlbench's own training step in ``mode`` (see the module docstring)."""
    setting, _, compiled = mode.partition("+")
    config = run_config(args, *MODE_OVERRIDES[setting], f"training.compile={bool(compiled)}".lower())
    components = build_components(config, args.batch_size // 4, device)
    stepper = loop.Stepper(config, components, device, loop.ProcessGroup())
    stepper.begin_epoch(1)
    images, labels = random_batch(args, device)

    def step() -> None:
        embeddings = stepper.forward(images).float()
        backward(batch_loss(components.loss, components.miner, embeddings, labels, epoch=1, step=1), stepper.scaler, 1)
        apply_gradients(components.optimizer, stepper.scaler)

    return median_images_per_second(step, args, device)


def tuned_step(compiled: bool, precision: str, args: argparse.Namespace, device: torch.device) -> float:
    """Images/s of the anchor: a plain PyTorch loop over the same network and loss, tuned by hand."""
    if device.type == "cuda":
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    model = models.build(args.trunk, embedding_dim=args.embedding_dim, seed=args.seed, in_channels=args.channels)
    model = model.to(device, memory_format=layout).train()
    loss = losses.build(args.loss).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    forward = torch.compile(model) if compiled else model
    images, labels = random_batch(args, device)
    images = images.contiguous(memory_format=layout)
    dtype = AUTOCAST_DTYPES.get(precision)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            embeddings = forward(images)
        optimizer.zero_grad(set_to_none=True)
        loss(embeddings.float(), labels).backward()
        optimizer.step()

    return median_images_per_second(step, args, device)


class BusySampler:
    """The GPU's utilisation (percent of time a kernel ran, NVML) every ``period`` seconds, in a thread."""

    def __init__(self, device: torch.device, period: float = 0.1) -> None:
        self.device, self.period, self.samples = device, period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:  # noqa: BLE001 (no pynvml): ask nvidia-smi instead
            if shutil.which("nvidia-smi") is None:
                return None
            index = self.device.index or 0
            output = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu",
                                     "--format=csv,noheader,nounits"], capture_output=True, text=True, check=False)
            return float(output.stdout.strip()) if output.returncode == 0 and output.stdout.strip() else None

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.read()
            if value is not None:
                self.samples.append((time.perf_counter(), value))
            self._stop.wait(self.period)

    def __enter__(self) -> BusySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, windows: list[tuple[float, float]] | None = None) -> float | None:
        """Mean utilisation over the samples (within ``windows`` when given)."""
        values = [value for at, value in self.samples
                  if windows is None or any(start <= at <= stop for start, stop in windows)]
        return statistics.fmean(values) if values else None


@contextlib.contextmanager
def epoch_windows() -> object:
    """Record when each of ``training.loop``'s epochs starts and ends (validation excluded)."""
    windows: list[tuple[float, float]] = []
    original = loop._train_epoch

    def timed(*arguments: object, **options: object) -> object:
        started = time.perf_counter()
        try:
            return original(*arguments, **options)
        finally:
            windows.append((started, time.perf_counter()))

    loop._train_epoch = timed
    try:
        yield windows
    finally:
        loop._train_epoch = original


def train_figures(args: argparse.Namespace, device: torch.device) -> dict[str, float | None]:
    """``dmlbench train`` on CUB-shaped glyphs: the epochs' images/s, GPU busy during them and overall."""
    config = run_config(args, "data.name=glyphs", f"training.epochs={args.epochs}",
                        f"data.options={{image_size: {args.image_size}, augmentations_per_font: {args.augmentations}, "
                        f"max_classes: {args.classes}}}", "sampler.name=spc")
    with tempfile.TemporaryDirectory() as directory, BusySampler(device) as sampler, epoch_windows() as windows:
        started = time.perf_counter()
        train(config, Path(directory) / "run", progress=False)
        seconds = time.perf_counter() - started
        epochs = records.read_metrics(Path(directory) / "run")[1:]
        choices = json.loads((Path(directory) / "run" / records.RUN_FILE).read_text())["training_choices"]["acceleration"]
    # The first epoch pays cuDNN's and the allocator's first calls: left out when there are others.
    timed = epochs[1:] or epochs
    images_per_second = sum(entry["samples"] for entry in timed) / sum(entry["seconds"] for entry in timed)
    print(f"train     {args.epochs} epochs of {config.data.name} ({args.classes} classes), {choices}: "
          f"{images_per_second:9.1f} images/s in the epochs, {seconds:.1f} s in all")
    return {"images_per_second": images_per_second, "seconds": seconds,
            "busy_epochs": sampler.busy(windows[1:] or windows) if device.type == "cuda" else None,
            "busy_all": sampler.busy() if device.type == "cuda" else None}


def products_floor(embeddings: torch.Tensor, device: torch.device, tile: int = 8192, sampled: int = 4) -> float:
    """Seconds of the ``N x N`` float32 products on ``device`` (TF32 off), timed on ``sampled`` query tiles
    after one untimed one and scaled to all ``N`` queries."""
    rows = embeddings.to(device, torch.float32)

    def products(queries: torch.Tensor) -> None:
        for start in range(0, len(rows), tile):
            torch.mm(queries, rows[start:start + tile].T)

    with float32_products():
        products(rows[:tile])
        synchronize(device)
        started = time.perf_counter()
        count = min(len(rows), sampled * tile)
        for first in range(0, count, tile):
            products(rows[first:first + tile])
        synchronize(device)
    return (time.perf_counter() - started) * len(rows) / count


def evaluation_figures(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Seconds of ``evaluate`` on ``--n`` embeddings on ``device``, the products' floor, and the check."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from evaluation import make_data

    from dmlbench.evaluation import evaluate

    embeddings, labels = make_data(args.n, args.embedding_dim, 5, args.seed)
    on_device = torch.from_numpy(embeddings).to(device)
    evaluate(on_device[:2000], labels[:2000], metrics=METRICS)  # the first call's start-up (cuBLAS, kernels)
    synchronize(device)
    started = time.perf_counter()
    values = evaluate(on_device, labels, metrics=METRICS)
    synchronize(device)
    seconds = time.perf_counter() - started
    floor = products_floor(on_device, device)
    print(f"evaluation of N={args.n:,} x {args.embedding_dim} on {device.type}: {seconds:.2f} s "
          f"({seconds / floor:.2f}x the float32 N x N products' {floor:.2f} s); "
          + ", ".join(f"{name} {values[name]:.6f}" for name in METRICS))
    figures = {"seconds": seconds, "floor": floor}
    if args.check:
        figures["check_difference"] = check_against_cpu(embeddings[: args.check], labels[: args.check], device)
    return figures


def check_against_cpu(embeddings: object, labels: object, device: torch.device) -> float:
    """The device's neighbours and metrics against the CPU path's; returns the largest metric difference."""
    from dmlbench.evaluation import evaluate
    from dmlbench.evaluation.knn_index import prepare
    from dmlbench.evaluation.neighbors import nearest_neighbors

    cpu_rows = torch.from_numpy(embeddings).to(torch.float64)  # type: ignore[arg-type]
    everyone = torch.arange(len(cpu_rows))
    found = {}
    for where in (torch.device("cpu"), device):
        space = prepare(cpu_rows.to(where), normalize=True, binarize=False)
        found[where.type] = nearest_neighbors(space, everyone, everyone, 10, exclude_self=True).ids.cpu()
    same_ids = bool(torch.equal(found["cpu"], found[device.type]))
    cpu_values = evaluate(cpu_rows, labels, metrics=METRICS)
    device_values = evaluate(cpu_rows.to(device), labels, metrics=METRICS)
    difference = max(abs(cpu_values[name] - device_values[name]) for name in METRICS)
    print(f"check on N={len(cpu_rows):,}: the 10 nearest neighbours {'identical' if same_ids else 'DIFFERENT'} "
          f"on {device.type} and the CPU; largest metric difference {difference:.1e}")
    return difference if same_ids else float("inf")


def print_targets(steps: dict[str, float], anchors: dict[str, float], trained: dict, evaluated: dict,
                  args: argparse.Namespace, device: torch.device) -> None:
    """Each figure beside its target in issue 49 (met / missed on a GPU)."""
    suffix = "" if device.type == "cuda" else " (CPU: not a target)"

    def line(name: str, value: float | None, target: float, at_most: bool = False) -> None:
        if value is None:
            print(f"target {name}: not measured{suffix}")
            return
        met = value <= target if at_most else value >= target
        sign = "<=" if at_most else ">="
        print(f"target {name} {sign} {target:g}: {value:.2f} {'met' if met else 'MISSED'}{suffix}")

    for mode, compiled in (("fast", ""), ("fast+compile", "+compile"), ("default", ""), ("default+compile", "+compile")):
        if mode in steps and f"tuned{compiled}" in anchors:
            goal = 0.9 if mode.startswith("fast") else 0.6
            line(f"step {mode} / tuned loop{compiled} (batch {args.batch_size})", steps[mode] / anchors[f"tuned{compiled}"], goal)
    if trained and "default" in steps:
        line("train epochs / default step", trained["images_per_second"] / steps["default"], 0.85)
        line("GPU busy in the epochs (%)", trained["busy_epochs"], 80)
    if evaluated:
        line(f"evaluation of N={args.n:,} (s)", evaluated["seconds"], 5, at_most=True)
        if "check_difference" in evaluated:
            line("device metrics - CPU metrics (ids identical)", evaluated["check_difference"], 1e-6, at_most=True)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--trunk", default="resnet50")
    parser.add_argument("--channels", type=int, default=1, help="image channels (1: the glyphs' grey images)")
    parser.add_argument("--loss", default="multi_similarity")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    parser.add_argument("--classes", type=int, default=200, help="glyph classes of the train (0: skip it)")
    parser.add_argument("--augmentations", type=int, default=3, help="augmented variants per font and class")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--n", type=int, default=1_000_000, help="embeddings evaluated (0: skip)")
    parser.add_argument("--check", type=int, default=100_000, help="embeddings compared with the CPU path (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    unknown = sorted(set(args.modes.split(",")) - set(MODES))
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r}; choose from {', '.join(MODES)}")
    return args


def main() -> None:
    args = parse_arguments()
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; this script is for a GPU (--device cpu runs it at tiny sizes)")
    device = resolve_device(args.device)
    precision = resolve_precision("auto", device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}; {args.trunk} at {args.image_size} px, "
          f"batch {args.batch_size}, loss {args.loss}, precision auto = {precision}")
    steps, anchors = {}, {}
    for mode in args.modes.split(","):
        steps[mode] = dmlbench_step(mode, args, device)
        print(f"dmlbench  {mode:16s} {steps[mode]:9.1f} images/s")
    for compiled in (False, True):
        if any(mode.endswith("+compile") == compiled for mode in steps):
            key = "tuned+compile" if compiled else "tuned"
            anchors[key] = tuned_step(compiled, precision, args, device)
            print(f"anchor    {key:16s} {anchors[key]:9.1f} images/s (plain PyTorch, {precision}, channels_last on CUDA, "
                  "cudnn.benchmark, TF32)")
    resolve_device(args.device)  # dmlbench's deterministic set-up again, after the anchor's
    evaluated = evaluation_figures(args, device) if args.n else {}
    trained = train_figures(args, device) if args.classes else {}
    print_targets(steps, anchors, trained, evaluated, args, device)


if __name__ == "__main__":
    main()
