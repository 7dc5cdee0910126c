"""The built-in hooks: timing, writing, checkpointing, lr scheduling, evaluation, profiling.

Every hook reads only the trainer surface listed in :class:`~trainkit.engine.train_loop.
TrainerBase` and decides "is it time?" with :mod:`trainkit.utils.periodic`. Their canonical
order is set by ``DefaultTrainer.build_hooks``. One module per responsibility; import them
from here (``trainkit.engine.hooks.X``), the path detectron2 code expects.
"""

from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.hooks.checkpointing import BestCheckpointer, PeriodicCheckpointer
from trainkit.engine.hooks.early_stopping import EarlyStopping, ImprovementRule
from trainkit.engine.hooks.ema import ModelEMA, load_ema_weights
from trainkit.engine.hooks.evaluation import EvalHook, PreciseBN
from trainkit.engine.hooks.loop import (
    CallbackHook,
    IterationTimer,
    LRScheduler,
    PeriodicWriter,
    SkippedRecordsCounter,
)
from trainkit.engine.hooks.profiling import TorchMemoryStats, TorchProfiler

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "EarlyStopping",
    "EvalHook",
    "HookBase",
    "HookPriority",
    "ImprovementRule",
    "IterationTimer",
    "LRScheduler",
    "ModelEMA",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "PreciseBN",
    "SkippedRecordsCounter",
    "TorchMemoryStats",
    "TorchProfiler",
    "load_ema_weights",
]
