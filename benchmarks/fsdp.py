"""``fsdp``: what each process holds of a ViT's training state under FSDP2 against DDP.

Jobs of 4 Gloo processes, started one after the other by ``launch`` (fresh processes each,
so their peak resident memory does not mix), train the same ``ViTClassifier`` (57 M
parameters; ``--quick``: a tiny one) on shapes images with AdamW and ``ACCUMULATE_STEPS 2``:
one under DDP (``create_ddp_model``), one sharded (``MODEL.FSDP.ENABLED``,
``shard_from_config``, what ``DefaultTrainer`` calls). Each process counts, after the
optimizer step, the bytes of the distinct storages of its parameters (a sharded parameter's
local shard), gradients and optimizer state, each storage once. The dry run's figures for
the same configs (:func:`trainkit.engine.dry_run_memory.state_memory`) are printed beside
the measured ones. The full run then starts both jobs once more with glibc's mmap threshold
fixed (:data:`MALLOC_ENV`), to show how much of FSDP's resident memory is the allocator's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from benchmarks.measure import median, self_memory
from benchmarks.report import print_table, target_text, verdict
from benchmarks.shapes import batches_of, mapped_samples, shapes_cfg
from trainkit.config import CfgNode
from trainkit.engine import HookBase, SimpleTrainer, create_ddp_model, launch
from trainkit.engine.dry_run_memory import shard_group_size, state_memory
from trainkit.modeling import build_model, model_blocks, shard_from_config
from trainkit.solver import build_optimizer
from trainkit.utils import comm

WORLD = 4  # Gloo processes of each job
MICRO_BATCH = 2  # images per micro-batch and process
ACCUMULATE = 2  # micro-batches per optimizer step (SOLVER.ACCUMULATE_STEPS)
# FSDP's state bytes against DDP's: at most this (4 processes: 0.25 is the limit).
STATE_RATIO_TARGET = 0.3
# The dry run's figures against the measured ones: within this fraction.
DRY_RUN_TOLERANCE = 0.1
_FIGURES = ("parameters", "gradients", "optimizer")
# glibc's malloc serves a freed block's size from its heap afterwards (its mmap threshold
# rises up to 32 MiB), where FSDP's per-block buffers fragment it; a fixed threshold maps
# and unmaps every buffer over 1 MiB instead. The jobs run once more with it.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}
_MIB = 2**20
# (DIM, DEPTH, HEADS, MLP_RATIO): full run (57.3 M parameters), --quick.
_VIT = {False: (768, 8, 12, 4.0), True: (64, 2, 4, 2.0)}


def vit_cfg(quick: bool, *, fsdp: bool) -> CfgNode:
    """The ViT run's config: shapes images (64 px), patches of 16 px, AdamW, 2 micro-batches."""
    cfg = shapes_cfg(batch_size=WORLD * MICRO_BATCH * ACCUMULATE)
    cfg.MODEL.META_ARCHITECTURE = "ViTClassifier"
    dim, depth, heads, mlp_ratio = _VIT[quick]
    cfg.MODEL.VIT.PATCH_SIZE = 16  # 16 tokens for a 64 px image: the step is mostly weights
    cfg.MODEL.VIT.DIM, cfg.MODEL.VIT.DEPTH = dim, depth
    cfg.MODEL.VIT.HEADS, cfg.MODEL.VIT.MLP_RATIO = heads, mlp_ratio
    cfg.SOLVER.OPTIMIZER = "AdamW"
    cfg.SOLVER.BASE_LR = 1e-4
    cfg.SOLVER.ACCUMULATE_STEPS = ACCUMULATE
    cfg.MODEL.FSDP.ENABLED = fsdp
    return cfg


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this process holds: a DTensor's local shard, else the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class StateBytes:
    """Counts the bytes of a model's parameters, gradients and optimizer state in this process.

    Each storage is counted once, with its full size (FSDP's padding and all-gather buffers
    included), in the first figure that holds it. The parameters are the optimizer's (a
    sharded model's shards) and the model's current ones (the gathered parameters while
    FSDP holds a block unsharded).

    Attributes:
        samples: ``(where, {figure: bytes})`` of every :meth:`sample` while :attr:`active`.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.active = False
        self.samples: list[tuple[str, dict[str, int]]] = []

    def count(self) -> dict[str, int]:
        """Return ``{"parameters", "gradients", "optimizer": bytes}`` now."""
        params = list(
            dict.fromkeys(
                itertools.chain(
                    (p for group in self.optimizer.param_groups for p in group["params"]),
                    self.model.parameters(),
                )
            )
        )
        seen: set[int] = set()

        def nbytes(tensors: Iterable[Any]) -> int:
            total = 0
            for tensor in tensors:
                if not isinstance(tensor, torch.Tensor):
                    continue
                storage = _local(tensor).untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
            return total

        with torch.no_grad():
            state = self.optimizer.state.values()
            return {
                "parameters": nbytes(params),
                "gradients": nbytes(p.grad for p in params),
                "optimizer": nbytes(v for s in state for v in s.values()),
            }

    def sample(self, where: str) -> None:
        """Record :meth:`count` as taken at ``where``, if :attr:`active`."""
        if self.active:
            self.samples.append((where, self.count()))

    def watch_blocks(self, model: nn.Module) -> None:
        """Also sample inside the forward and backward passes of ``model`` (unwrapped).

        At the forward pass of the model and of each block, and when each block's output
        gradient arrives in the backward pass. Registered after ``fully_shard``'s own hooks,
        they run once FSDP has gathered the module's parameters.
        """
        model.register_forward_pre_hook(lambda *_: self.sample("forward (model)"))
        for i, block in enumerate(model_blocks(model)):
            block.register_forward_pre_hook(lambda *_, i=i: self.sample(f"forward (block {i})"))
            block.register_forward_hook(self._on_output_gradient(f"backward (block {i})"))

    def _on_output_gradient(self, where: str) -> Callable[..., None]:
        """A forward hook that samples when the gradient of the module's output arrives."""

        def register(_module: nn.Module, _args: Any, output: Any) -> None:
            if torch.is_grad_enabled() and isinstance(output, torch.Tensor):
                if output.requires_grad:
                    output.register_hook(lambda _grad: self.sample(where))  # grad unchanged

        return register


