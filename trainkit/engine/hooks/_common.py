"""The "is it time?" rule the built-in periodic hooks share."""

from __future__ import annotations

from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils.periodic import is_last_iter, is_period_end


def is_time(trainer: TrainerBase, period: int, max_iter: int | None = None) -> bool:
    """Whether the step just finished ends a ``period`` or is the last (of the trainer's run)."""
    last = trainer.max_iter if max_iter is None else max_iter
    return is_period_end(trainer.iter, period) or is_last_iter(trainer.iter, last)
