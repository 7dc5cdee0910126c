"""The built-in hooks: timing, writing, checkpointing, lr scheduling, evaluation, profiling.

Every hook reads only the trainer surface listed in :class:`~trainkit.engine.train_loop.
TrainerBase` and decides "is it time?" with :mod:`trainkit.utils.periodic`. Their canonical
order is set by ``DefaultTrainer.build_hooks``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from trainkit.checkpoint import PeriodicCheckpointer as _PeriodicCheckpointer
from trainkit.engine.train_loop import HookBase, TrainerBase
from trainkit.solver import LRMultiplier
from trainkit.utils import comm
from trainkit.utils.periodic import is_last_iter, is_period_end

if TYPE_CHECKING:
    from trainkit.checkpoint import Checkpointer
    from trainkit.utils.events import EventWriter

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "EvalHook",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "PreciseBN",
    "TorchMemoryStats",
    "TorchProfiler",
]

logger = logging.getLogger(__name__)

TrainerCallback = Callable[[TrainerBase], None]


class _Saver(Protocol):
    def save(self, name: str, *, tag_last: bool = True, **kwargs: Any) -> None: ...


def _trainer_attr(hook: HookBase, name: str) -> Any:
    # Only the declared surface is read; say which hook needs what instead of a bare
    # AttributeError from deep inside a hook.
    try:
        return getattr(hook.trainer, name)
    except AttributeError:
        raise AttributeError(
            f"{type(hook).__name__} needs trainer.{name}, which "
            f"{type(hook.trainer).__name__} does not have; pass it to the hook explicitly."
        ) from None


def _is_time(trainer: TrainerBase, period: int) -> bool:
    return is_period_end(trainer.iter, period) or is_last_iter(trainer.iter, trainer.max_iter)


class CallbackHook(HookBase):
    """Run plain functions ``fn(trainer)`` at the hook points; for one-off extensions."""

    def __init__(
        self,
        *,
        before_train: TrainerCallback | None = None,
        after_train: TrainerCallback | None = None,
        before_step: TrainerCallback | None = None,
        after_step: TrainerCallback | None = None,
    ) -> None:
        """Store the callbacks; each receives the trainer and any may be ``None``."""
        self._before_train = before_train
        self._after_train = after_train
        self._before_step = before_step
        self._after_step = after_step

    @override
    def before_train(self) -> None:
        if self._before_train is not None:
            self._before_train(self.trainer)

    @override
    def after_train(self) -> None:
        if self._after_train is not None:
            self._after_train(self.trainer)

    @override
    def before_step(self) -> None:
        if self._before_step is not None:
            self._before_step(self.trainer)

    @override
    def after_step(self) -> None:
        if self._after_step is not None:
            self._after_step(self.trainer)


class IterationTimer(HookBase):
    """Record each step's duration as ``time`` and log the overall speed after training.

    Register it first: a step is timed from this hook's ``before_step`` to its
    ``after_step``, which then covers the other hooks' ``before_step`` and ``run_step``.
    The first ``warmup_iter`` steps (slow: allocation, autotuning) are not timed.
    """

    def __init__(
        self, warmup_iter: int = 3, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        """Set up the timer.

        Args:
            warmup_iter: number of steps at the start of ``train()`` that are not timed.
            clock: returns seconds; injectable so tests need no sleeping.
        """
        self._warmup_iter = warmup_iter
        self._clock = clock
        self._start_s: float | None = None
        self._step_start_s = 0.0
        self._timed_steps_s = 0.0
        self._num_timed_steps = 0

    @override
    def before_train(self) -> None:
        self._start_s = self._clock()
        self._timed_steps_s = 0.0
        self._num_timed_steps = 0

    @override
    def before_step(self) -> None:
        self._step_start_s = self._clock()

    @override
    def after_step(self) -> None:
        now_s = self._clock()
        trainer = self.trainer
        if trainer.iter - trainer.start_iter >= self._warmup_iter:
            step_s = now_s - self._step_start_s
            trainer.storage.put_scalar("time", step_s)
            self._timed_steps_s += step_s
            self._num_timed_steps += 1
        else:
            # The overall speed also starts after the warm-up.
            self._start_s = now_s

    @override
    def after_train(self) -> None:
        if self._start_s is None or self._num_timed_steps == 0:
            return
        total_s = self._clock() - self._start_s
        logger.info(
            "Overall training speed: %d iterations in %.1f s (%.4f s / it)",
            self._num_timed_steps,
            self._timed_steps_s,
            self._timed_steps_s / self._num_timed_steps,
        )
        logger.info(
            "Total training time: %.1f s (%.1f s on hooks)",
            total_s,
            total_s - self._timed_steps_s,
        )


class PeriodicWriter(HookBase):
    """Run the writers every ``period`` iterations, at the last one, and once after training.

    The trainer calls :meth:`final_write` after every hook's ``after_train``, so metrics a
    later hook records in its ``after_train`` still get written; then the writers close.
    """

    def __init__(self, writers: Iterable[EventWriter], period: int = 20) -> None:
        """Store the writers.

        Raises:
            TypeError: If a writer lacks ``write``/``close``.
        """
        self._writers = list(writers)
        for writer in self._writers:
            if not (
                callable(getattr(writer, "write", None))
                and callable(getattr(writer, "close", None))
            ):
                raise TypeError(f"{type(writer).__name__} is not an EventWriter (write/close)")
        self._period = period

    @override
    def after_step(self) -> None:
        if _is_time(self.trainer, self._period):
            for writer in self._writers:
                writer.write()

    def final_write(self) -> None:
        """Write once more, then close every writer (the trainer calls this last)."""
        try:
            for writer in self._writers:
                writer.write()
        finally:
            for writer in self._writers:
                writer.close()


class PeriodicCheckpointer(HookBase):
    """Save a checkpoint every ``period`` iterations and a final one at the last iteration.

    A hook around :class:`trainkit.checkpoint.PeriodicCheckpointer`; the file names, the
    ``max_to_keep`` rotation and what is saved are that class's business.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        period: int,
        max_iter: int | None = None,
        max_to_keep: int | None = None,
        file_prefix: str = "model",
    ) -> None:
        """Store the arguments; ``max_iter=None`` means the trainer's ``max_iter``."""
        self._checkpointer = checkpointer
        self._period = period
        self._max_iter = max_iter
        self._max_to_keep = max_to_keep
        self._file_prefix = file_prefix
        self._periodic: _PeriodicCheckpointer | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        """The checkpointer that writes the files."""
        return self._checkpointer

    @override
    def before_train(self) -> None:
        # Built here because the trainer's max_iter is known only once train() starts.
        max_iter = self._max_iter if self._max_iter is not None else self.trainer.max_iter
        self._periodic = _PeriodicCheckpointer(
            self._checkpointer, self._period, max_iter, self._max_to_keep, self._file_prefix
        )

    @override
    def after_step(self) -> None:
        if self._periodic is not None:
            self._periodic.step(self.trainer.iter)


