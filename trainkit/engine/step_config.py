"""The step trainer a config describes: building it, and holding an assigned one to it.

What the config says about the step is of two kinds: the **wiring** (:func:`adopt_config_wiring`),
which any step trainer takes on without a word, and the **arithmetic** (micro-batches per step,
mixed precision and its dtype), which changes the update: a step trainer that disagrees is
refused with the config key to change (:func:`check_step_arithmetic`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from trainkit.config import CfgNode
from trainkit.engine.amp_trainer import AMPTrainer, default_precision
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.utils.errors import UsageError

__all__ = [
    "adopt_config_wiring",
    "build_step_trainer",
    "check_step_arithmetic",
    "prefetch_device",
]


def build_step_trainer(
    cfg: CfgNode, model: nn.Module, data_loader: Iterable[Any], optimizer: torch.optim.Optimizer
) -> SimpleTrainer:
    """Return the step trainer ``cfg`` describes (``SOLVER.AMP.ENABLED``, ``ACCUMULATE_STEPS``).

    It is wired when assigned to ``DefaultTrainer._trainer`` (:func:`adopt_config_wiring`).
    """
    step_cls = AMPTrainer if cfg.SOLVER.AMP.ENABLED else SimpleTrainer
    return step_cls(model, data_loader, optimizer, accumulate_steps=cfg.SOLVER.ACCUMULATE_STEPS)


def adopt_config_wiring(cfg: CfgNode, step: SimpleTrainer) -> None:
    """Give ``step`` the config's wiring, after checking that it computes the config's update.

    Every step's losses are recorded (as with detectron2's default period of 1) but
    synchronised only every ``WRITER_PERIOD`` steps, so a CUDA step never waits for the device.

    Raises:
        UsageError: See :func:`check_step_arithmetic`.
    """
    check_step_arithmetic(cfg, step)
    step.gather_metric_period = cfg.WRITER_PERIOD
    step.record_every_step = True
    step.prefetch_device = prefetch_device(cfg, step.model)


def prefetch_device(cfg: CfgNode, model: nn.Module) -> torch.device | None:
    """Return where a step trainer moves batches ahead of their step, or ``None``.

    The device of ``model``'s parameters when it is a GPU and ``DATALOADER.PREFETCH_TO_DEVICE``
    is on; on the CPU there is nothing to copy, so no prefetcher (not even its bookkeeping).
    """
    if not cfg.DATALOADER.PREFETCH_TO_DEVICE:
        return None
    device = next((p.device for p in model.parameters()), None)
    return device if device is not None and device.type == "cuda" else None


def check_step_arithmetic(cfg: CfgNode, step: SimpleTrainer) -> None:
    """Refuse a step trainer whose accumulation, mixed precision or dtype differ from ``cfg``.

    Raises:
        UsageError: Naming the config key that disagrees and how to make them agree.
    """
    name = type(step).__name__
    if step.accumulate_steps != cfg.SOLVER.ACCUMULATE_STEPS:
        raise UsageError(
            f"the {name} assigned to DefaultTrainer._trainer accumulates "
            f"{step.accumulate_steps} micro-batch(es) per step but SOLVER.ACCUMULATE_STEPS is "
            f"{cfg.SOLVER.ACCUMULATE_STEPS}; build it with "
            "accumulate_steps=cfg.SOLVER.ACCUMULATE_STEPS or change the config."
        )
    is_amp = isinstance(step, AMPTrainer)
    if is_amp != bool(cfg.SOLVER.AMP.ENABLED):
        wanted = "an AMPTrainer" if cfg.SOLVER.AMP.ENABLED else "a SimpleTrainer (not AMPTrainer)"
        raise UsageError(
            f"SOLVER.AMP.ENABLED is {cfg.SOLVER.AMP.ENABLED} but the {name} assigned to "
            f"DefaultTrainer._trainer {'uses' if is_amp else 'does not use'} mixed precision; "
            f"assign {wanted} or its subclass, or change SOLVER.AMP.ENABLED."
        )
    if is_amp and step.precision != default_precision(step.autocast_device):
        raise UsageError(
            f"the {name} assigned to DefaultTrainer._trainer autocasts to {step.precision}, "
            f"but SOLVER.AMP.ENABLED runs {default_precision(step.autocast_device)} on "
            f"{step.autocast_device}; build it without a precision argument."
        )
