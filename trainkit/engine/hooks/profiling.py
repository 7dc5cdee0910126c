"""Hooks that measure: the torch profiler and CUDA memory statistics."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, Callable

import torch
from typing_extensions import override

from trainkit.engine.hook_base import HookBase, is_time
from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils import comm

__all__ = ["TorchMemoryStats", "TorchProfiler"]

logger = logging.getLogger(__name__)


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

    Puts ``memory/max_reserved_mb``, ``memory/reserved_mb``, ``memory/max_allocated_mb`` and
    ``memory/allocated_mb`` into the storage and the log (the last run also logs
    ``torch.cuda.memory_summary()``); peaks are since the previous run. Without CUDA it logs
    that once and does nothing.
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
        done = self._num_runs >= self._max_runs
        if done or not torch.cuda.is_available() or not is_time(self.trainer, self._period):
            return
        mib = 1024.0 * 1024.0
        stats_mb = {
            "memory/max_reserved_mb": torch.cuda.max_memory_reserved() / mib,
            "memory/reserved_mb": torch.cuda.memory_reserved() / mib,
            "memory/max_allocated_mb": torch.cuda.max_memory_allocated() / mib,
            "memory/allocated_mb": torch.cuda.memory_allocated() / mib,
        }
        self.trainer.storage.put_scalars(**stats_mb, smoothing_hint=False)
        summary = "  ".join(f"{k.split('/')[1]}: {v:.0f}" for k, v in stats_mb.items())
        logger.info("iter %d: %s", self.trainer.iter, summary)
        self._num_runs += 1
        if self._num_runs == self._max_runs:
            logger.info("%s", torch.cuda.memory_summary())
        torch.cuda.reset_peak_memory_stats()
