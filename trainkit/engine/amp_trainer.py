"""``AMPTrainer``: :class:`SimpleTrainer` with automatic mixed precision, done right."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.utils.periodic import is_period_end

__all__ = ["AMPTrainer"]

logger = logging.getLogger(__name__)


def default_precision(device_type: str) -> torch.dtype:
    """Return ``AMPTrainer``'s default autocast dtype: float16 on CUDA, bfloat16 elsewhere."""
    return torch.float16 if device_type == "cuda" else torch.bfloat16


class AMPTrainer(SimpleTrainer):
    """:class:`SimpleTrainer` with automatic mixed precision.

    The forward pass runs under ``torch.autocast`` in ``precision``: by default float16 on
    CUDA and bfloat16 on the CPU (bfloat16 has float32's exponent range and needs no loss
    scaling). float16 — on CUDA, or on the CPU when asked for — scales the loss with a
    ``GradScaler`` (a new one unless given), and then:

    * gradients are unscaled before ``after_backward`` hooks run, so a hook that clips,
      logs or checks gradients sees their true values (config clipping, inside the
      optimizer step, sees them too);
    * a step the scaler skips (inf/NaN gradients) is logged and counted: the count is
      recorded as ``[metric]amp_skipped_steps`` with the other metrics. The iteration and
      the LR schedule advance as for any step (torch's ``GradScaler`` convention).
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        grad_scaler: torch.amp.GradScaler | None = None,
        precision: torch.dtype | None = None,
        log_grad_scaler: bool = False,
        async_write_metrics: bool = False,
        *,
        record_every_step: bool = False,
        accumulate_steps: int = 1,
    ) -> None:
        """Set up the step; the arguments not listed here are :class:`SimpleTrainer`'s.

        Args:
            model: the model, already on its device (which picks the autocast device).
            grad_scaler: the loss scaler; by default a new one with float16, none otherwise.
            precision: the autocast dtype; ``None``: :func:`default_precision`.
            log_grad_scaler: record the loss scale as ``[metric]grad_scaler`` whenever
                metrics are recorded.
        """
        super().__init__(
            model,
            data_loader,
            optimizer,
            gather_metric_period,
            zero_grad_before_forward,
            async_write_metrics,
            record_every_step=record_every_step,
            accumulate_steps=accumulate_steps,
        )
        param = next(model.parameters(), None)
        self.autocast_device = param.device.type if param is not None else "cpu"
        self.precision = precision = precision or default_precision(self.autocast_device)
        if grad_scaler is None and precision == torch.float16:
            grad_scaler = torch.amp.GradScaler(self.autocast_device)
        self.grad_scaler = grad_scaler
        self.log_grad_scaler = log_grad_scaler
        self.num_skipped_steps = 0

    @override
    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=self.autocast_device, dtype=self.precision)

    @override
    def backward(self, loss: torch.Tensor) -> None:
        if self.grad_scaler is None:
            super().backward(loss)
        else:
            self.grad_scaler.scale(loss).backward()

    @override
    def after_backward(self) -> None:
        if self.grad_scaler is not None:
            # Once per step, after the last micro-batch: the scaler then knows not to
            # unscale again in step(), and hooks see true gradients.
            self.grad_scaler.unscale_(self.optimizer)
        super().after_backward()

    @override
    def optimizer_step(self) -> None:
        scaler = self.grad_scaler
        if scaler is None:
            super().optimizer_step()
            return
        scale_before = scaler.get_scale()
        scaler.step(self.optimizer)
        scaler.update()
        # The scaler lowers its scale exactly when it found inf/NaN and skipped the step.
        if (scale := scaler.get_scale()) < scale_before:
            self.num_skipped_steps += 1
            logger.warning(
                "Iteration %d: the gradient scaler found inf/NaN gradients and skipped the "
                "optimizer step (%d skipped so far); loss scale %g -> %g",
                self.iter,
                self.num_skipped_steps,
                scale_before,
                scale,
            )

    @override
    def record_metrics(
        self,
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        prefix: str = "",
        *,
        total_loss: torch.Tensor | None = None,
    ) -> None:
        super().record_metrics(loss_dict, data_time, prefix, total_loss=total_loss)
        if self.grad_scaler is None or not is_period_end(self.iter, self.gather_metric_period):
            return
        # Counted up to the previous step: this step's update has not happened yet.
        self.storage.put_scalar("[metric]amp_skipped_steps", self.num_skipped_steps, False)
        if self.log_grad_scaler:
            self.storage.put_scalar("[metric]grad_scaler", self.grad_scaler.get_scale(), False)

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
            state["amp_skipped_steps"] = self.num_skipped_steps
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.grad_scaler is not None and "grad_scaler" in state:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
            self.num_skipped_steps = int(state.get("amp_skipped_steps", 0))
