"""Hooks around evaluation: periodic evaluation and precise BatchNorm statistics."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from trainkit.engine.hook_base import HookBase, is_time
from trainkit.utils import comm
from trainkit.utils.periodic import is_last_iter, is_period_end

__all__ = ["BATCH_NORM_TYPES", "EvalHook", "PreciseBN"]

# The public BatchNorm classes (their shared base class is private to torch).
BATCH_NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)

logger = logging.getLogger(__name__)


def _flatten_results(results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_results(value, prefix=name + "/"))
            continue
        try:
            flat[name] = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"EvalHook: eval_function must return a nested dict of numbers; "
                f"{name!r} is {value!r}"
            ) from None
    return flat


class EvalHook(HookBase):
    """Run ``eval_function()`` every ``eval_period`` iterations and after training.

    Results, a nested dict of numbers, are flattened (``{"classification": {"top1": x}}``
    becomes ``classification/top1``) and put into the storage unsmoothed. It runs on every
    rank (evaluation gathers); non-main ranks may return ``{}``.

    Collective:
        ``eval_function`` typically gathers; a barrier follows each evaluation.
    """

    def __init__(
        self,
        eval_period: int,
        eval_function: Callable[[], Mapping[str, Any] | None],
        eval_after_train: bool = True,
    ) -> None:
        """Store the arguments.

        Args:
            eval_period: evaluate after every this many iterations; 0 only after training.
            eval_function: runs the evaluation and returns its results.
            eval_after_train: evaluate once training completes; the last period end is
                then skipped so the final model is not evaluated twice.
        """
        self._period = eval_period
        self._func = eval_function
        self._eval_after_train = eval_after_train
        self._last_step_done = False

    def _do_eval(self) -> None:
        results = self._func()
        if results:
            if not isinstance(results, Mapping):
                raise TypeError(
                    f"EvalHook: eval_function returned {type(results).__name__}, not a dict"
                )
            self.trainer.storage.put_scalars(**_flatten_results(results), smoothing_hint=False)
        comm.synchronize()  # no rank races ahead into training while another still evaluates

    @override
    def after_step(self) -> None:
        cur_iter = self.trainer.iter
        self._last_step_done = last = is_last_iter(cur_iter, self.trainer.max_iter)
        if is_period_end(cur_iter, self._period) and not (self._eval_after_train and last):
            self._do_eval()

    @override
    def after_train(self) -> None:
        # Only after a completed run: after a failure some ranks may be gone and the gather
        # would hang. A loop written for older detectron2 (unbiased-teacher's) leaves iter at
        # max_iter - 1 on success, so the last step having finished counts as well.
        done = self.trainer.iter >= self.trainer.max_iter or self._last_step_done
        if self._eval_after_train and done:
            self._do_eval()


class PreciseBN(HookBase):
    """Recompute BatchNorm running statistics as an equal-weight average over batches.

    Running averages with momentum drift behind the weights; every ``period`` iterations and
    at the last, recompute them from ``num_iter`` batches with the current weights. Only
    BatchNorm layers in training mode that track statistics are touched (none: no-op).
    """

    def __init__(
        self, period: int, model: nn.Module, data_loader: Iterable[Any], num_iter: int
    ) -> None:
        """Store the arguments; the loader is iterated lazily, the iterator kept."""
        self._period = period
        # Unwrapped so DDP does not broadcast rank 0's buffers in every forward pass here.
        self._model = model.module if isinstance(model, DistributedDataParallel) else model
        self._data_loader = data_loader
        self._num_iter = num_iter
        self._data_iter: Iterator[Any] | None = None
        self._bn_layers = [
            m
            for m in self._model.modules()
            if isinstance(m, BATCH_NORM_TYPES) and m.training and m.track_running_stats
        ]
        if not self._bn_layers:
            logger.info("PreciseBN does nothing: the model has no BatchNorm layer in training mode")

    @override
    def after_step(self) -> None:
        if self._bn_layers and is_time(self.trainer, self._period):
            self.update_stats()

    def update_stats(self) -> None:
        """Recompute the statistics now from the next ``num_iter`` batches.

        Raises:
            RuntimeError: If the data loader runs out first.
        """
        if self._data_iter is None:
            self._data_iter = iter(self._data_loader)
        logger.info("Running precise-BN for %d iterations", self._num_iter)
        momenta = [bn.momentum for bn in self._bn_layers]
        for bn in self._bn_layers:
            bn.reset_running_stats()
            # momentum=None makes BatchNorm keep a cumulative average: batch k gets 1/k.
            bn.momentum = None
        try:
            with torch.no_grad():
                for batch_index in range(self._num_iter):
                    batch = next(self._data_iter, None)
                    if batch is None:
                        raise RuntimeError(
                            f"PreciseBN's data loader ran out after {batch_index} of "
                            f"{self._num_iter} batches; give it an infinite loader."
                        )
                    self._model(batch)
        finally:
            for bn, momentum in zip(self._bn_layers, momenta):
                bn.momentum = momentum
