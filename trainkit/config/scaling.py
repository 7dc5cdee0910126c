"""Rescaling a config written for ``SOLVER.REFERENCE_WORLD_SIZE`` processes to another number.

Two rules, chosen by ``SOLVER.SCALE_MODE``:

* ``"linear"`` (detectron2's): ``IMS_PER_BATCH`` and ``BASE_LR`` grow with the number of
  processes; ``MAX_ITER``, ``WARMUP_ITERS``, ``STEPS``, ``SOLVER.CHECKPOINT_PERIOD`` and
  ``TEST.EVAL_PERIOD`` shrink, so the run sees the same number of images with the same
  schedule — a different recipe (batch, LR, number of steps) on another world size.
* ``"accumulate"``: the recipe is kept (``IMS_PER_BATCH``, ``BASE_LR``, the schedule) and
  ``SOLVER.ACCUMULATE_STEPS`` absorbs the change: with ``A = ACCUMULATE_STEPS x
  REFERENCE_WORLD_SIZE`` micro-batches per step in the written config, ``W`` processes use
  ``A / W`` micro-batches each when that is whole (each process's micro-batch stays the size
  it was written for); else, when ``W > A`` and ``W`` divides ``IMS_PER_BATCH``, one micro-batch
  each (smaller micro-batches); else the config is refused, since a micro-batch would grow.
  Together with the step batches composed from the global stream
  (:mod:`trainkit.data.plans.batch_plan`), a run then does not depend on its topology.
"""

from __future__ import annotations

import logging

from trainkit.config import CfgNode, ConfigError
from trainkit.config.provenance import ORIGIN_AUTO_SCALING, record_changes

__all__ = [
    "SCALED_KEYS",
    "SCALE_MODES",
    "ScalingError",
    "accumulate_steps_for",
    "auto_scale_config",
    "check_same_recipe",
]

logger = logging.getLogger(__name__)

SCALE_MODES = ("linear", "accumulate")

# What the linear rule scales down, in this order (the first that rounds to 0 is reported).
_PERIODS = (
    "SOLVER.MAX_ITER",
    "SOLVER.WARMUP_ITERS",
    "SOLVER.STEPS",
    "SOLVER.CHECKPOINT_PERIOD",
    "TEST.EVAL_PERIOD",
)
# Every key a rule may change: the recipe of a job (what --dry-run shows).
SCALED_KEYS = (
    "SOLVER.IMS_PER_BATCH",
    "SOLVER.BASE_LR",
    "SOLVER.ACCUMULATE_STEPS",
    *_PERIODS,
    "SOLVER.REFERENCE_WORLD_SIZE",
)


class ScalingError(ConfigError):
    """The config cannot be rescaled to the world size (a ``UsageError`` and ``ValueError``)."""


def accumulate_steps_for(
    accumulate_steps: int, reference_world_size: int, world_size: int, ims_per_batch: int
) -> int:
    """Return the micro-batches per step that keep the global batch: the ``"accumulate"`` rule.

    Args:
        accumulate_steps: ``SOLVER.ACCUMULATE_STEPS`` of the written config.
        reference_world_size: the world size the config was written for (> 0).
        world_size: the job's world size.
        ims_per_batch: ``SOLVER.IMS_PER_BATCH``, the global batch of one step.

    Raises:
        ScalingError: If neither case of the rule applies (a micro-batch would grow).
    """
    slots = accumulate_steps * reference_world_size
    if slots % world_size == 0:
        return slots // world_size
    if world_size > slots and ims_per_batch % world_size == 0:
        return 1
    raise ScalingError(
        f"SOLVER.SCALE_MODE accumulate cannot run a config written for "
        f"SOLVER.REFERENCE_WORLD_SIZE={reference_world_size} processes x "
        f"SOLVER.ACCUMULATE_STEPS={accumulate_steps} micro-batches "
        f"(SOLVER.IMS_PER_BATCH={ims_per_batch}) on {world_size} processes: each process's "
        f"micro-batch would have to grow. Use a number of processes that divides {slots}, or "
        f"one larger than {slots} that divides SOLVER.IMS_PER_BATCH."
    )


