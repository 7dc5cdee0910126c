"""Rescaling a config written for one world size to another.

Two rules, chosen by ``SOLVER.SCALE_MODE``:

* ``"linear"`` (detectron2's): the batch and learning rate grow with the number of processes
  and the schedule shrinks, so the run sees the same number of images — a different recipe
  (batch, LR, number of steps) on another world size.
* ``"accumulate"``: the recipe is kept (``IMS_PER_BATCH``, ``BASE_LR``, the schedule) and
  ``SOLVER.ACCUMULATE_STEPS`` absorbs the change: with ``A = ACCUMULATE_STEPS x
  REFERENCE_WORLD_SIZE`` micro-batches per step in the written config, ``W`` processes use
  ``A / W`` micro-batches each when that is whole (each process's micro-batch stays the size
  it was written for); else, when ``W > A`` and ``W`` divides ``IMS_PER_BATCH``, one micro-batch
  each (smaller micro-batches); else the config is refused, since a micro-batch would grow.
  Together with the step batches composed from the global stream
  (:mod:`trainkit.data.batch_plan`), a run then does not depend on its topology.
"""

from __future__ import annotations

import logging

from trainkit.config import CfgNode, ConfigError
from trainkit.config.provenance import ORIGIN_AUTO_SCALING, record_changes

__all__ = [
    "SCALE_MODES",
    "ScalingError",
    "accumulate_steps_for",
    "auto_scale_config",
    "check_same_recipe",
]

logger = logging.getLogger(__name__)


class ScalingError(ConfigError):
    """The config cannot be rescaled to the requested world size; the message says why.

    A :class:`~trainkit.config.ConfigError` (so a ``UsageError`` and a ``ValueError``).
    """


def _scaled_period(name: str, value: int, scale: float, new_world: int, old_world: int) -> int:
    scaled = int(round(value / scale))
    if value > 0 and scaled == 0:
        raise ScalingError(
            f"{name}={value}, written for SOLVER.REFERENCE_WORLD_SIZE={old_world} processes, "
            f"would round to 0 on {new_world} processes; "
            f"raise {name} to at least {int(scale + 0.5)} or set SOLVER.REFERENCE_WORLD_SIZE "
            f"to 0 to turn off automatic scaling."
        )
    return scaled


SCALE_MODES = ("linear", "accumulate")


