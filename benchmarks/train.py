"""``train``: SimpleTrainer with DefaultTrainer's hooks against a hand-written loop."""

from __future__ import annotations

import argparse
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
from trainkit.config import CfgNode, get_cfg
from trainkit.engine import SimpleTrainer, default_writers, hooks, launch
from trainkit.modeling import build_model
from trainkit.solver import build_lr_scheduler, build_optimizer
from trainkit.utils import comm

WRITER_PERIOD = 20  # PeriodicWriter period and gather_metric_period, as DefaultTrainer uses


class TinyMLP(nn.Module):
    """Two linear layers; a batch is ``(x, y)``, training returns ``{"loss_cls": ...}``."""

    def __init__(self, dim_in: int = 32, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim_in, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
        x, y = batch
        logits = self.net(x)
        return {"loss_cls": F.cross_entropy(logits, y)} if self.training else logits


class SmallConvNet(nn.Module):
    """Two convolutions and a linear head: a step of about 5 ms on one CPU thread."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1)
        )
        self.head = nn.Linear(32, 10)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
        x, y = batch
        logits = self.head(F.relu(self.features(x)).mean(dim=(2, 3)))
        return {"loss_cls": F.cross_entropy(logits, y)} if self.training else logits


def _conv_batches(count: int = 8, batch_size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(batch_size, 3, 32, 32, generator=g),
            torch.randint(0, 10, (batch_size,), generator=g),
        )
        for _ in range(count)
    ]


class _StepClock(hooks.HookBase):
    """Times iterations ``first .. last``: the first hook's before_step to the last's after_step.

    Two instances are registered, one first and one last, so every hook of a timed step is
    timed and the set-up and the final save (after ``last``) are not.
    """

    def __init__(self, first: int, last: int, times: dict[str, float], *, end: bool) -> None:
        self.priority = hooks.HookPriority.LOWEST if end else hooks.HookPriority.HIGHEST
        self._first, self._last, self._times, self._end = first, last, times, end

    def before_step(self) -> None:
        if not self._end and self.trainer.iter == self._first:
            self._times["start"] = time.perf_counter()

    def after_step(self) -> None:
        if self._end and self.trainer.iter == self._last:
            self._times["end"] = time.perf_counter()


def _default_trainer_step(model: nn.Module, batches: list[Any], iters: int, out_dir: str) -> float:
    """DefaultTrainer with every default hook (and its watchdog): s per timed iteration."""
    from trainkit.engine import DefaultTrainer

    class Trainer(DefaultTrainer):
        @classmethod
        def build_model(cls, cfg: CfgNode) -> nn.Module:
            return model

        @classmethod
        def build_train_loader(cls, cfg: CfgNode) -> Any:
            return itertools.cycle(batches)

    cfg = solver_cfg(iters)
    cfg.OUTPUT_DIR = out_dir
    cfg.SOLVER.CHECKPOINT_PERIOD = iters  # the final save only, after the timed steps
    cfg.DATASETS.TEST = ()
    cfg.TEST.EVAL_PERIOD = 0
    cfg.WRITER_PERIOD = WRITER_PERIOD
    cfg.SEED = 0
    trainer = Trainer(cfg)
    warm, times = 3, {}
    trainer.register_hooks(
        [
            _StepClock(warm, iters - 2, times, end=False),
            _StepClock(warm, iters - 2, times, end=True),
        ]
    )
    trainer.train()
    return (times["end"] - times["start"]) / (iters - 2 - warm)


def _plain_step(model: nn.Module, batches: list[Any], iters: int) -> float:
    """The same work by hand, timed over the same iterations: s per timed iteration."""
    cfg = solver_cfg(iters)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    data = iter(itertools.cycle(batches))
    model.train()
    warm = 3
    for i in range(iters - 1):
        if i == warm:
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = sum(model(next(data)).values())
        loss.backward()
        optimizer.step()
        scheduler.step()
    return (time.perf_counter() - start) / (iters - 2 - warm)


def _compare_default_trainer(iters: int, rounds: int) -> dict[str, list[float]]:
    """Alternate DefaultTrainer and hand-loop runs of the small conv net, fresh copies each."""
    torch.manual_seed(0)
    template, batches = SmallConvNet(), _conv_batches()
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-default-") as out_dir:
        counter = itertools.count()

        def trainkit_run() -> float:
            run_dir = os.path.join(out_dir, f"run{next(counter)}")
            return _default_trainer_step(copy.deepcopy(template), batches, iters, run_dir)

        with log_to_file(os.path.join(out_dir, "log.txt")):
            _plain_step(copy.deepcopy(template), batches, 20)  # warm-up: allocator, kernels
            return alternate(
                {
                    "trainkit": trainkit_run,
                    "plain": lambda: _plain_step(copy.deepcopy(template), batches, iters),
                },
                rounds,
            )


def _mlp_batches(count: int = 16, batch_size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(batch_size, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g))
        for _ in range(count)
    ]


def solver_cfg(max_iter: int) -> CfgNode:
    """The SGD config of the trainer and hand-loop runs: warm-up, then one LR step."""
    cfg = get_cfg()
    cfg.SOLVER.BASE_LR = 0.01
    cfg.SOLVER.MAX_ITER = max_iter
    cfg.SOLVER.STEPS = (max(1, max_iter * 2 // 3),)
    cfg.SOLVER.WARMUP_ITERS = max(1, max_iter // 10)
    return cfg


def _run_trainkit(
    model: nn.Module,
    batches: list[Any],
    iters: int,
    out_dir: str,
    *,
    accumulate: int = 1,
    ema: bool = False,
) -> float:
    """``SimpleTrainer`` with DefaultTrainer's timing, lr and writer hooks: s per iteration."""
    cfg = solver_cfg(iters)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    trainer = SimpleTrainer(
        model,
        itertools.cycle(batches),
        optimizer,
        gather_metric_period=WRITER_PERIOD,
        record_every_step=True,
        accumulate_steps=accumulate,
    )
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(optimizer, scheduler),
            hooks.ModelEMA(model, decay=0.999) if ema else None,
            # Writers on rank 0 only, as DefaultTrainer.build_hooks registers them.
            hooks.PeriodicWriter(default_writers(out_dir, iters), period=WRITER_PERIOD)
            if comm.is_main_process()
            else None,
        ]
    )
    start = time.perf_counter()
    trainer.train(0, iters)
    return (time.perf_counter() - start) / iters


