"""Helpers shared by the built-in hooks."""

from __future__ import annotations

from typing import Any, Callable

from trainkit.engine.hook_base import HookBase
from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils.periodic import is_last_iter, is_period_end

TrainerCallback = Callable[[TrainerBase], None]


def trainer_attr(hook: HookBase, name: str) -> Any:
    # Only the declared surface is read; say which hook needs what instead of a bare
    # AttributeError from deep inside a hook.
    try:
        return getattr(hook.trainer, name)
    except AttributeError:
        raise AttributeError(
            f"{type(hook).__name__} needs trainer.{name}, which "
            f"{type(hook.trainer).__name__} does not have; pass it to the hook explicitly."
        ) from None


def is_time(trainer: TrainerBase, period: int) -> bool:
    return is_period_end(trainer.iter, period) or is_last_iter(trainer.iter, trainer.max_iter)
