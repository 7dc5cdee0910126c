"""The dry run's memory figures: what one process holds of the model's training state.

The model is built from the config on the meta device: a yacs config's
``MODEL.META_ARCHITECTURE`` through ``META_ARCH_REGISTRY`` (not ``build_model``, which moves it
to ``MODEL.DEVICE`` and may compile it), a LazyConfig's ``model`` instantiated. Nothing is
allocated and no device is needed, so a model of 1e9 parameters is counted on a CPU in
seconds. :func:`~trainkit.modeling.sharding.state_bytes_per_process` then counts the bytes
of its parameters, gradients and optimizer state (the configured optimizer, after its first
step) under the configured strategy (FSDP with its shard size, ``MODEL.FSDP.*`` or
``train.fsdp``) and under DDP beside it.

Activations are not counted (they depend on the batch, the input sizes and activation
checkpointing), so the figures say what the state takes, not whether a job fits on a device.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trainkit.config import CfgNode, instantiate
from trainkit.engine.default_trainer import DefaultTrainer
from trainkit.modeling.build import build_registered_model
from trainkit.modeling.sharding import hybrid_mesh_shape, state_bytes_per_process
from trainkit.solver import build_optimizer
from trainkit.utils.errors import UsageError

__all__ = [
    "MemoryNotCountedError",
    "build_model_on_meta",
    "build_model_override_note",
    "format_memory",
    "script_trainers",
    "shard_group_size",
    "state_memory",
]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


class MemoryNotCountedError(RuntimeError):
    """The model or its optimizer cannot be built on the meta device; the message says why."""


def shard_group_size(cfg: Any, world_size: int, local_size: int) -> int | None:
    """Return the processes each parameter is split over, or ``None`` when FSDP is off (DDP).

    Args:
        cfg: a yacs config (``MODEL.FSDP.ENABLED``, ``MODEL.FSDP.SHARD_SIZE``) or a LazyConfig
            (``train.fsdp.enabled``, ``train.fsdp.shard_size``; DDP without them).
        world_size: the job's processes.
        local_size: the processes per machine (``--num-gpus``).

    Returns:
        The last dimension of the device mesh ``shard_model`` would make: the world size for
        a shard size of 0, ``N`` for hybrid sharding in groups of ``N``.

    Raises:
        ConfigError: If the shard size is not one ``shard_model`` takes for this job (the
            message names the key and the allowed values).
    """
    if isinstance(cfg, CfgNode):
        enabled, size, key = cfg.MODEL.FSDP.ENABLED, cfg.MODEL.FSDP.SHARD_SIZE, "MODEL.FSDP"
    else:
        fsdp = (cfg.get("train") or {}).get("fsdp") or {}
        enabled, size, key = fsdp.get("enabled", False), fsdp.get("shard_size", 0), "train.fsdp"
    if not enabled:
        return None
    key += ".SHARD_SIZE" if isinstance(cfg, CfgNode) else ".shard_size"
    return hybrid_mesh_shape(int(size), world_size, local_size, key=key)[-1]


def state_memory(cfg: Any, group_size: int | None) -> dict[str, Any]:
    """Return the bytes one process holds of the config's model, sharded and under DDP.

    Args:
        cfg: a yacs config or a LazyConfig (not changed).
        group_size: :func:`shard_group_size`'s answer for the job.

    Returns:
        ``{"strategy": "fsdp" | "ddp", "shard_size": N, "per_process": {"parameters": B,
        "gradients": B, "optimizer": B}, "ddp_per_process": {...}}``, integers in bytes;
        ``shard_size`` is the processes each parameter is split over (``group_size``; 1 for
        DDP, where every process holds it whole) and ``per_process`` the largest over the
        processes (FSDP pads dimension 0 to a multiple of the group); with DDP it equals
        ``ddp_per_process``.

    Raises:
        MemoryNotCountedError: If the model or its optimizer cannot be built on the meta device
            (a model that computes with its weights or moves itself while it is built), or a
            LazyConfig has no ``model`` or ``optimizer``.
        UsageError: For a config error, as a real run raises it (an unknown architecture or
            optimizer).
    """
    if not isinstance(cfg, CfgNode) and not ("model" in cfg and "optimizer" in cfg):
        raise MemoryNotCountedError(
            "the LazyConfig has no 'model' and 'optimizer' to build (what "
            "tools/lazyconfig_train_net.py trains)"
        )
    try:
        model = build_model_on_meta(cfg)
        build = _optimizer_builder(cfg)
        ddp = state_bytes_per_process(model, build, shard_group_size=None)
        per_process = (
            ddp
            if group_size is None
            else state_bytes_per_process(model, build, shard_group_size=group_size)
        )
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of a model's code on meta tensors
        what = (
            f"MODEL.META_ARCHITECTURE {cfg.MODEL.META_ARCHITECTURE!r}"
            if isinstance(cfg, CfgNode)
            else "the LazyConfig's model"
        )
        raise MemoryNotCountedError(
            f"{what} or its optimizer could not be built on the meta device "
            f"({type(e).__name__}: {e})"
        ) from e
    return {
        "strategy": "ddp" if group_size is None else "fsdp",
        "shard_size": 1 if group_size is None else group_size,
        "per_process": per_process,
        "ddp_per_process": ddp,
    }


def build_model_on_meta(cfg: Any) -> nn.Module:
    """Build the config's model on the meta device: shapes and dtypes, no memory, no device.

    Raises:
        UnknownNameError: If a yacs config's ``MODEL.META_ARCHITECTURE`` is not registered.
    """
    with torch.device("meta"):
        if isinstance(cfg, CfgNode):
            return build_registered_model(cfg)
        return instantiate(cfg.model)


def _optimizer_builder(cfg: Any) -> Callable[[nn.Module], torch.optim.Optimizer]:
    """The configured optimizer's builder, for the models ``state_bytes_per_process`` shapes."""
    if isinstance(cfg, CfgNode):
        solver_cfg = cfg.clone()
        solver_cfg.defrost()
        # torch's fused kernels take no meta tensors; every implementation holds the same state.
        solver_cfg.SOLVER.OPTIMIZER_IMPL = "for_loop"
        return lambda model: build_optimizer(solver_cfg, model)

    def build_lazy(model: nn.Module) -> torch.optim.Optimizer:
        lazy = copy.deepcopy(cfg)  # as tools/lazyconfig_train_net.py does, on a copy
        lazy.optimizer.params.model = model
        return instantiate(lazy.optimizer)

    return build_lazy


