"""The built-in hooks: timing, writing, checkpointing, lr scheduling, evaluation, profiling.

Each reads only the trainer surface :class:`~trainkit.engine.train_loop.TrainerBase` lists;
``DefaultTrainer.build_hooks`` gives their order. Import them from here, detectron2's path.
"""

from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.hooks.checkpointing import BestCheckpointer, PeriodicCheckpointer
from trainkit.engine.hooks.compile_metrics import CompileMetrics
from trainkit.engine.hooks.device_waits import DeviceWaitCounter
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
    "CompileMetrics",
    "DeviceWaitCounter",
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
