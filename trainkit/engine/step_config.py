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

from trainkit.checkpoint import is_sharded
from trainkit.config import CfgNode, ConfigError
from trainkit.engine.amp_trainer import AMPTrainer, default_precision
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.modeling import (
    checkpoint_activations,
    model_blocks,
    model_device,
    shard_from_config,
)
from trainkit.utils.errors import UsageError

__all__ = [
    "adopt_config_wiring",
    "amp_precision",
    "build_step_trainer",
    "check_step_arithmetic",
    "deferred_checks",
    "prefetch_device",
    "prepare_model",
]

_PRECISIONS = {"": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_step_trainer(
    cfg: CfgNode, model: nn.Module, data_loader: Iterable[Any], optimizer: torch.optim.Optimizer
) -> SimpleTrainer:
    """Return the step trainer ``cfg`` describes (``SOLVER.AMP.*``, ``ACCUMULATE_STEPS``).

    It is wired when assigned to ``DefaultTrainer._trainer`` (:func:`adopt_config_wiring`).

    Raises:
        ConfigError: If ``SOLVER.AMP.PRECISION`` is not one of its values.
    """
    precision = amp_precision(cfg)  # checked without AMP too
    # Cleared before the forward pass: the previous step's gradients are freed before the
    # activations are allocated (detectron2's SimpleTrainer clears them after it).
    kwargs = {"accumulate_steps": cfg.SOLVER.ACCUMULATE_STEPS, "zero_grad_before_forward": True}
    if not cfg.SOLVER.AMP.ENABLED:
        return SimpleTrainer(model, data_loader, optimizer, **kwargs)
    return AMPTrainer(model, data_loader, optimizer, precision=precision, **kwargs)


def prepare_model(cfg: CfgNode, model: nn.Module) -> nn.Module:
    """Shard ``model`` (``MODEL.FSDP``) or set its activation checkpointing, as ``cfg`` says.

    Sharded, parameters are gathered in the AMP precision (``SOLVER.AMP``) and gradients
    reduced in float32. A model the trainer's ``build_model`` already sharded is kept.

    Raises:
        ConfigError: As :func:`~trainkit.modeling.shard_from_config`.
    """
    if cfg.MODEL.FSDP.ENABLED:
        if is_sharded(model):
            return model
        param_dtype = None
        if cfg.SOLVER.AMP.ENABLED:
            param_dtype = amp_precision(cfg) or default_precision(model_device(cfg).type)
        return shard_from_config(model, cfg, param_dtype=param_dtype)
    if cfg.MODEL.ACTIVATION_CHECKPOINTING:
        checkpoint_activations(model_blocks(model))
    return model


def amp_precision(cfg: CfgNode) -> torch.dtype | None:
    """Return the autocast dtype ``SOLVER.AMP.PRECISION`` names (``None``: the device's usual).

    Raises:
        ConfigError: If it is not ``""``, ``"float16"`` or ``"bfloat16"``.
    """
    name = cfg.SOLVER.AMP.PRECISION
    if name not in _PRECISIONS:
        raise ConfigError(
            f"SOLVER.AMP.PRECISION must be '', 'float16' or 'bfloat16', got {name!r}; use '' "
            "for the device's usual type (float16 on a GPU, bfloat16 on the CPU)."
        )
    return _PRECISIONS[name]


def deferred_checks(cfg: CfgNode) -> bool | None:
    """Return ``SOLVER.DEFERRED_CHECKS`` (``None``: decided by the losses' device).

    Raises:
        ConfigError: If it is not None, True or False.
    """
    value = cfg.SOLVER.DEFERRED_CHECKS
    if value is not None and not isinstance(value, bool):
        raise ConfigError(
            f"SOLVER.DEFERRED_CHECKS must be None (auto), True or False, got {value!r}."
        )
    return value


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
    step.batches.prefetch_device = prefetch_device(cfg, step.model)
    step.deferred_checks = deferred_checks(cfg)


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
    if not is_amp:
        return
    wanted = amp_precision(cfg) or default_precision(step.autocast_device)
    if step.precision != wanted:
        raise UsageError(
            f"the {name} assigned to DefaultTrainer._trainer autocasts to {step.precision}, "
            f"but SOLVER.AMP.PRECISION={cfg.SOLVER.AMP.PRECISION!r} runs {wanted} on "
            f"{step.autocast_device}; build it with precision=amp_precision(cfg) (from "
            "trainkit.engine.step_config) or change SOLVER.AMP.PRECISION."
        )
