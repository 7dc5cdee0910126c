"""The padding rule of compiled models: the few batch shapes every batch is padded to.

A compiled graph has fixed shapes (``dynamic=False``), so each new batch shape costs a
compile, and Dynamo stops compiling (runs eager) once a function has
``torch._dynamo.config.recompile_limit`` graphs. :class:`ShapePlan` fixes the shapes in
advance, from the config alone:

1. Long sides ("levels"): the multiples of ``divisibility`` from ``min_side`` to
   ``max_side``, both rounded up to it. In training ``max_side`` is
   ``INPUT.MAX_SIZE_TRAIN * INPUT.RANDOM_SCALE[1]`` and ``min_side`` the same with
   ``RANDOM_SCALE[0]``; in evaluation both are ``INPUT.MAX_SIZE_TEST``.
2. One canvas ``(H, W)`` per aspect-ratio bucket and level ``L``: a portrait bucket
   ``w/h < hi <= 1`` gets ``(L, round(L * hi))``, a landscape bucket ``lo <= w/h`` with
   ``lo >= 1`` gets ``(round(L / lo), L)``, the bucket holding ratio 1 gets ``(L, L)``; sides
   are rounded up to ``divisibility``, duplicates merged. The buckets are
   ``DATALOADER.ASPECT_RATIO_BINS`` (with grouping off, one bucket: ``(L, L)`` only).
3. While there are more canvases than ``budget`` (the recompile limit minus one, a spare for a
   shape the plan did not foresee), the smallest one that
   fits inside another is dropped: its batches go to the next larger canvas.
4. A batch is padded to the canvas of least area holding its largest height and width, and
   its batch dimension to ``batch_size`` with empty samples (their mask is all zero).

So a compiled function gets at most ``len(plan.canvases)`` graphs, a number logged when the
model is compiled. A batch that fits no canvas (an image larger than the config allows) is
rounded up to ``divisibility`` as without a plan, with a warning: it costs a compile.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ShapePlan", "plan_canvases", "shape_plans_from_config"]

logger = logging.getLogger(__name__)


def _round_up(value: float, divisibility: int) -> int:
    return int(math.ceil(value / divisibility - 1e-9)) * divisibility


def plan_canvases(
    min_side: float,
    max_side: float,
    aspect_ratio_bins: Sequence[float],
    divisibility: int,
    budget: int,
) -> list[tuple[int, int]]:
    """Return the canvases ``(H, W)`` of steps 1-3 of the rule above, smallest area first.

    Args:
        min_side, max_side: the shortest and longest long side of a batch, in pixels.
        aspect_ratio_bins: increasing ``width / height`` boundaries of the buckets; empty
            for one bucket.
        divisibility: every side is a multiple of it.
        budget: at most this many canvases (>= 1).

    Returns:
        The canvases, sorted by area, then height.
    """
    top = _round_up(max_side, divisibility)
    low = min(_round_up(min_side, divisibility), top)
    bins = sorted(float(b) for b in aspect_ratio_bins)
    # (lo, hi) of each bucket; 0 and inf at the ends.
    bounds = list(zip([0.0, *bins], [*bins, math.inf]))
    canvases: set[tuple[int, int]] = set()
    for level in range(low, top + 1, divisibility):  # the long sides
        for lo, hi in bounds:
            # Sides are whole pixels: a bin given as 1.333 still holds a 64 x 48 image.
            if hi <= 1.0:  # portrait: width < hi * height
                canvases.add((level, min(level, _round_up(round(level * hi), divisibility))))
            elif lo >= 1.0:  # landscape: height <= width / lo
                canvases.add((min(level, _round_up(round(level / lo), divisibility)), level))
            else:
                canvases.add((level, level))
    ordered = sorted(canvases, key=lambda c: (c[0] * c[1], c))
    while len(ordered) > max(1, budget):
        for i, (h, w) in enumerate(ordered):
            if any(h <= oh and w <= ow for oh, ow in ordered[i + 1 :]):
                del ordered[i]
                break
        else:  # no canvas fits in another (cannot happen: the (top, top) canvas holds all)
            break
    return ordered


@dataclass
class ShapePlan:
    """The canvases and batch size every batch of one mode (training or evaluation) gets.

    Attributes:
        canvases: ``(H, W)`` shapes a batch may be padded to, smallest area first.
        batch_size: images per batch after padding; 0 keeps each batch's own size.
        divisibility: the rounding of a batch that fits no canvas.
    """

    canvases: list[tuple[int, int]]
    batch_size: int
    divisibility: int
    _warned: set[tuple[int, int]] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.canvases = sorted(
            ((int(h), int(w)) for h, w in self.canvases), key=lambda c: (c[0] * c[1], c)
        )

    @property
    def num_shapes(self) -> int:
        """How many distinct batch shapes (so compiled graphs) the plan allows."""
        return len(self.canvases)

    def batch_shape(self, height: int, width: int, num_images: int) -> tuple[int, int, int]:
        """Return ``(N, H, W)`` for a batch whose largest image is ``height`` x ``width``.

        ``N`` is ``batch_size`` (or ``num_images`` if it is larger, or no batch size is
        planned); ``(H, W)`` is the planned canvas of least area holding the images, or
        their size rounded up to ``divisibility`` if none does (logged once per shape).
        """
        n = max(self.batch_size, num_images)
        for h, w in self.canvases:
            if height <= h and width <= w:
                return n, h, w
        shape = (_round_up(height, self.divisibility), _round_up(width, self.divisibility))
        if shape not in self._warned:
            self._warned.add(shape)
            logger.warning(
                "compile: a batch of %dx%d images fits none of the planned shapes %s; it is "
                "padded to %s and compiles a new graph. Lower INPUT.MAX_SIZE_* or raise them "
                "to cover the images.",
                height,
                width,
                self.canvases,
                shape,
            )
        return n, shape[0], shape[1]


def shape_plans_from_config(
    cfg: Any, divisibility: int | None = None
) -> tuple[ShapePlan | None, ShapePlan | None]:
    """Return the (training, evaluation) plans of ``cfg``; None where the size is uncapped.

    Training: ``INPUT.MAX_SIZE_TRAIN`` times ``INPUT.RANDOM_SCALE``, a batch of
    ``SOLVER.IMS_PER_BATCH / (world size * SOLVER.ACCUMULATE_STEPS)`` images, the buckets of
    ``DATALOADER.ASPECT_RATIO_BINS`` (one bucket without ``ASPECT_RATIO_GROUPING``).
    Evaluation: ``INPUT.MAX_SIZE_TEST``, ``TEST.IMS_PER_BATCH`` images, the same buckets (a
    test batch mixes ratios; its canvas is then the square one). The budget of each is
    ``torch._dynamo.config.recompile_limit`` minus one: the spare graph takes a shape the
    plan did not foresee, so a method that reaches the limit (warned about by
    ``CompileMetrics``) has really met more shapes than planned.

    Args:
        cfg: the config.
        divisibility: canvas sides are multiples of it; None reads
            ``MODEL.CLASSIFIER.SIZE_DIVISIBILITY`` (a ViT passes its patch size).
    """
    from trainkit.modeling.compile import recompile_limit
    from trainkit.utils import comm

    budget = max(1, recompile_limit() - 1)
    if divisibility is None:
        divisibility = int(cfg.MODEL.CLASSIFIER.SIZE_DIVISIBILITY)
    bins = list(cfg.DATALOADER.ASPECT_RATIO_BINS) if cfg.DATALOADER.ASPECT_RATIO_GROUPING else []
    low, high = (float(s) for s in cfg.INPUT.RANDOM_SCALE)
    per_rank = comm.get_world_size() * int(cfg.SOLVER.ACCUMULATE_STEPS)
    plans: list[ShapePlan | None] = []
    for max_size, scales, batch in (
        (int(cfg.INPUT.MAX_SIZE_TRAIN), (low, high), int(cfg.SOLVER.IMS_PER_BATCH) // per_rank),
        (int(cfg.INPUT.MAX_SIZE_TEST), (1.0, 1.0), int(cfg.TEST.IMS_PER_BATCH)),
    ):
        if max_size <= 0:
            logger.warning(
                "compile: INPUT.MAX_SIZE_* is 0 (no cap), so the batch shapes cannot be "
                "planned and each new size compiles a graph; set a cap to bound them."
            )
            plans.append(None)
            continue
        canvases = plan_canvases(
            max_size * scales[0], max_size * scales[1], bins, divisibility, budget
        )
        plans.append(ShapePlan(canvases, max(batch, 1), divisibility))
    return plans[0], plans[1]
