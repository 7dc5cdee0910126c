"""``SimpleTrainer``: the one implementation of the optimisation step."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from trainkit.data.loading.device_prefetch import DevicePrefetcher
from trainkit.engine.accumulation import add_weighted, micro_batch_weights
from trainkit.engine.period_metrics import PeriodMetrics
from trainkit.engine.phase_clock import mark_when_backward_computed
from trainkit.engine.step_metrics import gather_and_file, host_values, metric_names, sum_losses
from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils.events import get_event_storage
from trainkit.utils.periodic import is_last_iter, is_period_end

if TYPE_CHECKING:
    from trainkit.engine.stragglers import RankFigures

__all__ = ["SimpleTrainer"]

logger = logging.getLogger(__name__)


def _warn_if_write_metrics_is_overridden(cls: type) -> None:
    # detectron2's run_step calls _write_metrics; this one calls record_metrics, so an
    # override of _write_metrics alone would be skipped without a word.
    overrides = cls._write_metrics is not SimpleTrainer._write_metrics
    if overrides and cls.run_step is SimpleTrainer.run_step:
        logger.warning(
            "%s overrides _write_metrics, which SimpleTrainer.run_step does not call "
            "(it calls record_metrics); override record_metrics instead.",
            cls.__name__,
        )


class SimpleTrainer(TrainerBase):
    """One optimizer step per iteration: batches, forward, backward, hooks, metrics, update.

    The model, in training mode, returns a dict of scalar losses for a batch (or one scalar
    tensor, recorded as ``total_loss``); their sum is back-propagated. ``AMPTrainer`` and
    users override the seams of the one :meth:`run_step`: ``forward_context``,
    ``compute_losses`` (one micro-batch), ``backward``, ``after_backward`` (the hooks, once
    per step), ``record_metrics`` and ``optimizer_step``; a step of another shape (several
    optimizers, GANs) overrides ``run_step`` or starts from ``tools/plain_train_net.py``.

    **Accumulation.** With ``accumulate_steps=k`` an iteration draws k micro-batches and sums
    their gradients, each loss weighted by its share of the step's samples (``1/k`` for equal
    sizes): the update of one batch k times larger. DDP all-reduces only the last
    micro-batch (``no_sync``). Hooks, the schedule and the metrics count steps.

    **Prefetching.** With ``prefetch_device`` set (``DefaultTrainer``: on CUDA, unless
    ``DATALOADER.PREFETCH_TO_DEVICE`` is off) the loader's iterator is wrapped in a
    :class:`~trainkit.data.loading.device_prefetch.DevicePrefetcher`: the next batch is drawn and
    copied to that device while the current step runs. :meth:`loader_state_dict` is the
    loader's position after the batches consumed, which checkpoints save.

    **Metrics** follow detectron2's ``gather_metric_period``: only the steps that end a period
    are recorded, each gathered over ranks then. With ``record_every_step=True``
    (``DefaultTrainer``) every step's losses are kept and synchronised at the end of each
    period and at the last iteration, so a CUDA step never waits for the device. They are
    kept, checked and filed by :class:`~trainkit.engine.period_metrics.PeriodMetrics`.

    **Non-finite losses** raise :class:`~trainkit.engine.step_metrics.NonFiniteLossError` (a
    ``FloatingPointError``) naming the first bad step and its loss terms. With
    ``deferred_checks`` (by default: when the loss is on a device, not the CPU) no loss is
    read per step: the first bad step is noted on the device
    (:class:`~trainkit.engine.deferred_checks.DeferredLossCheck`) and read when metrics are
    synchronised and by :meth:`flush_pending_checks`, which every checkpoint path calls
    first; up to ``period - 1`` updates from the bad step on may have been applied by then,
    but no checkpoint holds them. Without, each step's loss is read before its update.

    **Phases.** ``phase_listener`` (``DefaultTrainer``: the watchdog's ``enter``) hears each
    phase start: ``data``, ``forward/backward``, ``collective`` (DDP's wait for the gradient
    all-reduce after this rank's backward; the period's metrics sync), ``optimizer``.
    ``rank_figures`` (the straggler detector) travel with each period's metrics.
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
            zero_grad_before_forward: clear gradients before the forward pass, not after it
                (matters only when the forward pass itself reads gradients).
            async_write_metrics: accepted for detectron2 compatibility; metrics are written
                synchronously (a background gather would interleave with DDP's collectives
                on the same process group).
            record_every_step: see the class docstring.
            accumulate_steps: micro-batches per optimizer step.
            deferred_checks: check losses for NaN/inf on their device, read at the period
                end and before checkpoints (True), or read every step (False); ``None``:
                True for losses on a device, False on the CPU (where reading costs nothing).

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
        del async_write_metrics
        _warn_if_write_metrics_is_overridden(type(self))
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.gather_metric_period = gather_metric_period
        self.zero_grad_before_forward = zero_grad_before_forward
        self.record_every_step = record_every_step
        self.accumulate_steps = accumulate_steps
        self.deferred_checks = deferred_checks
        self._period_metrics = PeriodMetrics()
        self._data_loader_iter_obj: Iterator[Any] | None = None
        self._step_batches: list[Any] = []  # the micro-batches of the step in progress
        # Where batches are moved ahead of their step (None: used as the loader gives them;
        # "cpu": drawn ahead without a copy, which the CPU tests of resuming use).
        self.prefetch_device: torch.device | None = None
        self._num_batches_read = 0
        self.phase_listener: Callable[[str], None] | None = None
        self.rank_figures: RankFigures | None = None

    # ---- the step -------------------------------------------------------------------------
    @override
    def run_step(self) -> None:
        if not self.model.training:
            raise RuntimeError(
                "The model was switched to eval mode during training; a hook that evaluates "
                "must restore model.train() (inference_on_dataset does)."
            )
        self._enter_phase("data")
        batches, data_time_s = self._next_batches()
        self._enter_phase("forward/backward")
        # Kept while the step runs: a failure's capture records their shapes (failed_steps).
        self._step_batches = batches
        weights = micro_batch_weights(batches)
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        step_losses: dict[str, torch.Tensor] = {}
        total_loss: torch.Tensor | None = None
        for j, batch in enumerate(batches):
            is_last = j == len(batches) - 1
            with self._gradient_sync(is_last=is_last):
                with self.forward_context():
                    loss_dict = self.compute_losses(batch)
                if j == 0 and not self.zero_grad_before_forward:
                    self.optimizer.zero_grad()
                total = sum_losses(loss_dict)
                loss = total if weights is None else total * weights[j]
                if is_last:
                    self._mark_gradient_wait(loss)
                self.backward(loss)
            if weights is None:
                step_losses, total_loss = loss_dict, total
            else:
                add_weighted(step_losses, loss_dict, weights[j])
        self._enter_phase("optimizer")
        self.after_backward()
        self.record_metrics(step_losses, data_time_s, total_loss=total_loss)
        self.optimizer_step()
        self._step_batches = []

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Return the context the forward pass runs in (none here; autocast in AMPTrainer)."""
        return contextlib.nullcontext()

    def compute_losses(self, batch: Any) -> dict[str, torch.Tensor]:
        """Run the model on one (micro-)batch and return its checked dict of scalar losses.

        Raises:
            TypeError: If the model returns neither a dict nor a tensor.
            ValueError: If the dict is empty or a loss is not a one-element tensor.
        """
        output = self.model(batch)
        loss_dict = {"total_loss": output} if isinstance(output, torch.Tensor) else output
        if not isinstance(loss_dict, Mapping):
            raise TypeError(
                "In training mode the model must return a dict of scalar losses or one "
                f"scalar tensor, got {type(output).__name__}"
            )
        if not loss_dict:
            raise ValueError("The model returned an empty loss dict; there is nothing to train")
        for name, loss in loss_dict.items():
            # numel() reads shape metadata only, so this check does not sync the device.
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError(f"Loss {name!r} must be a one-element tensor, got {loss!r}")
        return dict(loss_dict)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's loss, already weighted for accumulation."""
        loss.backward()

    def optimizer_step(self) -> None:
        """Apply the accumulated gradients."""
        self.optimizer.step()

    def _enter_phase(self, phase: str) -> None:
        if self.phase_listener is not None:
            self.phase_listener(phase)

    def _mark_gradient_wait(self, loss: torch.Tensor) -> None:
        # Only DDP waits for peers inside backward (the gradient all-reduce).
        if self.phase_listener is not None and isinstance(self.model, DistributedDataParallel):
            mark_when_backward_computed(loss, functools.partial(self.phase_listener, "collective"))

    def _gradient_sync(self, *, is_last: bool) -> contextlib.AbstractContextManager[Any]:
        # DDP all-reduces on every backward unless told not to: only the last micro-batch
        # of a step needs the reduced gradients.
        if not is_last and isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    # ---- data -----------------------------------------------------------------------------
    @property
    def _data_loader_iter(self) -> Iterator[Any]:
        # Created on first use, not in __init__: starting loader workers is expensive and a
        # trainer built only to evaluate or to load a checkpoint never needs them.
        if self._data_loader_iter_obj is None:
            iterator = iter(self.data_loader)
            if self.prefetch_device is not None:
                iterator = DevicePrefetcher(iterator, self.prefetch_device, loader=self.data_loader)
            self._data_loader_iter_obj = iterator
        return self._data_loader_iter_obj

    def _next_batches(self) -> tuple[list[Any], float]:
        start_s = time.perf_counter()
        batches = []
        for _ in range(self.accumulate_steps):
            try:
                batches.append(next(self._data_loader_iter))
            except StopIteration:
                raise RuntimeError(
                    f"The data loader ran out after {self._num_batches_read} batches at "
                    f"iteration {self.iter}; a training loader must be infinite (use "
                    "TrainingSampler)."
                ) from None
            self._num_batches_read += 1
        return batches, time.perf_counter() - start_s

    def reset_data_loader(self, data_loader_builder: Callable[[], Iterable[Any]]) -> None:
        """Replace the data loader by ``data_loader_builder()``, releasing the old one first."""
        self.close_data_iterator()
        self.data_loader = ()
        self.data_loader = data_loader_builder()

    def close_data_iterator(self) -> None:
        """Drop the data iterator so its loader workers exit now; the loader keeps its position.

        Batches drawn ahead and not consumed are given back: the loader's next iterator
        starts with them.
        """
        if isinstance(self._data_loader_iter_obj, DevicePrefetcher):
            self._data_loader_iter_obj.close()
        self._data_loader_iter_obj = None

    def loader_state_dict(self) -> dict[str, Any] | None:
        """Return the loader's position after the batches consumed (``None``: it has none).

        Batches drawn ahead and not consumed yet do not count, so a checkpoint resumes with
        the first of them.
        """
        if isinstance(self._data_loader_iter_obj, DevicePrefetcher):
            return self._data_loader_iter_obj.state_dict()
        loader = self.data_loader
        return loader.state_dict() if hasattr(loader, "state_dict") else None

    # ---- metrics --------------------------------------------------------------------------
    def record_metrics(
        self,
        loss_dict: Mapping[str, torch.Tensor],
        data_time: float,
        prefix: str = "",
        *,
        total_loss: torch.Tensor | None = None,
    ) -> None:
        """Record this step's losses, their sum and the data time (see the class docstring).

        Args:
            loss_dict: the step's losses (averaged over its micro-batches).
            data_time: seconds spent waiting for this step's batches.
            prefix: prepended to ``total_loss`` (detectron2's convention).
            total_loss: ``sum(loss_dict.values())`` when the caller has it already.
        """
        cur_iter = self.iter
        if total_loss is None:
            total_loss = sum_losses(loss_dict)
        is_gather_iter = is_period_end(cur_iter, self.gather_metric_period) or (
            self.record_every_step and is_last_iter(cur_iter, self.max_iter)
        )
        deferred = self.deferred_checks
        self._period_metrics.add(
            cur_iter,
            loss_dict,
            total_loss,
            data_time,
            prefix,
            keep=self.record_every_step or is_gather_iter,
            # Read every step on the CPU (free), so a non-finite loss never reaches the
            # optimizer; noted on a device and read at the period end, so no step waits.
            deferred=not total_loss.is_cpu if deferred is None else deferred,
        )
        if is_gather_iter:
            self._enter_phase("collective")
            self._file_buffered_metrics()
            self._enter_phase("optimizer")

    def flush_pending_checks(self, *, collective: bool = True) -> None:
        """Raise now if a step since the last check had a non-finite loss (deferred checks).

        Checkpoint paths call it right before saving, so that no checkpoint holds weights
        updated from a non-finite loss; it waits for the device only when steps are pending.

        Args:
            collective: every rank calls it at this step, and all agree on the earliest bad
                step of any rank. ``False`` checks this rank's losses only: for a save that
                only some ranks make (detectron2 registers its checkpointer on rank 0 alone).

        Raises:
            NonFiniteLossError: Naming the first bad step (of any rank when ``collective``).

        Collective:
            ``all_gather`` over all ranks when ``collective`` and there are several.
        """
        self._period_metrics.check(collective=collective)

    @override
    def after_train(self) -> None:
        # Training ended: check the steps since the last period end too; the hooks'
        # after_train (writers, checkpoint waits) still runs when this raises.
        try:
            self.flush_pending_checks()
        finally:
            super().after_train()

    def _file_buffered_metrics(self) -> None:
        # Collective: every rank files at the same iterations, and stops after the same step.
        self._period_metrics.file(self.storage, self.iter, self.rank_figures)

    # The loop stopped (TrainerBase.request_stop) before the next gather iteration.
    _end_early = _file_buffered_metrics

    def _write_metrics(
        self, loss_dict: Mapping[str, torch.Tensor], data_time: float, prefix: str = ""
    ) -> None:
        """detectron2's name of :meth:`record_metrics` (kept for code that calls it)."""
        self.record_metrics(loss_dict, data_time, prefix)

    @staticmethod
    def write_metrics(
        loss_dict: Mapping[str, torch.Tensor], data_time: float, cur_iter: int, prefix: str = ""
    ) -> None:
        """Gather one step's losses over ranks and put their averages into the current storage.

        ``data_time`` is filed as in :func:`~trainkit.engine.step_metrics.gather_and_file`.

        Raises:
            FloatingPointError: On every rank, if an averaged loss is infinite or NaN.

        Collective:
            ``all_gather`` over all ranks; every rank must call it for the same iterations.
        """
        total = sum_losses(loss_dict).detach().float().item()
        names = metric_names(tuple(loss_dict), prefix)
        entry = (cur_iter, names, host_values(loss_dict, names, total), data_time)
        gather_and_file([entry], get_event_storage(), always_check=True)

    # ---- resumable state ------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        # The last guard for a checkpoint saved by code that did not flush first: this rank's
        # pending steps (the checkpoint paths flush every rank's before).
        self._period_metrics.check(collective=False)
        state = super().state_dict()
        state["optimizer"] = self.optimizer.state_dict()
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        else:
            logger.warning("The trainer state holds no optimizer state; the optimizer starts fresh")
