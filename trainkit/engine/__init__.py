"""Training loops, hooks, launching and default setup."""

from trainkit.engine import hooks
from trainkit.engine.amp_trainer import AMPTrainer
from trainkit.engine.default_trainer import DefaultTrainer
from trainkit.engine.defaults import DefaultPredictor, default_argument_parser, default_setup
from trainkit.engine.events import StepEvents, StepListener
from trainkit.engine.gradients import (
    GradientCombiner,
    ShardedGradients,
    StepResult,
    create_ddp_model,
)
from trainkit.engine.hook_base import HookBase, HookPriority

# detectron2's engine package star-imports its hooks, so `from detectron2.engine import
# LRScheduler` (or any built-in hook) works; projects subclass them from there.
from trainkit.engine.hooks import (
    BestCheckpointer,
    CallbackHook,
    EvalHook,
    IterationTimer,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
    PreciseBN,
    TorchMemoryStats,
    TorchProfiler,
)
from trainkit.engine.launch import DEFAULT_TIMEOUT, LaunchError, launch
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.engine.trainer_base import TrainerBase
from trainkit.engine.writers import build_writers, default_writers

__all__ = [
    "DEFAULT_TIMEOUT",
    "AMPTrainer",
    "BestCheckpointer",
    "CallbackHook",
    "DefaultPredictor",
    "DefaultTrainer",
    "EvalHook",
    "GradientCombiner",
    "ShardedGradients",
    "HookBase",
    "HookPriority",
    "IterationTimer",
    "LRScheduler",
    "LaunchError",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "PreciseBN",
    "SimpleTrainer",
    "StepEvents",
    "StepListener",
    "StepResult",
    "TorchMemoryStats",
    "TorchProfiler",
    "TrainerBase",
    "build_writers",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "hooks",
    "launch",
]