class BestCheckpointer(HookBase):
    """Save ``file_prefix`` whenever ``val_metric`` in the storage improves.

    Register it after the :class:`EvalHook` that records the metric, with the same
    ``eval_period``, so it checks right after each evaluation (and after the final one in
    ``after_train``). The best value is part of the resumable state, so a resumed run does
    not overwrite the best checkpoint with a worse one.
    """

    def __init__(
        self,
        eval_period: int,
        checkpointer: _Saver,
        val_metric: str,
        mode: str = "max",
        file_prefix: str = "model_best",
    ) -> None:
        """Store the arguments.

        Raises:
            ValueError: If ``mode`` is not ``"max"`` or ``"min"``.
        """
        if mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer mode must be 'max' or 'min', got {mode!r}")
        self._period = eval_period
        self._checkpointer = checkpointer
        self._val_metric = val_metric
        self._mode = mode
        self._file_prefix = file_prefix
        self.best_metric: float | None = None
        self.best_iter: int | None = None

    def _is_better(self, value: float) -> bool:
        if self.best_metric is None:
            return True
        return value > self.best_metric if self._mode == "max" else value < self.best_metric

    def _check(self) -> None:
        latest = self.trainer.storage.latest().get(self._val_metric)
        if latest is None:
            logger.warning(
                "BestCheckpointer: %r is not in the storage; check that an EvalHook before it "
                "records it (names are flattened like 'classification/top1').",
                self._val_metric,
            )
            return
        value, metric_iter = latest
        if not self._is_better(value):
            return
        logger.info(
            "Saved best model: %s = %.5g at iteration %d (previous best %s)",
            self._val_metric,
            value,
            metric_iter,
            self.best_metric,
        )
        self.best_metric, self.best_iter = float(value), int(metric_iter)
        self._checkpointer.save(self._file_prefix, tag_last=False, iteration=metric_iter)

    @override
    def after_step(self) -> None:
        # The last iteration is checked in after_train, after the final evaluation.
        if is_period_end(self.trainer.iter, self._period) and not is_last_iter(
            self.trainer.iter, self.trainer.max_iter
        ):
            self._check()

    @override
    def after_train(self) -> None:
        if self.trainer.iter >= self.trainer.max_iter:  # training completed
            self._check()

    @override
    def state_dict(self) -> dict[str, Any]:
        if self.best_metric is None:
            return {}
        return {"best_metric": self.best_metric, "best_iter": self.best_iter}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_metric = state.get("best_metric")
        self.best_iter = state.get("best_iter")


