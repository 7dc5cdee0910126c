"""Optimizers, param groups, gradient clipping and learning-rate schedules built from a config."""

from trainkit.solver.build import (
    build_lr_scheduler,
    build_optimizer,
    get_default_optimizer_params,
    reduce_param_groups,
)
from trainkit.solver.lr_scheduler import (
    LRMultiplier,
    LRScheduler,
    WarmupCosineLR,
    WarmupMultiStepLR,
    WarmupParamScheduler,
)

__all__ = [
    "LRMultiplier",
    "LRScheduler",
    "WarmupCosineLR",
    "WarmupMultiStepLR",
    "WarmupParamScheduler",
    "build_lr_scheduler",
    "build_optimizer",
    "get_default_optimizer_params",
    "reduce_param_groups",
]
