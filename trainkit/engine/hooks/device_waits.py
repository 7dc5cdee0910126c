"""Count the host-device waits of training steps, the model's apart from the trainer's."""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

import torch
from typing_extensions import override

from trainkit.engine.events import StepListener
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.utils.periodic import is_last_iter, is_period_end
from trainkit.utils.torch_private import CUDA_SYNC_WARNING

__all__ = ["DeviceWaitCounter"]

logger = logging.getLogger(__name__)


class DeviceWaitCounter(HookBase, StepListener):
    """Count each step's host-device waits, the model's apart from the trainer's.

    A diagnosis hook (not a default one) that listens to the loop's events: with CUDA it turns
    on ``torch.cuda.set_sync_debug_mode("warn")`` from one step's ``data`` phase to the next's,
    so every wait of the step, its hooks included, warns. A warning in phase
    ``forward/backward`` (the model's forward and backward passes) counts as the model's, any
    other as the trainer's; the first of each kind is logged with its source line. trainkit's
    own step waits for nothing between periods (``tests/gpu/test_step.py``), so a count under
    ``"trainer"`` points to a hook or a step override.

    Attributes:
        waits: ``{"model": n, "trainer": m}`` over the counted steps.
        num_steps_counted: how many steps were counted.
    """

    priority = HookPriority.HIGHEST

    def __init__(self, period: int, warmup_iter: int = 2) -> None:
        """Count every step but the first ``warmup_iter``, the last and those ending a ``period``.

        Args:
            period: the writer period (``WRITER_PERIOD``): its last steps wait by design
                (metrics are read then, and checkpoints written).
            warmup_iter: the first steps, not counted: they create the optimizer's state,
                the scaler's and the CUDA libraries' handles (cuDNN's autotuning with
                ``CUDNN_BENCHMARK``), once per run.
        """
        self._period = period
        self._warmup_iter = warmup_iter
        self.waits = {"model": 0, "trainer": 0}
        self.num_steps_counted = 0
        self._window: contextlib.ExitStack | None = None
        self._previous_showwarning: Any = None
        self._phase = "start"

    @override
    def before_train(self) -> None:
        self.trainer.events.subscribe(self)

    @override
    def on_phase(self, phase: str, iteration: int) -> None:
        self._phase = phase
        if phase != "data":
            return
        self._close_window()
        trainer = self.trainer
        if iteration < trainer.start_iter + self._warmup_iter:
            return
        if is_period_end(iteration, self._period) or is_last_iter(iteration, trainer.max_iter):
            return
        self._window = stack = contextlib.ExitStack()
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("always")  # a wait at the same line every step counts each time
        self._previous_showwarning = warnings.showwarning
        warnings.showwarning = self._on_warning
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, 0)
        self.num_steps_counted += 1

    @override
    def after_train(self) -> None:
        self._close_window()
        if self.num_steps_counted:
            logger.info(
                "Host-device waits in %d steps between writer periods: %d in the model, %d in "
                "the trainer (its step and hooks)",
                self.num_steps_counted,
                self.waits["model"],
                self.waits["trainer"],
            )

    def _close_window(self) -> None:
        if self._window is not None:
            window, self._window = self._window, None
            window.close()

    def _on_warning(
        self, message: Any, category: Any, filename: str, lineno: int, *args: Any
    ) -> None:
        if CUDA_SYNC_WARNING not in str(message):
            self._previous_showwarning(message, category, filename, lineno, *args)
            return
        who = "model" if self._phase == "forward/backward" else "trainer"
        self.waits[who] += 1
        if self.waits[who] == 1:
            whose = "the model's (its forward or backward pass), not the trainer's"
            if who == "trainer":
                whose = "the trainer's (its step or a hook), not the model's"
            where, iteration = f"{filename}:{lineno}", self.trainer.iter
            logger.warning("Iteration %d waited for the device at %s: %s", iteration, where, whose)