def script_trainers() -> list[type[DefaultTrainer]]:
    """Return the ``DefaultTrainer`` subclasses the running script (``__main__``) holds.

    The dry run stops the script in ``default_setup``, before it makes its trainer; the
    classes it defines or imports are what it would make it from.
    """
    script = sys.modules.get("__main__")
    found = vars(script).values() if script is not None else ()
    return [
        value
        for value in found
        if isinstance(value, type) and issubclass(value, DefaultTrainer)
        if value is not DefaultTrainer
    ]


def build_model_override_note(cfg: Any, trainers: Iterable[type]) -> str | None:
    """Return the line saying that the figures are not for a trainer's own ``build_model``.

    Args:
        cfg: the config the figures are for.
        trainers: the script's trainer classes (:func:`script_trainers`).

    Returns:
        One line if a trainer overrides ``DefaultTrainer.build_model``, else ``None``.
    """
    own = DefaultTrainer.build_model.__func__  # type: ignore[attr-defined]
    # dict.fromkeys: a class the script holds under two names is named once.
    overriding = dict.fromkeys(
        t for t in trainers if getattr(t.build_model, "__func__", None) is not own
    )
    if not overriding:
        return None
    names = ", ".join(t.__name__ for t in overriding)
    verb = "overrides" if len(overriding) == 1 else "override"
    model = (
        f"the registry's model (MODEL.META_ARCHITECTURE {cfg.MODEL.META_ARCHITECTURE!r})"
        if isinstance(cfg, CfgNode)
        else "the LazyConfig's model"
    )
    return (
        f"memory: {names} {verb} build_model; the figures are for {model}, "
        "not for the model the script's build_model makes"
    )


def format_memory(memory: dict[str, Any], world_size: int) -> list[str]:
    """Return the text lines of :func:`state_memory`'s figures, beside DDP's.

    Args:
        memory: :func:`state_memory`'s answer.
        world_size: the job's processes (a shard group smaller than it is hybrid sharding).
    """
    per_process, ddp = memory["per_process"], memory["ddp_per_process"]
    if memory["strategy"] == "ddp":
        columns, how = [("DDP", ddp)], "under DDP, as configured"
    else:
        shards = memory["shard_size"]
        title = f"FSDP ({shards} shards)" if shards == world_size else f"hybrid FSDP ({shards})"
        columns, how = [(title, per_process), ("DDP", ddp)], "sharded as configured, and under DDP"
    rows = [(key, [figures[key] for _, figures in columns]) for key in per_process]
    rows.append(("total", [sum(figures.values()) for _, figures in columns]))
    widths = [max(10, len(title)) for title, _ in columns]
    lines = [
        "",
        f"Memory per process {how}: parameters, gradients and optimizer state after",
        "its first step (activations are not counted: this is not whether the job fits):",
        " " * 13 + "".join(f"  {title:>{w}}" for (title, _), w in zip(columns, widths)),
    ]
    for key, values in rows:
        cells = "".join(f"  {_readable_bytes(v):>{w}}" for v, w in zip(values, widths))
        lines.append(f"  {key:<11}{cells}")
    return lines


def _readable_bytes(count: int) -> str:
    """Return ``count`` bytes in binary units, three significant digits (``1.50 GiB``)."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in _UNITS[1:]:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    decimals = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{decimals}f} {unit}"
