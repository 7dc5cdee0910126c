"""Build the optimizer (param groups, gradient clipping) and the lr scheduler from a config."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any, Union

import torch
from fvcore.common.param_scheduler import (
    CosineParamScheduler,
    MultiStepParamScheduler,
    ParamScheduler,
    StepWithFixedGammaParamScheduler,
)
from torch import nn

from trainkit.config import CfgNode, ConfigError

# _expand_param_groups is re-exported because detectron2's tests import it from solver.build.
from trainkit.solver._param_groups import _expand_param_groups, reduce_param_groups  # noqa: F401
from trainkit.solver.lr_scheduler import LRMultiplier, WarmupParamScheduler

__all__ = [
    "build_lr_scheduler",
    "build_optimizer",
    "get_default_optimizer_params",
    "maybe_add_gradient_clipping",
    "reduce_param_groups",
]

logger = logging.getLogger(__name__)

_OptimizerOrClass = Union[torch.optim.Optimizer, type]

# Parameters of these layers get SOLVER.WEIGHT_DECAY_NORM: decaying a normalisation scale
# towards 0 fights the normalisation and usually hurts.
_NORM_MODULE_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.GroupNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LayerNorm, nn.LocalResponseNorm,
)  # fmt: skip

_OPTIMIZERS = ("SGD", "AdamW")
_LR_SCHEDULERS = ("WarmupMultiStepLR", "WarmupCosineLR", "WarmupStepWithFixedGammaLR")
_CLIP_TYPES = ("value", "norm", "full_model")


def get_default_optimizer_params(
    model: nn.Module,
    base_lr: float | None = None,
    weight_decay: float | None = None,
    weight_decay_norm: float | None = None,
    bias_lr_factor: float | None = 1.0,
    weight_decay_bias: float | None = None,
    lr_factor_func: Callable[[str], float] | None = None,
    overrides: dict[str, dict[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """Return optimizer param groups with separate lr / weight decay for norms and biases.

    detectron2's signature. Every trainable parameter appears once, even if shared between
    modules; parameters with identical hyper-parameters share a group
    (:func:`reduce_param_groups`). A hyper-parameter left ``None`` is not set, so the
    optimizer's default applies.

    Args:
        model: the model whose trainable parameters are grouped.
        base_lr: lr of every group (``None``: the optimizer's ``lr`` argument).
        weight_decay: weight decay of ordinary parameters.
        weight_decay_norm: weight decay of normalisation-layer parameters.
        bias_lr_factor: lr of parameters named ``bias`` is ``base_lr * bias_lr_factor``.
        weight_decay_bias: weight decay of parameters named ``bias`` (``None``: unchanged).
        lr_factor_func: maps a parameter's qualified name (as in
            ``model.named_parameters()``, e.g. ``"backbone.blocks.3.attn.qkv.weight"``) to a
            factor its lr is multiplied by (layer-wise lr decay). Applied before
            ``overrides`` and the bias settings, which replace the lr outright.
        overrides: ``{param_name: {hyperparam: value}}`` applied last, by the parameter's
            own name within its module (e.g. ``"bias"``, ``"pos_embedding"``).

    Returns:
        A list of ``{**hyperparams, "params": [...]}`` dicts for a ``torch.optim`` optimizer.

    Raises:
        ValueError: If ``bias_lr_factor`` or ``lr_factor_func`` is set without ``base_lr``,
            or ``overrides`` already has a ``"bias"`` entry that the bias arguments would
            replace.
    """
    overrides = dict(overrides or {})  # only "bias" is added; the inner dicts are not changed
    defaults = {k: v for k, v in (("lr", base_lr), ("weight_decay", weight_decay)) if v is not None}
    if lr_factor_func is not None and base_lr is None:
        raise ValueError("lr_factor_func needs base_lr: a parameter's lr is base_lr * factor.")
    bias_overrides: dict[str, float] = {}
    if bias_lr_factor is not None and bias_lr_factor != 1.0:
        if base_lr is None:
            raise ValueError("bias_lr_factor needs base_lr: the bias lr is base_lr * factor.")
        bias_overrides["lr"] = base_lr * bias_lr_factor
    if weight_decay_bias is not None:
        bias_overrides["weight_decay"] = weight_decay_bias
    if bias_overrides:
        if "bias" in overrides:
            raise ValueError(
                "overrides['bias'] conflicts with bias_lr_factor / weight_decay_bias; "
                "set bias hyper-parameters in one place."
            )
        overrides["bias"] = bias_overrides

    groups: list[dict[str, Any]] = []
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            hyperparams = dict(defaults)
            if weight_decay_norm is not None and isinstance(module, _NORM_MODULE_TYPES):
                hyperparams["weight_decay"] = weight_decay_norm
            if lr_factor_func is not None:
                qualified = f"{module_name}.{param_name}" if module_name else param_name
                hyperparams["lr"] *= lr_factor_func(qualified)
            hyperparams.update(overrides.get(param_name, {}))
            groups.append({"params": [param], **hyperparams})
    return reduce_param_groups(groups)


def maybe_add_gradient_clipping(cfg: CfgNode, optimizer: _OptimizerOrClass) -> _OptimizerOrClass:
    """Make ``optimizer`` clip gradients in ``step()`` when SOLVER.CLIP_GRADIENTS is enabled.

    Clipping lives in the optimizer's ``step`` so every training loop gets it without
    knowing about it. With a closure, note that clipping runs *before* the closure computes
    new gradients, as in detectron2.

    Args:
        cfg: config with ``SOLVER.CLIP_GRADIENTS``.
        optimizer: an optimizer class (a subclass is returned) or an instance (its class
            is swapped for such a subclass in place and it is returned).

    Returns:
        ``optimizer`` unchanged if clipping is disabled, else the clipping variant.

    Raises:
        ConfigError: A ``ValueError``: if SOLVER.CLIP_GRADIENTS.CLIP_TYPE is unknown.
    """
    clip_cfg = cfg.SOLVER.CLIP_GRADIENTS
    if not clip_cfg.ENABLED:
        return optimizer
    optimizer_type = optimizer if isinstance(optimizer, type) else type(optimizer)
    if not issubclass(optimizer_type, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer class or instance, got {optimizer!r}")
    clip_type, clip_value = clip_cfg.CLIP_TYPE, float(clip_cfg.CLIP_VALUE)
    norm_type = float(clip_cfg.NORM_TYPE)
    if clip_type not in _CLIP_TYPES:
        raise ConfigError(
            f"Unknown SOLVER.CLIP_GRADIENTS.CLIP_TYPE {clip_type!r}; choose one of "
            f"{', '.join(_CLIP_TYPES)}."
        )

    def clipper(params: Iterable[torch.Tensor] | torch.Tensor) -> None:
        if clip_type == "value":
            nn.utils.clip_grad_value_(params, clip_value)
        else:
            nn.utils.clip_grad_norm_(params, clip_value, norm_type)

    class _OptimizerWithGradientClip(optimizer_type):  # type: ignore[misc, valid-type]
        def step(self, closure: Callable[[], float] | None = None) -> Any:
            if clip_type == "full_model":  # one norm over every parameter
                clipper(itertools.chain.from_iterable(g["params"] for g in self.param_groups))
            else:
                for group in self.param_groups:
                    for param in group["params"]:
                        clipper(param)
            # Call the wrapped class explicitly: super() would break if this class were
            # itself wrapped a second time.
            return optimizer_type.step(self, closure)

    _OptimizerWithGradientClip.__name__ = optimizer_type.__name__ + "WithGradientClip"
    _OptimizerWithGradientClip.__qualname__ = _OptimizerWithGradientClip.__name__
    if isinstance(optimizer, type):
        return _OptimizerWithGradientClip
    optimizer.__class__ = _OptimizerWithGradientClip
    return optimizer


def build_optimizer(cfg: CfgNode, model: nn.Module) -> torch.optim.Optimizer:
    """Build the optimizer named by SOLVER.OPTIMIZER with trainkit's param groups.

    Args:
        cfg: the config (``SOLVER.*`` keys).
        model: the model to optimise.

    Returns:
        ``torch.optim.SGD`` or ``torch.optim.AdamW`` (a clipping subclass when
        SOLVER.CLIP_GRADIENTS.ENABLED), fused, foreach or a loop as SOLVER.OPTIMIZER_IMPL
        says (by default fused when every parameter is on CUDA).

    Raises:
        ConfigError: A ``ValueError``: if SOLVER.OPTIMIZER or OPTIMIZER_IMPL is unknown, a
            rate, momentum or decay is negative, Nesterov is asked without momentum, or the
            model has nothing to train.
    """
    solver = cfg.SOLVER
    for key in ("BASE_LR", "MOMENTUM", "WEIGHT_DECAY", "WEIGHT_DECAY_NORM", "BIAS_LR_FACTOR"):
        value = solver.get(key)
        if value is not None and value < 0:
            # torch's own message ("Invalid learning rate: -1.0") does not name the key.
            raise ConfigError(f"SOLVER.{key} must be >= 0, got {value}; set it to 0 or more.")
    params = get_default_optimizer_params(
        model,
        base_lr=solver.BASE_LR,
        weight_decay_norm=solver.WEIGHT_DECAY_NORM,
        bias_lr_factor=solver.BIAS_LR_FACTOR,
        weight_decay_bias=solver.WEIGHT_DECAY_BIAS,
    )
    if not params:
        raise ConfigError(
            f"{type(model).__name__} has no parameter with requires_grad=True to optimise; "
            "unfreeze some layers (or use --eval-only to only evaluate)."
        )
    name = str(solver.OPTIMIZER)
    # Case-insensitive so "sgd" and "adamw" in a config work; errors list the canonical names.
    canonical = {n.lower(): n for n in _OPTIMIZERS}.get(name.lower())
    if canonical == "SGD":
        if solver.NESTEROV and solver.MOMENTUM <= 0:
            raise ConfigError(
                f"SOLVER.NESTEROV=True needs SOLVER.MOMENTUM > 0, got {solver.MOMENTUM}; set "
                "SOLVER.MOMENTUM or SOLVER.NESTEROV False."
            )
        optimizer_cls: type = torch.optim.SGD
        kwargs = {"momentum": solver.MOMENTUM, "nesterov": solver.NESTEROV}
    elif canonical == "AdamW":
        optimizer_cls, kwargs = torch.optim.AdamW, {"betas": tuple(solver.BETAS), "eps": solver.EPS}
    else:
        raise ConfigError(
            f"Unknown SOLVER.OPTIMIZER {name!r}; choose one of {', '.join(_OPTIMIZERS)}, or "
            "override DefaultTrainer.build_optimizer for another optimizer."
        )
    kwargs.update(_implementation(str(solver.OPTIMIZER_IMPL), model))
    optimizer_cls = maybe_add_gradient_clipping(cfg, optimizer_cls)
    optimizer = optimizer_cls(params, lr=solver.BASE_LR, weight_decay=solver.WEIGHT_DECAY, **kwargs)
    if canonical == "SGD" and kwargs.get("fused") and solver.MOMENTUM > 0:
        _zero_momentum_buffers(optimizer)
    return optimizer


def _zero_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Give a fused SGD zero momentum buffers before its first step.

    torch's fused SGD makes them with ``empty_like`` and lets its first step fill them; when
    ``GradScaler`` skips that step (inf/NaN gradients, the usual start of a float16 run), the
    next reads uninitialised memory (NaN weights on a GPU). From zero, the first update is
    torch's (momentum * 0 + grad = grad; dampening is 0 here).
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)


_IMPLEMENTATIONS: dict[str, dict[str, Any]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "for_loop": {"foreach": False},
}


def _implementation(name: str, model: nn.Module) -> dict[str, Any]:
    """Return the optimizer arguments SOLVER.OPTIMIZER_IMPL asks for.

    ``""`` is fused when every parameter is a floating tensor on CUDA: a fused optimizer
    takes ``GradScaler``'s scale and inf/NaN flag on the device, so a float16 step skips
    without the host reading the flag (a wait per step); elsewhere torch's default
    (foreach on CUDA, a loop over parameters on the CPU).
    """
    if name in _IMPLEMENTATIONS:
        return dict(_IMPLEMENTATIONS[name])
    if name:
        raise ConfigError(
            f"Unknown SOLVER.OPTIMIZER_IMPL {name!r}; choose '' (fused on a GPU), 'fused', "
            "'foreach' or 'for_loop'."
        )
    params = [p for p in model.parameters() if p.requires_grad]
    on_cuda = all(p.is_cuda and p.is_floating_point() for p in params)
    return {"fused": True} if params and on_cuda else {}


def build_lr_scheduler(cfg: CfgNode, optimizer: torch.optim.Optimizer) -> LRMultiplier:
    """Build the per-iteration lr schedule named by SOLVER.LR_SCHEDULER_NAME, with warm-up.

    The schedules and SOLVER.RESCALE_INTERVAL are described with their keys in
    ``trainkit/config/defaults.py``; the cosine's end lr is :func:`_cosine_end_factor`'s.

    Args:
        cfg: the config (``SOLVER.*`` keys).
        optimizer: the optimizer whose lrs are scheduled.

    Returns:
        An :class:`LRMultiplier` over a :class:`WarmupParamScheduler`.

    Raises:
        ConfigError: A ``ValueError``: if the scheduler name or warm-up method is unknown,
            SOLVER.MAX_ITER is not positive, SOLVER.WARMUP_ITERS is negative, or the
            schedule's own keys are invalid.
    """
    solver = cfg.SOLVER
    max_iter = int(solver.MAX_ITER)
    if max_iter <= 0:
        raise ConfigError(f"SOLVER.MAX_ITER must be positive, got {max_iter}; set it to 1 or more.")
    if int(solver.WARMUP_ITERS) < 0:
        raise ConfigError(
            f"SOLVER.WARMUP_ITERS must be >= 0, got {solver.WARMUP_ITERS}; use 0 for no warm-up."
        )
    name = solver.LR_SCHEDULER_NAME
    sched: ParamScheduler
    if name == "WarmupMultiStepLR":
        sched = _multi_step_schedule(solver, max_iter)
    elif name == "WarmupCosineLR":
        sched = CosineParamScheduler(1.0, _cosine_end_factor(cfg))
    elif name == "WarmupStepWithFixedGammaLR":
        sched = _fixed_gamma_schedule(solver, max_iter)
    else:
        raise ConfigError(
            f"Unknown SOLVER.LR_SCHEDULER_NAME {name!r}; choose one of "
            f"{', '.join(_LR_SCHEDULERS)}, or override DefaultTrainer.build_lr_scheduler."
        )
    warmup_length = min(int(solver.WARMUP_ITERS) / max_iter, 1.0)
    factor, method = float(solver.WARMUP_FACTOR), str(solver.WARMUP_METHOD)
    rescale = bool(solver.RESCALE_INTERVAL)
    sched = WarmupParamScheduler(sched, factor, warmup_length, method, rescale_interval=rescale)
    return LRMultiplier(optimizer, multiplier=sched, max_iter=max_iter)


def _cosine_end_factor(cfg: CfgNode) -> float:
    """Return the multiplier in ``[0, 1]`` WarmupCosineLR ends at (rules: SOLVER.BASE_LR_END).

    BASE_LR_END_FACTOR if set, else BASE_LR_END / BASE_LR.
    """
    solver = cfg.SOLVER
    base_lr, end_lr = float(solver.BASE_LR), float(solver.BASE_LR_END)
    factor = float(solver.BASE_LR_END_FACTOR)
    if factor and end_lr:
        raise ConfigError(
            f"SOLVER.BASE_LR_END={end_lr} and SOLVER.BASE_LR_END_FACTOR={factor} both set the "
            "end lr of WarmupCosineLR; set only one (the other to 0)."
        )
    if end_lr:
        if base_lr <= 0:
            raise ConfigError(
                f"SOLVER.BASE_LR_END={end_lr} needs SOLVER.BASE_LR > 0, got {base_lr}; "
                "the end lr cannot exceed the start lr."
            )
        factor = end_lr / base_lr
        key, value = "SOLVER.BASE_LR_END", f"{end_lr} (BASE_LR={base_lr})"
    else:
        key, value = "SOLVER.BASE_LR_END_FACTOR", f"{factor}"
    if not 0.0 <= factor <= 1.0:
        raise ConfigError(
            f"{key}={value} makes WarmupCosineLR end at {factor:g} x BASE_LR; the end lr "
            "must lie between 0 and BASE_LR."
        )
    return factor


def _multi_step_schedule(solver: CfgNode, max_iter: int) -> ParamScheduler:
    steps = sorted(int(s) for s in solver.STEPS)
    kept = [s for s in steps if 0 < s < max_iter]
    if len(kept) != len(steps):
        logger.warning(
            "SOLVER.STEPS=%s has values outside (0, SOLVER.MAX_ITER=%d); ignoring %s. "
            "Lower them or raise MAX_ITER if the lr should drop there.",
            list(solver.STEPS),
            max_iter,
            sorted(set(steps) - set(kept)),
        )
    kept = sorted(set(kept))  # fvcore wants strictly increasing milestones
    return MultiStepParamScheduler(
        values=[solver.GAMMA**k for k in range(len(kept) + 1)],
        milestones=kept,
        num_updates=max_iter,
    )


def _fixed_gamma_schedule(solver: CfgNode, max_iter: int) -> ParamScheduler:
    num_decays, gamma = solver.NUM_DECAYS, solver.GAMMA
    # fvcore's own errors do not name the keys.
    if not isinstance(num_decays, int) or num_decays <= 0:
        raise ConfigError(
            f"SOLVER.NUM_DECAYS must be a positive integer for WarmupStepWithFixedGammaLR, "
            f"got {num_decays!r}."
        )
    if gamma <= 0:
        raise ConfigError(f"SOLVER.GAMMA must be > 0 for WarmupStepWithFixedGammaLR, got {gamma}.")
    return StepWithFixedGammaParamScheduler(
        base_value=1.0, num_decays=num_decays, gamma=float(gamma), num_updates=max_iter
    )