class _SampledStep(SimpleTrainer):
    """The trainer's step, sampling the state bytes after each micro-batch and the update."""

    def __init__(self, *args: Any, state: StateBytes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = state

    def backward(self, loss: torch.Tensor) -> None:
        super().backward(loss)
        self.state.sample("after a micro-batch's backward")

    def optimizer_step(self) -> None:
        super().optimizer_step()
        self.state.sample("after the optimizer step")


class _StepClock(HookBase):
    """Times every step; samples the state bytes in the last step only (its time is left out)."""

    def __init__(self, state: StateBytes) -> None:
        self.state, self.seconds, self._start = state, [], 0.0

    def before_step(self) -> None:
        self.state.active = self.trainer.iter == self.trainer.max_iter - 1
        self.state.sample("before the step")
        self._start = time.perf_counter()

    def after_step(self) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def _rank_main(strategy: str, quick: bool, steps: int) -> dict[str, Any]:
    """One process of a job: build, wrap or shard, train ``steps`` steps, count the bytes."""
    torch.set_num_threads(1)  # 4 processes share 2 cores
    cfg = vit_cfg(quick, fsdp=strategy == "fsdp")
    torch.manual_seed(0)
    model = build_model(cfg)
    numel = sum(p.numel() for p in model.parameters())
    bare = model
    model = shard_from_config(model, cfg) if strategy == "fsdp" else create_ddp_model(model)
    optimizer = build_optimizer(cfg, model)
    rank, world = comm.get_rank(), comm.get_world_size()
    samples = mapped_samples("train", 8 * world * MICRO_BATCH, cfg)[rank::world]
    state = StateBytes(bare, optimizer)
    state.watch_blocks(bare)
    trainer = _SampledStep(
        model,
        itertools.cycle(batches_of(samples, MICRO_BATCH)),
        optimizer,
        zero_grad_before_forward=True,  # as DefaultTrainer's step
        accumulate_steps=ACCUMULATE,
        state=state,
    )
    clock = _StepClock(state)
    trainer.register_hooks([clock])
    trainer.train(0, steps)
    buckets = None
    if strategy == "ddp":
        # Private, and the only place DDP tells: the reducer's flat bucket buffers (one
        # copy of every gradient, as gradient_as_bucket_view is False), comma-separated.
        sizes = model._get_ddp_logging_data().get("bucket_sizes", "")  # type: ignore[operator]
        buckets = sum(int(s) for s in str(sizes).split(",") if s)
    where, peak = max(state.samples, key=lambda s: sum(s[1].values()))
    return {
        "numel": numel,
        "after_step": state.samples[-1][1],
        "peak": peak,
        "peak_at": where,
        "sample_count": len(state.samples),
        "buckets": buckets,
        "hwm": self_memory()["hwm"],
        "step_s": clock.seconds,
    }


def _largest(ranks: list[dict[str, Any]], key: str) -> dict[str, int]:
    """The figures of the rank whose total is largest (FSDP's rank 0 holds the padding)."""
    return max((r[key] for r in ranks), key=lambda f: sum(f.values()))


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the processes started in the body; restore them after."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _jobs(quick: bool) -> dict[str, list[dict[str, Any]]]:
    """Run every job (one after the other, fresh processes each); return each one's ranks."""
    runs = {}
    for strategy in ("ddp", "fsdp"):
        runs[strategy] = launch(_rank_main, WORLD, args=(strategy, quick, 3 if quick else 7))
    if not quick:  # the allocator's share of the resident memory (not with --quick: 2 jobs)
        with _environment(MALLOC_ENV):
            for strategy in ("ddp", "fsdp"):
                runs[f"{strategy}_mmap"] = launch(_rank_main, WORLD, args=(strategy, quick, 4))
    return runs


def bench_fsdp(args: argparse.Namespace) -> dict[str, Any]:
    """State bytes, peak, resident memory and step time per process: FSDP2 vs DDP."""
    quick = args.quick
    runs = _jobs(quick)
    numel = runs["ddp"][0]["numel"]
    after = {s: _largest(runs[s], "after_step") for s in ("ddp", "fsdp")}
    peak = {s: _largest(runs[s], "peak") for s in ("ddp", "fsdp")}
    total = {s: sum(figures.values()) for s, figures in after.items()}
    peak_total = {s: sum(figures.values()) for s, figures in peak.items()}
    hwm = {s: max(r["hwm"] for r in ranks) for s, ranks in runs.items()}
    # A step ends when the slowest process's does: the median over the timed steps (all but
    # the warm-up and the sampled last one) of the slowest process's time.
    step_s = {
        s: median([max(times) for times in zip(*(r["step_s"][1:-1] for r in ranks))])
        for s, ranks in runs.items()
    }
    buckets = max(r["buckets"] for r in runs["ddp"])
    ratio = total["fsdp"] / total["ddp"]
    state_verdict = verdict(ratio, STATE_RATIO_TARGET, higher_is_better=False)
    steps = len(runs["ddp"][0]["step_s"])

    def row(label: str, ddp: float, fsdp: float, scale: float = _MIB) -> list[Any]:
        return [label, ddp / scale, fsdp / scale, fsdp / ddp, "", ""]

    rows = [row(name, after["ddp"][name], after["fsdp"][name]) for name in _FIGURES]
    rows.append(
        [
            "**parameters + gradients + optimizer state**",
            total["ddp"] / _MIB,
            total["fsdp"] / _MIB,
            ratio,
            target_text(STATE_RATIO_TARGET, higher_is_better=False),
            state_verdict,
        ]
    )
    rows.append(
        [
            "DDP's gradient buckets (its reducer's flat copy of every gradient, as DDP's "
            "bucket_sizes reports them), apart from the above",
            buckets / _MIB,
            "none",
            "",
            "",
            "",
        ]
    )
    rows.append(
        row(
            f"peak of the three during a step with ACCUMULATE_STEPS {ACCUMULATE} (sampled at "
            "each block's forward and output gradient, after each micro-batch's backward "
            "and after the update)",
            peak_total["ddp"],
            peak_total["fsdp"],
        )
    )
    rows.append(
        row(
            f"peak resident memory, VmHWM over {steps} steps (glibc malloc's defaults; torch, "
            "activations and buffers included)",
            hwm["ddp"],
            hwm["fsdp"],
        )
    )
    if "fsdp_mmap" in runs:
        rows.append(
            row(
                f"peak resident memory, VmHWM over 4 steps, with {_malloc_text()} (in a job "
                "of its own)",
                hwm["ddp_mmap"],
                hwm["fsdp_mmap"],
            )
        )
    rows.append(
        row(
            f"step time, s (median of {steps - 2} steps after one warm-up; CPU Gloo, not "
            "the target: reported only)",
            step_s["ddp"],
            step_s["fsdp"],
            scale=1.0,
        )
    )
    dim, depth, heads, mlp_ratio = _VIT[quick]
    print_table(
        f"Training state per process, {WORLD} Gloo processes, ViTClassifier "
        f"{numel / 1e6:.1f} M parameters (DIM {dim}, DEPTH {depth}, HEADS {heads}, MLP_RATIO "
        f"{mlp_ratio:g}; patches of 16 px on 64 px shapes images), AdamW, {MICRO_BATCH} images "
        "per micro-batch: DDP vs FSDP2 (MODEL.FSDP.ENABLED); MiB after the optimizer step, "
        "distinct storages each counted once, the largest process",
        ["per process", "DDP", "FSDP", "FSDP / DDP", "target", "PASS/MISS"],
        rows,
    )
    dry = _dry_run_rows(quick, after)
    return {
        "world_size": WORLD,
        "numel": numel,
        "accumulate_steps": ACCUMULATE,
        "after_step": after,
        "total": total,
        "ratio": ratio,
        "target": STATE_RATIO_TARGET,
        "verdict": state_verdict,
        "ddp_buckets": buckets,
        "peak": peak,
        "peak_total": peak_total,
        "peak_at": {s: [r["peak_at"] for r in ranks] for s, ranks in runs.items()},
        "hwm": hwm,
        "step_s": step_s,
        "step_ratio": step_s["fsdp"] / step_s["ddp"],
        "ranks": runs,
        "dry_run": dry,
    }


def _malloc_text() -> str:
    return " ".join(f"{name}={value}" for name, value in MALLOC_ENV.items())


def _dry_run_rows(quick: bool, measured: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Print the dry run's per-process figures beside the measured ones; return the checks."""
    checks, rows = [], []
    for strategy in ("ddp", "fsdp"):
        cfg = vit_cfg(quick, fsdp=strategy == "fsdp")
        figures = state_memory(cfg, shard_group_size(cfg, WORLD, WORLD))["per_process"]
        figures = {**figures, "total": sum(figures.values())}
        found = {**measured[strategy], "total": sum(measured[strategy].values())}
        for name, planned in figures.items():
            ratio = found[name] / planned
            result = verdict(abs(ratio - 1), DRY_RUN_TOLERANCE, higher_is_better=False)
            checks.append(
                {
                    "strategy": strategy,
                    "figure": name,
                    "dry_run": planned,
                    "measured": found[name],
                    "ratio": ratio,
                    "verdict": result,
                }
            )
            label = f"**{name}**" if name == "total" else name
            rows.append(
                [
                    strategy.upper(),
                    label,
                    planned / _MIB,
                    found[name] / _MIB,
                    ratio,
                    f"within {DRY_RUN_TOLERANCE:.0%}",
                    result,
                ]
            )
    print_table(
        "The dry run's memory figures (--dry-run, the same configs) against the measured "
        "ones: MiB per process after the optimizer step (the largest process)",
        ["strategy", "figure", "dry run", "measured", "measured / dry run", "target", "PASS/MISS"],
        rows,
    )
    return checks