def _run_plain(model: nn.Module, batches: list[Any], iters: int, *, accumulate: int = 1) -> float:
    """The same work written by hand: next batch(es), forward, backward, step, lr step."""
    cfg = solver_cfg(iters)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    data = iter(itertools.cycle(batches))
    model.train()
    start = time.perf_counter()
    for _ in range(iters):
        optimizer.zero_grad()
        for _ in range(accumulate):
            loss_dict = model(next(data))
            loss = sum(loss_dict.values())
            (loss / accumulate if accumulate > 1 else loss).backward()
        optimizer.step()
        scheduler.step()
    return (time.perf_counter() - start) / iters


def _compare(
    template: nn.Module,
    batches: list[Any],
    iters: int,
    rounds: int,
    wrap: Any = None,
    accumulate: int = 1,
) -> dict[str, list[float]]:
    """Alternate trainkit and plain runs, each on a fresh copy of ``template``."""

    def fresh() -> nn.Module:
        model = copy.deepcopy(template)
        return wrap(model) if wrap is not None else model

    with tempfile.TemporaryDirectory(prefix="trainkit-bench-train-") as out_dir:
        counter = itertools.count()

        def trainkit_run() -> float:
            comm.synchronize()
            run_dir = os.path.join(out_dir, f"run{next(counter)}")
            return _run_trainkit(fresh(), batches, iters, run_dir, accumulate=accumulate)

        def plain_run() -> float:
            comm.synchronize()
            return _run_plain(fresh(), batches, iters, accumulate=accumulate)

        with log_to_file(os.path.join(out_dir, "log.txt")):
            _run_plain(fresh(), batches, min(iters, 20))  # warm-up: allocator, kernels
            return alternate({"trainkit": trainkit_run, "plain": plain_run}, rounds)


def _ema_cost(
    template: nn.Module, batches: list[Any], iters: int, rounds: int
) -> dict[str, list[float]]:
    """Alternate trainkit runs with and without the ModelEMA hook (same hooks otherwise)."""
    with tempfile.TemporaryDirectory(prefix="trainkit-bench-ema-") as out_dir:
        counter = itertools.count()

        def run(ema: bool) -> float:
            run_dir = os.path.join(out_dir, f"run{next(counter)}")
            return _run_trainkit(copy.deepcopy(template), batches, iters, run_dir, ema=ema)

        with log_to_file(os.path.join(out_dir, "log.txt")):
            _run_plain(copy.deepcopy(template), batches, 2)  # warm-up
            return alternate({"with_ema": lambda: run(True), "without": lambda: run(False)}, rounds)


def _ddp_rank(iters: int, rounds: int) -> dict[str, list[float]]:
    """One rank of the 2-process job: DDP tiny MLP, trainkit and hand-written, alternating."""
    from trainkit.engine import create_ddp_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    template = TinyMLP()
    return _compare(template, _mlp_batches(), iters, rounds, wrap=create_ddp_model)


