"""``AMPTrainer``: :class:`SimpleTrainer` with automatic mixed precision, done right."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from trainkit.checkpoint import is_sharded
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.utils.torch_private import grad_scaler_found_inf, steps_with_scaler_state

__all__ = ["AMPTrainer"]

logger = logging.getLogger(__name__)


def default_precision(device_type: str) -> torch.dtype:
    """Return ``AMPTrainer``'s default autocast dtype: float16 on CUDA, bfloat16 elsewhere."""
    return torch.float16 if device_type == "cuda" else torch.bfloat16


class AMPTrainer(SimpleTrainer):
    """:class:`SimpleTrainer` with automatic mixed precision.

    The forward pass runs under ``torch.autocast`` in ``precision``: by default float16 on CUDA and
    bfloat16 on the CPU (bfloat16 has float32's exponent range and needs no loss scaling); a
    model sharded by :func:`~trainkit.modeling.shard_model` runs without autocast, computing
    in the ``param_dtype`` it was sharded with. float16, on any device, scales the loss with a
    ``GradScaler`` (a new one unless given), and then:

    * gradients are unscaled before ``after_backward`` hooks run, so a hook that clips, logs or
      checks gradients sees their true values (so does config clipping, in the optimizer step);
    * a step the scaler skips (inf/NaN gradients) is counted on the device, without a wait:
      the count is read when metrics are synchronised, recorded as ``[metric]amp_skipped_steps``
      and logged as a warning when it grew. The iteration and the LR schedule advance as for
      any step (torch's ``GradScaler`` convention).

    The step never waits for the device when the optimizer takes the scaler's state on the
    device (torch's fused optimizers, ``fused=True``: what ``build_optimizer`` builds on CUDA);
    with another optimizer ``GradScaler.step`` reads whether to skip, a wait per step.
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
        deferred_checks: bool | None = None,
    ) -> None:
        """Set up the step; the arguments not listed here are :class:`SimpleTrainer`'s.

        Args:
            model: the model, already on its device (which picks the autocast device).
            grad_scaler: the loss scaler; by default a new one with float16, none otherwise.
            precision: the autocast dtype; ``None``: :func:`default_precision`.
            log_grad_scaler: record the loss scale as ``[metric]grad_scaler`` with the metrics.
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
            deferred_checks=deferred_checks,
        )
        param = next(model.parameters(), None)
        self._sharded = is_sharded(model)
        self.autocast_device = param.device.type if param is not None else "cpu"
        self.precision = precision = precision or default_precision(self.autocast_device)
        if grad_scaler is None and precision == torch.float16:
            grad_scaler = torch.amp.GradScaler(self.autocast_device)
        self.grad_scaler = grad_scaler
        self.log_grad_scaler = log_grad_scaler
        self._skipped_on_device: torch.Tensor | None = None  # skipped steps, read at period ends
        self._skipped_read = 0  # the count last read (what the warnings compare against)
        self._report_from_iter = 0  # the first iteration the next warning covers
        self._skipped_before_device = 0  # loaded from a checkpoint, added to the device count
        if grad_scaler is not None and not steps_with_scaler_state(optimizer):
            logger.info(
                "%s is not a fused optimizer: GradScaler.step reads whether to skip each "
                "float16 step, a wait for the device per step (build it with fused=True).",
                type(optimizer).__name__,
            )

    @property
    def num_skipped_steps(self) -> int:
        """Optimizer steps the gradient scaler skipped so far (reading it waits for the device)."""
        on_device = self._skipped_on_device
        return self._skipped_before_device + (int(on_device.item()) if on_device is not None else 0)

    @override
    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        if self._sharded:  # FSDP casts the gathered parameters (shard_model's param_dtype)
            return contextlib.nullcontext()
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
            # Once per step, after the last micro-batch: hooks see true gradients, and the
            # scaler knows not to unscale again in step().
            self.grad_scaler.unscale_(self.optimizer)
        super().after_backward()

    @override
    def optimizer_step(self) -> None:
        scaler = self.grad_scaler
        if scaler is None:
            super().optimizer_step()
            return
        scaler.step(self.optimizer)
        found_inf = _found_inf(scaler, self.optimizer)  # before update(), which clears it
        scaler.update()
        if found_inf is not None:
            skipped, found = self._skipped_on_device, found_inf.to(torch.long)
            self._skipped_on_device = found if skipped is None else skipped + found

    @override
    def _end_period(self, cur_iter: int) -> None:
        super()._end_period(cur_iter)
        if self.grad_scaler is None:
            return
        # Counted up to the previous step: this step's update has not happened yet.
        skipped = self.num_skipped_steps
        self.storage.put_scalar("[metric]amp_skipped_steps", skipped, False)
        if skipped > self._skipped_read:
            first, last = self._report_from_iter, cur_iter - 1
            logger.warning(
                "The gradient scaler found inf/NaN gradients and skipped %d optimizer step(s) "
                "in %s (%d so far); loss scale now %g",
                skipped - self._skipped_read,
                f"iteration {last}" if first >= last else f"iterations {first}-{last}",
                skipped,
                self.grad_scaler.get_scale(),
            )
        self._skipped_read, self._report_from_iter = skipped, cur_iter
        if self.log_grad_scaler:
            self.storage.put_scalar("[metric]grad_scaler", self.grad_scaler.get_scale(), False)

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
            state["amp_skipped_steps"] = self.num_skipped_steps  # at a save: a wait is fine
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.grad_scaler is not None and "grad_scaler" in state:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
            self._skipped_before_device = int(state.get("amp_skipped_steps", 0))
            self._skipped_on_device = None
            self._skipped_read = self._skipped_before_device
            self._report_from_iter = int(state.get("iteration", -1)) + 1


def _found_inf(
    scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer
) -> torch.Tensor | None:
    """Return 1 on the device if ``scaler`` skipped ``optimizer``'s step, else 0 (no wait).

    ``None`` when nothing was checked (no scaling, or no parameter had a gradient).
    """
    values = grad_scaler_found_inf(scaler, optimizer) if scaler.is_enabled() else None
    if not values:
        return None
    # Several devices (model parallel): each one's flag, summed on the first's.
    found = sum((value.to(values[0].device, non_blocking=True) for value in values[1:]), values[0])
    return (found > 0).reshape(())
