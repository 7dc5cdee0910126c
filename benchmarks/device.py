"""``device``: the trainer against a hand-written loop on one device, eager and compiled.

Run ``python tools/benchmark.py --task device --device cuda`` on a GPU (``--device cpu``
measures the same on the CPU). Two models: the main job's ``ImageClassifier`` (shapes
images of several sizes, batch 32) and a ResNet-50-sized network written here (bottleneck
stages of 3, 4, 6, 3 blocks, 224 px, channels-last, bfloat16 autocast). For each, in one
run: steps/s of ``SimpleTrainer``/``AMPTrainer`` with DefaultTrainer's hooks and of a
hand-written loop doing the same work (same batches, already on the device; same optimizer,
schedule and precision), alternating; then the same with the model compiled; and the
host-device waits per step between writer periods, the trainer's and the model's apart.

Waits are counted by ``hooks.DeviceWaitCounter`` (torch's sync debug mode): a wait inside
the model's forward is the model's; every other wait between two period ends is the
trainer's (target: 0).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import os
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.measure import alternate, median
from benchmarks.report import log_to_file, print_table, target_text, verdict
from benchmarks.shapes import batches_of, mapped_samples, shapes_cfg
from benchmarks.train import solver_cfg
from trainkit.engine import AMPTrainer, SimpleTrainer, default_writers, hooks
from trainkit.modeling import build_model
from trainkit.modeling.compile import call_compiled, compile_model
from trainkit.solver import build_lr_scheduler, build_optimizer

WRITER_PERIOD = 20
_RATIO_TARGET = 1.02  # trainer time / hand-loop time on a GPU
_CPU_RATIO_TARGET = 1.03  # on the CPU, for steps of >= 5 ms
_WAITS_TARGET = 0.0  # trainer waits per step between writer periods


# ---- a ResNet-50-sized network ------------------------------------------------------------
class _Bottleneck(nn.Module):
    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * 4
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNet50Sized(nn.Module):
    """ResNet-50's layout (25.6 M parameters); a batch is ``(images, labels)`` on the device."""

    compiled_methods = ("network",)  # the compile seam (trainkit.modeling.compile)

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        in_channels = 64
        for width, depth, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for k in range(depth):
                blocks.append(_Bottleneck(in_channels, width, stride if k == 0 else 1))
                in_channels = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(in_channels, num_classes)

    def network(self, images: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of images (the tensor-in, tensor-out part)."""
        return self.head(self.blocks(self.stem(images)).mean(dim=(2, 3)))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
        images, labels = batch
        logits = call_compiled(self, "network", images)
        return {"loss_cls": F.cross_entropy(logits, labels)} if self.training else logits


# ---- cases --------------------------------------------------------------------------------
def _classifier_case(device: str, quick: bool) -> dict[str, Any]:
    cfg = shapes_cfg(batch_size=32)
    cfg.MODEL.DEVICE = device
    samples = mapped_samples("train", 32 * (1 if quick else 8), cfg)
    batches = [
        [{**s, "image": s["image"].to(device)} for s in batch] for batch in batches_of(samples, 32)
    ]

    def model(compiled: bool) -> nn.Module:
        # Compiled through the config, as a user would: the seam plus the padding plan.
        run_cfg = cfg.clone()
        run_cfg.MODEL.COMPILE.ENABLED = compiled
        run_cfg.OUTPUT_DIR = tempfile.mkdtemp(prefix="trainkit-bench-device-")
        torch.manual_seed(0)
        return build_model(run_cfg)

    return {
        "label": "ImageClassifier (main job: shapes, <= 64 px, batch 32, fp32)",
        "model": model,
        "batches": batches,
        "precision": None,
        "iters": 3 if quick else 300,
    }


def _resnet_case(device: str, quick: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    size, batch = (32, 2) if quick else (64, 8) if device == "cpu" else (224, 64)
    # bfloat16 convolutions are slow on CPUs without bfloat16 units: fp32 there.
    precision = torch.bfloat16 if device == "cuda" else None
    batches = [
        (
            torch.randn(batch, 3, size, size, generator=g)
            .to(device)
            .contiguous(memory_format=torch.channels_last),
            torch.randint(0, 1000, (batch,), generator=g).to(device),
        )
        for _ in range(4)
    ]

    def model(compiled: bool) -> nn.Module:
        torch.manual_seed(0)
        net = ResNet50Sized().to(device, memory_format=torch.channels_last)
        if compiled:
            compile_model(net)
        return net

    return {
        "label": f"ResNet-50-sized ({size} px, batch {batch}, "
        f"{'bfloat16 autocast' if precision else 'fp32'}, channels-last)",
        "model": model,
        "batches": batches,
        "precision": precision,
        # 100 steps on a GPU: a timed run also holds the trainer's start and end (hooks'
        # before/after_train, the writers' last write: ~9 ms measured on the CPU) and a
        # sync per writer period. Over 30 steps of ~24 ms (the H100 runs) that start and
        # end alone could be ~0.3 ms per step of the 1.3 ms the trainer added there.
        "iters": 2 if quick else (20 if device == "cpu" else 100),
    }


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _build_trainer(
    model: nn.Module, batches: list[Any], iters: int, precision: Any, out_dir: str
) -> SimpleTrainer:
    cfg = solver_cfg(iters)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    kwargs = {"gather_metric_period": WRITER_PERIOD, "record_every_step": True}
    if precision is None:
        trainer: SimpleTrainer = SimpleTrainer(model, itertools.cycle(batches), optimizer, **kwargs)
    else:
        trainer = AMPTrainer(
            model, itertools.cycle(batches), optimizer, precision=precision, **kwargs
        )
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(optimizer, scheduler),
            hooks.PeriodicWriter(default_writers(out_dir, iters), period=WRITER_PERIOD),
        ]
    )
    return trainer


def _run_trainer(case: dict[str, Any], model: nn.Module, device: str, out_dir: str) -> float:
    trainer = _build_trainer(model, case["batches"], case["iters"], case["precision"], out_dir)
    _sync(device)
    start = time.perf_counter()
    trainer.train(0, case["iters"])
    _sync(device)
    return (time.perf_counter() - start) / case["iters"]


def _run_plain(case: dict[str, Any], model: nn.Module, device: str) -> float:
    """The same work by hand: batch, forward (autocast), backward, step, LR step."""
    iters, precision = case["iters"], case["precision"]
    cfg = solver_cfg(iters)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    data = iter(itertools.cycle(case["batches"]))
    model.train()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        context = (
            torch.autocast(device_type=device, dtype=precision)
            if precision is not None
            else contextlib.nullcontext()
        )
        with context:
            loss_dict = model(next(data))
        optimizer.zero_grad()
        sum(loss_dict.values()).backward()
        optimizer.step()
        scheduler.step()
    _sync(device)
    return (time.perf_counter() - start) / iters


def _time_pair(
    case: dict[str, Any], template: nn.Module, device: str, rounds: int
) -> dict[str, list[float]]:

    def fresh() -> nn.Module:
        # A compiled model is reused (recompiling each round would time the compiler);
        # its weights are reset from a copy so every run starts from the same state.
        model = template
        model.load_state_dict(initial)
        return model

    initial = copy.deepcopy(template.state_dict())
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-device-") as out_dir:
        counter = itertools.count()
        with log_to_file(os.path.join(out_dir, "log.txt")):
            warm = dict(case, iters=min(case["iters"], 20))
            _run_plain(warm, fresh(), device)  # warm-up: kernels, allocator, compiled graphs
            _run_trainer(warm, fresh(), device, os.path.join(out_dir, "warm"))
            return alternate(
                {
                    "trainkit": lambda: _run_trainer(
                        case, fresh(), device, os.path.join(out_dir, f"run{next(counter)}")
                    ),
                    "plain": lambda: _run_plain(case, fresh(), device),
                },
                rounds,
            )


# ---- waits --------------------------------------------------------------------------------
def _count_waits(case: dict[str, Any], model: nn.Module, device: str) -> dict[str, float]:
    """Waits per step between period ends (two periods): the trainer's and the model's."""
    if device != "cuda":
        return {"trainer": float("nan"), "model": float("nan")}
    iters = 2 * WRITER_PERIOD + 1
    counter = hooks.DeviceWaitCounter(WRITER_PERIOD)
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-waits-") as out_dir:
        trainer = _build_trainer(model, case["batches"], iters, case["precision"], out_dir)
        trainer.register_hooks([counter])
        with log_to_file(os.path.join(out_dir, "log.txt")):
            trainer.train(0, iters)
    steps = max(1, counter.num_steps_counted)
    return {name: count / steps for name, count in counter.waits.items()}


def bench_device(args: argparse.Namespace) -> dict[str, Any]:
    """Steps/s of the trainer and of a hand loop on ``--device``, eager and compiled."""
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmark device: --device cuda needs a CUDA build of torch and a GPU")
    quick = args.quick
    rounds = args.rounds or (1 if quick else 3)
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    target = _RATIO_TARGET if device == "cuda" else _CPU_RATIO_TARGET
    results: dict[str, Any] = {}
    rows = []
    for key, make in [("classifier", _classifier_case), ("resnet50", _resnet_case)]:
        case = make(device, quick)
        for compiled in (False, True):
            if compiled and (quick or args.eager_only):
                continue  # compiling takes minutes on the CPU; --quick checks the wiring only
            model = case["model"](compiled)
            samples = _time_pair(case, model, device, rounds)
            waits = _count_waits(case, model, device)
            tk, plain = median(samples["trainkit"]), median(samples["plain"])
            ratio = tk / plain
            name = f"{key}/{'compiled' if compiled else 'eager'}"
            results[name] = {
                "label": case["label"],
                "compiled": compiled,
                "iters": case["iters"],
                "rounds": rounds,
                "samples": samples,
                "trainkit_s": tk,
                "plain_s": plain,
                "ratio": ratio,
                "target": target,
                "verdict": verdict(ratio, target, higher_is_better=False),
                "trainer_waits_per_step": waits["trainer"],
                "model_waits_per_step": waits["model"],
            }
            rows.append(
                [
                    case["label"],
                    "compiled" if compiled else "eager",
                    1.0 / tk,
                    1.0 / plain,
                    waits["trainer"],
                    waits["model"],
                    ratio,
                    target_text(target, higher_is_better=False),
                    results[name]["verdict"],
                ]
            )
    print_table(
        f"Training step on {device} ({_device_name(device)}): SimpleTrainer/AMPTrainer + "
        f"IterationTimer, LRScheduler, PeriodicWriter (period {WRITER_PERIOD}) vs a hand-written "
        f"loop on the same device batches; medians of {rounds} alternating runs. Waits: host-"
        "device syncs per step between writer periods (torch's sync debug mode), the trainer's "
        f"(target {_WAITS_TARGET:g}) and the model's own",
        [
            "model",
            "mode",
            "trainkit steps/s",
            "hand-written steps/s",
            "trainer waits/step",
            "model waits/step",
            "time ratio",
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    return results


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU"