def bench_train(args: argparse.Namespace) -> dict[str, Any]:
    """Per-iteration time of SimpleTrainer + default hooks vs a hand-written loop."""
    quick = args.quick
    rounds = 1 if quick else 5
    # 2,000 steps as in the detectron2 measurement: fixed costs (writer set-up and close,
    # the final write) then weigh on the per-step time as they would in a real run.
    mlp_iters, ddp_iters, clf_iters = (40, 40, 3) if quick else (2000, 1000, 25)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    # Issue 22 retired the tiny MLP's 1.05 (a ~0.2 ms step measures Python overhead, not a
    # trainer): it must not get worse than the 1.31 measured then; a real step (>= 5 ms, the
    # ImageClassifier) stays within 1.03.
    cases = [
        ("tiny MLP, 1 process", "mlp", 1.31),
        ("tiny MLP, 2 processes (Gloo DDP)", "ddp", 1.10),
        ("tiny MLP, 1 process, 4 micro-batches per step (ACCUMULATE_STEPS 4)", "accum", 1.05),
        ("ImageClassifier (shapes, 64 px, batch 16), 1 process", "clf", 1.03),
        (
            "small conv net (~5 ms step), DefaultTrainer with all its default hooks, 1 process",
            "default",
            1.03,
        ),
    ]
    rows = []
    for label, key, target in cases:
        if key == "mlp":
            samples = _compare(TinyMLP(), _mlp_batches(), mlp_iters, rounds)
            iters = mlp_iters
        elif key == "accum":
            iters = max(1, mlp_iters // 4)
            samples = _compare(TinyMLP(), _mlp_batches(), iters, rounds, accumulate=4)
        elif key == "ddp":
            samples = launch(_ddp_rank, 2, args=(ddp_iters, rounds))[0]
            iters = ddp_iters
        elif key == "default":
            iters = 40 if quick else 400
            samples = _compare_default_trainer(iters, rounds)
        else:
            cfg = shapes_cfg()
            batches = batches_of(mapped_samples("train", 16 * 4, cfg), 16)
            samples = _compare(build_model(cfg), batches, clf_iters, rounds)
            iters = clf_iters
        tk, plain = median(samples["trainkit"]), median(samples["plain"])
        ratio = tk / plain
        results[key] = {
            "label": label,
            "iters": iters,
            "rounds": rounds,
            "samples": samples,
            "trainkit_s": tk,
            "plain_s": plain,
            "ratio": ratio,
            "target": target,
            "verdict": verdict(ratio, target, higher_is_better=False),
        }
        rows.append(
            [
                label,
                iters,
                tk * 1e3,
                plain * 1e3,
                ratio,
                target_text(target, higher_is_better=False),
                results[key]["verdict"],
            ]
        )
    print_table(
        f"Training step: SimpleTrainer + IterationTimer, LRScheduler, PeriodicWriter (console "
        f"to log file, JSON, TensorBoard; period {WRITER_PERIOD}, gather_metric_period "
        f"{WRITER_PERIOD}) vs a hand-written loop; medians of {rounds} alternating runs, "
        "1 torch thread per process",
        [
            "model",
            "iterations/run",
            "trainkit ms/it",
            "hand-written ms/it",
            "ratio",
            "target",
            "PASS/MISS",
        ],
        rows,
    )
    results["ema"] = _bench_ema(quick, rounds, clf_iters)
    return results


def _bench_ema(quick: bool, rounds: int, iters: int) -> dict[str, Any]:
    """What the ModelEMA hook adds to an ImageClassifier step (decay 0.999, every step)."""
    cfg = shapes_cfg()
    batches = batches_of(mapped_samples("train", 16 * 4, cfg), 16)
    samples = _ema_cost(build_model(cfg), batches, iters, rounds)
    with_ema, without = median(samples["with_ema"]), median(samples["without"])
    print_table(
        f"ModelEMA on the ImageClassifier (shapes, 64 px, batch 16, {iters} iterations/run, "
        f"trainer with timer, LR and writer hooks; medians of {rounds} alternating runs)",
        [
            "step ms without EMA",
            "step ms with EMA",
            "EMA adds ms/step",
            "EMA share of the step",
            "target",
            "PASS/MISS",
        ],
        [
            [
                without * 1e3,
                with_ema * 1e3,
                (with_ema - without) * 1e3,
                f"{(with_ema - without) / without:.1%}",
                target_text(_EMA_TARGET, higher_is_better=False),
                verdict(with_ema / without, _EMA_TARGET, higher_is_better=False),
            ]
        ],
    )
    ratio = with_ema / without
    return {
        "label": "ImageClassifier with vs without ModelEMA",
        "iters": iters,
        "rounds": rounds,
        "samples": samples,
        "trainkit_s": with_ema,
        "plain_s": without,
        "ratio": ratio,
        "target": _EMA_TARGET,
        "verdict": verdict(ratio, _EMA_TARGET, higher_is_better=False),
    }


# The average is one multi-tensor lerp over the weights per step: a small share of a step.
_EMA_TARGET = 1.10