def accumulate_steps_for(
    accumulate_steps: int, reference_world_size: int, world_size: int, ims_per_batch: int
) -> int:
    """Return the micro-batches per step that keep the global batch on ``world_size``.

    Pure arithmetic of the ``"accumulate"`` rule (see the module docstring).

    Args:
        accumulate_steps: ``SOLVER.ACCUMULATE_STEPS`` of the written config.
        reference_world_size: the world size the config was written for (> 0).
        world_size: the job's world size.
        ims_per_batch: ``SOLVER.IMS_PER_BATCH``, the global batch of one step.

    Returns:
        The new ``ACCUMULATE_STEPS``.

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

    The total batch and the learning rate scale up with the number of processes; MAX_ITER,
    WARMUP_ITERS, STEPS, TEST.EVAL_PERIOD and SOLVER.CHECKPOINT_PERIOD scale down, so the
    run sees the same number of images with the same schedule. ``REFERENCE_WORLD_SIZE == 0``
    or equal to ``world_size`` returns the config unchanged: ``cfg`` itself if it is
    frozen, else a frozen copy. Each changed key's
    origin (:meth:`~trainkit.config.CfgNode.get_origin`) becomes ``auto-scaling from N to M
    processes (was V, from ITS ORIGIN)``, REFERENCE_WORLD_SIZE included.

    Args:
        cfg: the config (not modified).
        world_size: the world size of the job.

    Returns:
        The rescaled config, frozen.

    Raises:
        ValueError: If ``world_size`` is not positive.
        ScalingError: A ``ConfigError``: if SOLVER.REFERENCE_WORLD_SIZE is negative, the
            batch does not divide by it, or a positive iteration count or period would
            round to 0.
    """
    old_world = cfg.SOLVER.REFERENCE_WORLD_SIZE
    if old_world == 0 or old_world == world_size:
        # Nothing to scale (default_setup scaled it already): no copy of a frozen config.
        if cfg.is_frozen():
            return cfg
        out = cfg.clone()
        out.freeze()
        return out
    out = cfg.clone()
    out.defrost()
    if world_size < 1:  # the caller's world size, not a user setting
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if old_world < 0:
        raise ScalingError(
            f"cannot scale from SOLVER.REFERENCE_WORLD_SIZE={old_world} to {world_size} "
            "processes; set it to the number of processes the config was written for, or 0 to "
            "turn off "
            "automatic scaling."
        )
    mode = cfg.SOLVER.SCALE_MODE
    if mode not in SCALE_MODES:
        raise ScalingError(
            f"unknown SOLVER.SCALE_MODE {mode!r}; choose {' or '.join(SCALE_MODES)}."
        )
    if mode == "accumulate":
        return _scale_by_accumulating(cfg, out, world_size)
    batch = cfg.SOLVER.IMS_PER_BATCH
    if batch % old_world:
        raise ScalingError(
            f"SOLVER.IMS_PER_BATCH={batch} is not divisible by SOLVER.REFERENCE_WORLD_SIZE="
            f"{old_world}, so the per-process batch is undefined; make it a multiple of "
            f"{old_world}."
        )
    scale = world_size / old_world
    # batch / old_world images per process, times world_size: divisible by construction.
    new_batch = batch // old_world * world_size
    solver = out.SOLVER
    solver.IMS_PER_BATCH = new_batch
    solver.BASE_LR = cfg.SOLVER.BASE_LR * scale
    solver.MAX_ITER = _scaled_period(
        "SOLVER.MAX_ITER", cfg.SOLVER.MAX_ITER, scale, world_size, old_world
    )
    solver.WARMUP_ITERS = _scaled_period(
        "SOLVER.WARMUP_ITERS", cfg.SOLVER.WARMUP_ITERS, scale, world_size, old_world
    )
    solver.STEPS = tuple(
        _scaled_period("SOLVER.STEPS", s, scale, world_size, old_world) for s in cfg.SOLVER.STEPS
    )
    solver.CHECKPOINT_PERIOD = _scaled_period(
        "SOLVER.CHECKPOINT_PERIOD", cfg.SOLVER.CHECKPOINT_PERIOD, scale, world_size, old_world
    )
    out.TEST.EVAL_PERIOD = _scaled_period(
        "TEST.EVAL_PERIOD", cfg.TEST.EVAL_PERIOD, scale, world_size, old_world
    )
    # The scaled config says it is written for world_size: loading its dump and running on
    # as many processes again does not scale it a second time.
    solver.REFERENCE_WORLD_SIZE = world_size
    record_changes(cfg, out, f"{ORIGIN_AUTO_SCALING} from {old_world} to {world_size} processes")
    logger.info(
        "Auto-scaling the config from %d to %d processes: IMS_PER_BATCH=%d, BASE_LR=%g, "
        "MAX_ITER=%d, WARMUP_ITERS=%d, STEPS=%s, CHECKPOINT_PERIOD=%d, EVAL_PERIOD=%d",
        old_world,
        world_size,
        new_batch,
        solver.BASE_LR,
        solver.MAX_ITER,
        solver.WARMUP_ITERS,
        solver.STEPS,
        solver.CHECKPOINT_PERIOD,
        out.TEST.EVAL_PERIOD,
    )
    out.freeze()
    return out


def _scale_by_accumulating(cfg: CfgNode, out: CfgNode, world_size: int) -> CfgNode:
    old_world = cfg.SOLVER.REFERENCE_WORLD_SIZE
    steps = accumulate_steps_for(
        cfg.SOLVER.ACCUMULATE_STEPS, old_world, world_size, cfg.SOLVER.IMS_PER_BATCH
    )
    # Assigned only when they change: an assignment is recorded as the key's origin.
    if steps != cfg.SOLVER.ACCUMULATE_STEPS:
        out.SOLVER.ACCUMULATE_STEPS = steps
    out.SOLVER.REFERENCE_WORLD_SIZE = world_size
    record_changes(
        cfg, out, f"{ORIGIN_AUTO_SCALING} from {old_world} to {world_size} processes (accumulate)"
    )
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
    out.freeze()
    return out


def check_same_recipe(cfg: CfgNode, saved_world_size: int | None, world_size: int) -> None:
    """Refuse to resume a linear-scaled run on another world size (its recipe would change).

    Args:
        cfg: the (scaled) config of this job.
        saved_world_size: the world size that wrote the checkpoint (None: unknown).
        world_size: this job's.

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
