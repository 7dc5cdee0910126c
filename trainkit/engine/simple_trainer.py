"""``SimpleTrainer``: the one implementation of the optimisation step."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from typing_extensions import override

from trainkit.checkpoint import (
    check_parameter_names,
    optimizer_parameter_names,
    shard_optimizer_state,
)
from trainkit.data.loading.step_batches import StepBatches
from trainkit.engine.gradients import ShardedGradients, StepResult, add_weighted, combiner_for
from trainkit.engine.hooks.checkpointing import check_saves_on_every_rank
from trainkit.engine.period_metrics import LossCheck, MetricsWriter
from trainkit.engine.step_metrics import checked_losses, sum_losses, write_metrics
from trainkit.engine.trainer_base import TrainerBase
from trainkit.modeling.sharding import check_optimizer_of_sharded_model
from trainkit.utils.periodic import is_last_iter, is_period_end
from trainkit.utils.torch_private import queue_backward_callback

__all__ = ["SimpleTrainer", "StepResult"]

logger = logging.getLogger(__name__)

_METRICS_SYNC = "metrics are gathered once per gather_metric_period, never waiting in between"


class SimpleTrainer(TrainerBase):
    """One optimizer step per iteration: batches, forward, backward, hooks, metrics, update.

    The model, in training mode, returns a dict of scalar losses for a batch (or one scalar tensor,
    recorded as ``total_loss``); their sum is back-propagated. ``AMPTrainer`` and users override the
    seams of the one :meth:`run_step`: ``forward_context``, ``compute_losses`` (one micro-batch),
    ``backward``, ``after_backward`` (the hooks, once per step), ``_write_metrics`` (detectron2's)
    and ``optimizer_step``. :meth:`accumulate` is the one way micro-batches run (the failing-step
    replay runs it too); a step of another shape (several optimizers, GANs) overrides ``run_step``
    or starts from ``tools/plain_train_net.py``.

    * **Accumulation**: with ``accumulate_steps=k`` a step draws k micro-batches and sums
      their gradients, each loss weighted by its share of the step's samples: the update of
      one batch k times larger. The :attr:`gradient_combiner` says how gradients combine
      (DDP all-reduces only the last micro-batch). Hooks, schedule and metrics count steps.
    * **Batches** come from :attr:`batches` (:class:`~trainkit.data.loading.step_batches.
      StepBatches`): copied to a device ahead of their step (``DefaultTrainer``: on CUDA);
      its position is the one after the batches consumed, which checkpoints save.
    * **Events**: it announces its phases on :attr:`events` (``data``, ``forward/backward``,
      ``collective``: DDP's wait and a period end's metric sync, ``optimizer``) and its losses,
      which its listeners check and keep (:mod:`~trainkit.engine.period_metrics`).
    * **Metrics** follow detectron2's ``gather_metric_period``: the steps that end a period
      are gathered over ranks then; with ``record_every_step`` (``DefaultTrainer``) every
      step's losses are kept and gathered at each period end and the last iteration.
    * **Non-finite losses** raise :class:`~trainkit.engine.step_metrics.NonFiniteLossError`
      naming the first bad step, read before its update or, with ``deferred_checks``, at
      period ends and by :meth:`flush_pending_checks`, which every checkpoint path calls
      first (:class:`~trainkit.engine.period_metrics.LossCheck`).
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        async_write_metrics: bool = False,
        *,
        record_every_step: bool = False,
        accumulate_steps: int = 1,
        deferred_checks: bool | None = None,
    ) -> None:
        """Set up the step.

        Args:
            model: the model; it must stay in training mode during training.
            data_loader: (micro-)batches, normally infinite; its iterator is made on first use.
            optimizer: the optimizer of ``model``'s parameters.
            gather_metric_period: record (and gather over ranks) metrics every this many iterations.
            zero_grad_before_forward: clear gradients before the forward pass, not after it.
            async_write_metrics: detectron2's; not needed (metrics are gathered once a
                period, with no wait per step): logged, not used.
            record_every_step: see the class docstring.
            accumulate_steps: micro-batches per optimizer step.
            deferred_checks: see :class:`~trainkit.engine.period_metrics.LossCheck`.

        Raises:
            ValueError: If ``gather_metric_period`` or ``accumulate_steps`` is not positive.
        """
        super().__init__()
        if gather_metric_period < 1:
            raise ValueError(f"gather_metric_period must be >= 1, got {gather_metric_period}")
        if accumulate_steps < 1:
            raise ValueError(
                f"SOLVER.ACCUMULATE_STEPS / accumulate_steps must be >= 1, got {accumulate_steps}"
            )
        if async_write_metrics:
            logger.info("async_write_metrics=True is not needed: %s", _METRICS_SYNC)
        model.train()
        self.model = model
        self.batches = StepBatches(data_loader)
        """The step's batches: its loader's iterator, prefetching, the position consumed."""
        self.optimizer = optimizer
        self.gather_metric_period = gather_metric_period
        self.zero_grad_before_forward = zero_grad_before_forward
        self.accumulate_steps = accumulate_steps
        self.gradient_combiner = combiner_for(model)
        if isinstance(self.gradient_combiner, ShardedGradients):
            check_optimizer_of_sharded_model(optimizer, model)
            self.gradient_combiner.announce_gathers(model, lambda name: self.events.phase(name))
        self._loss_check = LossCheck(deferred_checks)
        self._metrics = MetricsWriter(self._loss_check, every_step=record_every_step)
        self.events.bind_step([self._loss_check, self._metrics])
        self.last_result = StepResult()
        """What :meth:`accumulate` did in the latest step (the failure capture reads it)."""

    @property
    def record_every_step(self) -> bool:
        """Keep every step's losses (see the class docstring)."""
        return self._metrics.every_step

    @record_every_step.setter
    def record_every_step(self, value: bool) -> None:
        self._metrics.every_step = value

    @property
    def deferred_checks(self) -> bool | None:
        """Check losses on their device (see ``__init__``)."""
        return self._loss_check.deferred

    @deferred_checks.setter
    def deferred_checks(self, value: bool | None) -> None:
        self._loss_check.deferred = value

    @override
    def run_step(self) -> None:
        if not self.model.training:
            raise RuntimeError(
                "The model was switched to eval mode during training; a hook that evaluates "
                "must restore model.train() (inference_on_dataset does)."
            )
        events = self.events
        events.phase("data")
        start_s = time.perf_counter()
        batches = self.batches.next(self.accumulate_steps, self.iter)
        data_time_s = time.perf_counter() - start_s
        events.phase("forward/backward")
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        self.last_result = result = self.accumulate(batches)
        if result.error is not None:
            raise result.error
        if events.current_phase != "collective":  # DDP's wait announced it already
            events.phase("collective")
        self._write_metrics(result.step_losses, data_time_s)
        events.phase("optimizer")
        self.after_backward()
        self.optimizer_step()
        result.batches = []

    def accumulate(self, batches: Sequence[Any]) -> StepResult:
        """Run a step's micro-batches: forward, weighted backward, gradients combined.

        Gradients are cleared after the first forward pass (before, with
        ``zero_grad_before_forward``); each loss is weighted by the :attr:`gradient_combiner`
        and back-propagated by :meth:`backward`. A micro-batch that raises ends the step:
        the error is returned in the :class:`StepResult`.
        """
        combiner, model, result = self.gradient_combiner, self.model, StepResult(list(batches))
        weights, last = combiner.weights(batches), len(batches) - 1
        for j, batch in enumerate(batches):
            try:
                with combiner.micro_batch(model, j, len(batches)):
                    with self.forward_context():
                        loss_dict = self.compute_losses(batch)
                    if j == 0 and not self.zero_grad_before_forward:
                        self.optimizer.zero_grad()
                    total = sum_losses(loss_dict)
                    loss = total if weights is None else total * weights[j]
                    if j == last and combiner.waits_in_backward(model):
                        mark = functools.partial(self.events.phase, "collective")
                        queue_backward_callback(loss, mark)
                    self.backward(loss)
            except Exception as e:
                result.error = e
                return result
            result.losses.append({name: value.detach() for name, value in loss_dict.items()})
            if weights is None:
                result.step_losses = result.losses[-1]
            else:
                add_weighted(result.step_losses, loss_dict, weights[j])
        combiner.finish()
        return result

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Return the context the forward pass runs in (none here; autocast in AMPTrainer)."""
        return contextlib.nullcontext()

    def compute_losses(self, batch: Any) -> dict[str, torch.Tensor]:
        """Run the model on one (micro-)batch; return its checked losses (``checked_losses``)."""
        return checked_losses(self.model(batch))

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's loss, already weighted for accumulation."""
        loss.backward()

    def optimizer_step(self) -> None:
        """Apply the accumulated gradients."""
        self.optimizer.step()

    @property
    def data_loader(self) -> Iterable[Any]:
        """The train loader; assigning one releases the old one's iterator (and workers)."""
        return self.batches.loader

    @data_loader.setter
    def data_loader(self, data_loader: Iterable[Any]) -> None:
        self.batches.replace(data_loader)

    @property
    def _data_loader_iter(self) -> Iterator[Any]:  # detectron2's: projects draw from it
        return self.batches.iterator

    @override
    def loader_state_dict(self) -> dict[str, Any] | None:
        return self.batches.position()

    def reset_data_loader(self, data_loader_builder: Callable[[], Iterable[Any]]) -> None:
        """Replace the data loader by ``data_loader_builder()``, releasing the old one first."""
        self.data_loader = ()
        self.data_loader = data_loader_builder()

    def _write_metrics(
        self,
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        prefix: str = "",
        iter: int | None = None,  # noqa: A002 - detectron2's name
    ) -> None:
        """Record a step's losses, their sum and the data time on :attr:`events`.

        :meth:`run_step` calls it once per step (a subclass's override runs, as in
        detectron2); a step that ends a period files what was kept (class docstring).

        Args:
            loss_dict: the step's losses (averaged over its micro-batches).
            data_time: seconds spent waiting for this step's batches.
            prefix: prepended to ``total_loss`` (detectron2's convention).
            iter: the step (default: the current iteration).
        """
        cur_iter = self.iter if iter is None else iter
        self.events.losses(cur_iter, loss_dict, sum_losses(loss_dict), data_time, prefix)
        if is_period_end(cur_iter, self.gather_metric_period) or (
            self.record_every_step and is_last_iter(cur_iter, self.max_iter)
        ):
            self._end_period(cur_iter)

    def _end_period(self, cur_iter: int) -> None:  # collective: every rank, the same steps
        self.events.period_end(cur_iter, self.storage)

    @override
    def _end_early(self) -> None:  # a stop requested before the next period end
        self._end_period(self.iter)

    write_metrics = staticmethod(write_metrics)

    @override
    def flush_pending_checks(self, *, collective: bool = True) -> None:
        """Raise now if a step since the last check had a non-finite loss (deferred checks).

        See :meth:`LossCheck.check <trainkit.engine.period_metrics.LossCheck.check>`; it
        waits for the device only when steps are pending.
        """
        self._loss_check.check(collective=collective)

    @override
    def after_train(self) -> None:
        # Training ended: check the steps since the last period end too; the hooks'
        # after_train (writers, checkpoint waits) still runs when this raises.
        try:
            self.flush_pending_checks()
        finally:
            super().after_train()

    @override
    def _check_before_train(self) -> None:
        check_saves_on_every_rank(self._hooks, self.model)

    @override
    def state_dict(self) -> dict[str, Any]:
        # The last guard for a checkpoint saved by code that did not flush first: this rank's
        # pending steps (the checkpoint paths flush every rank's before).
        self._loss_check.check(collective=False)
        state = super().state_dict()
        state["optimizer"] = self.optimizer.state_dict()
        # Which parameter each of the optimizer state's indices is: a resume under another
        # optimizer layout is caught, and tools/convert_checkpoint.py maps states by name.
        state["parameter_names"] = optimizer_parameter_names(self.optimizer, self.model)
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "optimizer" in state:
            check_parameter_names(state.get("parameter_names"), self.optimizer, self.model)
            optimizer_state = state["optimizer"]
            if isinstance(self.gradient_combiner, ShardedGradients):
                # From a file or an unsharded run: whole tensors; this rank keeps its shards.
                optimizer_state = shard_optimizer_state(self.optimizer, optimizer_state)
            self.optimizer.load_state_dict(optimizer_state)
        else:
            logger.warning("The trainer state holds no optimizer state; the optimizer starts fresh")