class LRScheduler(HookBase):
    """Step the lr scheduler after every optimizer step and record ``lr``.

    The recorded ``lr`` is that of the param group with the most parameters (ties go to the
    larger lr), which is the "main" lr for the usual bias/norm group splits. The
    scheduler's state is this hook's resumable state.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | ParamScheduler | None = None,
    ) -> None:
        """Store the arguments.

        Args:
            optimizer: defaults to ``trainer.optimizer``.
            scheduler: a torch lr scheduler, an fvcore ``ParamScheduler`` (wrapped in an
                ``LRMultiplier`` over ``trainer.max_iter`` when training starts), or
                ``None`` for ``trainer.scheduler``.
        """
        self._optimizer = optimizer
        self._scheduler_arg = scheduler
        self._scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        # A state loaded before the ParamScheduler was wrapped (resume happens before
        # train()), applied in before_train.
        self._pending_state: dict[str, Any] | None = None
        self._main_param_group: dict[str, Any] = {}
        self._stepped_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """The torch scheduler being stepped.

        Raises:
            RuntimeError: If it is built from a ``ParamScheduler`` and training has not started.
        """
        scheduler = self._resolve_scheduler()
        if scheduler is None:
            raise RuntimeError("The lr scheduler is built from a ParamScheduler in before_train")
        return scheduler

    def _resolve_scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        if self._scheduler is not None:
            return self._scheduler
        if isinstance(self._scheduler_arg, ParamScheduler):
            return None
        if self._scheduler_arg is not None:
            return self._scheduler_arg
        return _trainer_attr(self, "scheduler")

    def _get_optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is not None:
            return self._optimizer
        return _trainer_attr(self, "optimizer")

    @override
    def before_train(self) -> None:
        optimizer = self._get_optimizer()
        if isinstance(self._scheduler_arg, ParamScheduler):
            self._scheduler = LRMultiplier(
                optimizer,
                self._scheduler_arg,
                self.trainer.max_iter,
                last_iter=self.trainer.iter - 1,
            )
        if self._pending_state is not None:
            self.scheduler.load_state_dict(self._pending_state)
            self._pending_state = None
        self._main_param_group = optimizer.param_groups[_main_param_group(optimizer)]
        self._stepped_scheduler = self.scheduler

    @override
    def after_step(self) -> None:
        # Resolved once per train() call (in before_train), not on every step.
        if self._stepped_scheduler is None:  # a caller that skipped before_train
            self.before_train()
        lr = self._main_param_group["lr"]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self._stepped_scheduler.step()  # type: ignore[union-attr]

    @override
    def state_dict(self) -> dict[str, Any]:
        scheduler = self._resolve_scheduler()
        return scheduler.state_dict() if scheduler is not None else {}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        scheduler = self._resolve_scheduler()
        if scheduler is None:
            self._pending_state = state
        else:
            scheduler.load_state_dict(state)


def _main_param_group(optimizer: torch.optim.Optimizer) -> int:
    groups = optimizer.param_groups
    return max(range(len(groups)), key=lambda i: (len(groups[i]["params"]), groups[i]["lr"]))


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
    rank, because evaluation gathers across ranks; non-main ranks may return ``{}``.

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

    def _do_eval(self) -> None:
        results = self._func()
        if results:
            if not isinstance(results, Mapping):
                raise TypeError(
                    f"EvalHook: eval_function returned {type(results).__name__}, not a dict"
                )
            self.trainer.storage.put_scalars(**_flatten_results(results), smoothing_hint=False)
        # Every rank leaves the evaluation together, so no rank races ahead into training
        # while another still runs inference.
        comm.synchronize()

    @override
    def after_step(self) -> None:
        cur_iter, max_iter = self.trainer.iter, self.trainer.max_iter
        if is_period_end(cur_iter, self._period) and not (
            self._eval_after_train and is_last_iter(cur_iter, max_iter)
        ):
            self._do_eval()

    @override
    def after_train(self) -> None:
        # Only after a completed run: after a failure some ranks may be gone and the
        # evaluation's gather would hang.
        if self._eval_after_train and self.trainer.iter >= self.trainer.max_iter:
            self._do_eval()


def _bare_model(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


class PreciseBN(HookBase):
    """Recompute BatchNorm running statistics as an equal-weight average over batches.

    Running averages with momentum drift behind the weights; before evaluating, recompute
    them from ``num_iter`` batches of ``data_loader`` with the current weights. Runs every
    ``period`` iterations and at the last. Only BatchNorm layers that are in training mode
    and track statistics are touched; without any the hook does nothing.
    """

    def __init__(
        self, period: int, model: nn.Module, data_loader: Iterable[Any], num_iter: int
    ) -> None:
        """Store the arguments; the loader is iterated lazily, the iterator kept."""
        self._period = period
        # Unwrapped so DDP does not broadcast rank 0's buffers in every forward pass here.
        self._model = _bare_model(model)
        self._data_loader = data_loader
        self._num_iter = num_iter
        self._data_iter: Iterator[Any] | None = None
        self._bn_layers = [
            m
            for m in self._model.modules()
            if isinstance(m, _BatchNorm) and m.training and m.track_running_stats
        ]
        if not self._bn_layers:
            logger.info("PreciseBN does nothing: the model has no BatchNorm layer in training mode")

    @override
    def after_step(self) -> None:
        if self._bn_layers and _is_time(self.trainer, self._period):
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
                    try:
                        batch = next(self._data_iter)
                    except StopIteration:
                        raise RuntimeError(
                            f"PreciseBN's data loader ran out after {batch_index} of "
                            f"{self._num_iter} batches; give it an infinite loader."
                        ) from None
                    self._model(batch)
        finally:
            for bn, momentum in zip(self._bn_layers, momenta):
                bn.momentum = momentum


class TorchProfiler(HookBase):
    """Profile the steps for which ``enable_predicate(trainer)`` is true.

    Traces go to ``output_dir``: TensorBoard profiler files (``worker<rank>``) when
    ``save_tensorboard``, else one Chrome trace ``profiler-trace-iter<N>.json`` per step.
    """

    def __init__(
        self,
        enable_predicate: Callable[[TrainerBase], bool],
        output_dir: str,
        *,
        activities: Iterable[Any] | None = None,
        save_tensorboard: bool = True,
    ) -> None:
        """Store the arguments; ``activities`` are ``torch.profiler.ProfilerActivity`` values."""
        self._enable_predicate = enable_predicate
        self._output_dir = output_dir
        self._activities = list(activities) if activities is not None else None
        self._save_tensorboard = save_tensorboard
        self._profiler: Any = None

    @override
    def before_step(self) -> None:
        if not self._enable_predicate(self.trainer):
            self._profiler = None
            return
        import torch.profiler  # only when profiling is actually on

        os.makedirs(self._output_dir, exist_ok=True)
        on_trace_ready = None
        if self._save_tensorboard:
            on_trace_ready = torch.profiler.tensorboard_trace_handler(
                self._output_dir, worker_name=f"worker{comm.get_rank()}"
            )
        self._profiler = torch.profiler.profile(
            activities=self._activities,
            on_trace_ready=on_trace_ready,
            record_shapes=True,
            profile_memory=True,
            with_stack=True,
            with_flops=True,
        )
        self._profiler.__enter__()

    @override
    def after_step(self) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        if not self._save_tensorboard:
            path = os.path.join(self._output_dir, f"profiler-trace-iter{self.trainer.iter}.json")
            profiler.export_chrome_trace(path)

    @override
    def after_train(self) -> None:
        # A step that raised never reached after_step; stop its profiler so it frees memory.
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None


class TorchMemoryStats(HookBase):
    """Record CUDA memory use every ``period`` iterations, at most ``max_runs`` times.

    Puts ``memory/max_reserved_mb``, ``memory/reserved_mb``, ``memory/max_allocated_mb``
    and ``memory/allocated_mb`` into the storage and logs them; the last run also logs
    ``torch.cuda.memory_summary()``. Peaks are reset after each run, so each value is the
    peak since the previous one. Without CUDA it logs that once and does nothing.
    """

    def __init__(self, period: int = 20, max_runs: int = 10) -> None:
        """Store the arguments."""
        self._period = period
        self._max_runs = max_runs
        self._num_runs = 0

    @override
    def before_train(self) -> None:
        if not torch.cuda.is_available():
            logger.info("TorchMemoryStats does nothing: CUDA is not available")

    @override
    def after_step(self) -> None:
        if not torch.cuda.is_available() or self._num_runs >= self._max_runs:
            return
        if not _is_time(self.trainer, self._period):
            return
        mib = 1024.0 * 1024.0
        stats_mb = {
            "memory/max_reserved_mb": torch.cuda.max_memory_reserved() / mib,
            "memory/reserved_mb": torch.cuda.memory_reserved() / mib,
            "memory/max_allocated_mb": torch.cuda.max_memory_allocated() / mib,
            "memory/allocated_mb": torch.cuda.memory_allocated() / mib,
        }
        self.trainer.storage.put_scalars(**stats_mb, smoothing_hint=False)
        logger.info(
            "iter %d: %s",
            self.trainer.iter,
            "  ".join(f"{k.split('/')[1]}: {v:.0f}" for k, v in stats_mb.items()),
        )
        self._num_runs += 1
        if self._num_runs == self._max_runs:
            logger.info("%s", torch.cuda.memory_summary())
        torch.cuda.reset_peak_memory_stats()