def auto_scale_config(cfg: CfgNode, world_size: int) -> CfgNode:
    """Return a frozen copy of ``cfg`` rescaled from SOLVER.REFERENCE_WORLD_SIZE to ``world_size``.

    ``REFERENCE_WORLD_SIZE`` 0 or ``world_size`` changes nothing (``cfg`` itself if frozen).
    Each changed key's origin (:meth:`~trainkit.config.CfgNode.get_origin`) becomes
    ``auto-scaling from N to M processes (was V, from ITS ORIGIN)``; REFERENCE_WORLD_SIZE
    changes too, so a dump of the scaled config does not scale again on as many processes.

    Raises:
        ValueError: If ``world_size`` is not positive.
        ScalingError: A ``ConfigError``: if SOLVER.REFERENCE_WORLD_SIZE is negative, the batch does
            not divide by it, or a positive iteration count or period would round to 0.
    """
    old_world = cfg.SOLVER.REFERENCE_WORLD_SIZE
    if old_world in (0, world_size) and cfg.is_frozen():
        return cfg  # nothing to scale (default_setup scaled it already): no copy
    out = cfg.clone()
    if old_world not in (0, world_size):
        out.defrost()
        if world_size < 1:  # the caller's world size, not a user setting
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if old_world < 0:
            raise ScalingError(
                f"cannot scale from SOLVER.REFERENCE_WORLD_SIZE={old_world} to {world_size} "
                "processes; set it to the number of processes the config was written for, or "
                "0 to turn off automatic scaling."
            )
        mode = cfg.SOLVER.SCALE_MODE
        if mode not in SCALE_MODES:
            raise ScalingError(
                f"unknown SOLVER.SCALE_MODE {mode!r}; choose {' or '.join(SCALE_MODES)}."
            )
        scale = _scale_by_accumulating if mode == "accumulate" else _scale_linearly
        scale(cfg, out, old_world, world_size)
        out.SOLVER.REFERENCE_WORLD_SIZE = world_size
        suffix = " (accumulate)" if mode == "accumulate" else ""
        origin = f"{ORIGIN_AUTO_SCALING} from {old_world} to {world_size} processes{suffix}"
        record_changes(cfg, out, origin)
    out.freeze()
    return out


def _scale_linearly(cfg: CfgNode, out: CfgNode, old_world: int, world_size: int) -> None:
    batch = cfg.SOLVER.IMS_PER_BATCH
    if batch % old_world:
        raise ScalingError(
            f"SOLVER.IMS_PER_BATCH={batch} is not divisible by SOLVER.REFERENCE_WORLD_SIZE="
            f"{old_world}, so the per-process batch is undefined; make it a multiple of "
            f"{old_world}."
        )
    # batch / old_world images per process, times world_size: divisible by construction.
    out.SOLVER.IMS_PER_BATCH = batch // old_world * world_size
    out.SOLVER.BASE_LR = cfg.SOLVER.BASE_LR * (world_size / old_world)
    changes = [f"IMS_PER_BATCH={out.SOLVER.IMS_PER_BATCH}", f"BASE_LR={out.SOLVER.BASE_LR:g}"]
    for name in _PERIODS:
        section, key = name.split(".")
        value = cfg[section][key]
        if name == "SOLVER.STEPS":
            value = tuple(_scaled_period(name, v, old_world, world_size) for v in value)
        else:
            value = _scaled_period(name, value, old_world, world_size)
        setattr(out[section], key, value)
        changes.append(f"{key}={value}")
    logger.info(
        "Auto-scaling the config from %d to %d processes: %s",
        old_world,
        world_size,
        ", ".join(changes),
    )


def _scaled_period(name: str, value: int, old_world: int, world_size: int) -> int:
    scale = world_size / old_world
    scaled = int(round(value / scale))
    if value > 0 and scaled == 0:
        raise ScalingError(
            f"{name}={value}, written for SOLVER.REFERENCE_WORLD_SIZE={old_world} processes, "
            f"would round to 0 on {world_size} processes; raise {name} to at least "
            f"{int(scale + 0.5)} or set SOLVER.REFERENCE_WORLD_SIZE to 0 to turn off "
            "automatic scaling."
        )
    return scaled


def _scale_by_accumulating(cfg: CfgNode, out: CfgNode, old_world: int, world_size: int) -> None:
    steps = accumulate_steps_for(
        cfg.SOLVER.ACCUMULATE_STEPS, old_world, world_size, cfg.SOLVER.IMS_PER_BATCH
    )
    # Assigned only when they change: an assignment is recorded as the key's origin.
    if steps != cfg.SOLVER.ACCUMULATE_STEPS:
        out.SOLVER.ACCUMULATE_STEPS = steps
    logger.info(
        "Keeping the recipe of a config written for %d processes on %d: IMS_PER_BATCH=%d, "
        "BASE_LR=%g and the schedule unchanged; ACCUMULATE_STEPS %d -> %d (%d images per "
        "micro-batch and process)",
        old_world,
        world_size,
        cfg.SOLVER.IMS_PER_BATCH,
        cfg.SOLVER.BASE_LR,
        cfg.SOLVER.ACCUMULATE_STEPS,
        steps,
        cfg.SOLVER.IMS_PER_BATCH // (world_size * steps),
    )


def check_same_recipe(cfg: CfgNode, saved_world_size: int | None, world_size: int) -> None:
    """Refuse to resume a linear-scaled run on another world size (its recipe would change).

    Args:
        cfg: the (scaled) config of this job.
        saved_world_size: the world size that wrote the checkpoint (None: unknown).

    Raises:
        ScalingError: A ``ConfigError``: with ``SCALE_MODE`` linear, auto-scaling on and
            another world size; the message points at the accumulate mode.
    """
    if saved_world_size in (None, world_size) or cfg.SOLVER.REFERENCE_WORLD_SIZE == 0:
        return
    if cfg.SOLVER.SCALE_MODE == "linear":
        raise ScalingError(
            f"the checkpoint was written by {saved_world_size} processes and this job has "
            f"{world_size}: with SOLVER.SCALE_MODE linear the batch, learning rate and schedule "
            "would change mid-run. Resume with the same number of processes, or use "
            "SOLVER.SCALE_MODE accumulate (same recipe on any number of processes)."
        )
