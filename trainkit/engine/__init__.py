"""Training loops, hooks, launching and default setup."""

from trainkit.engine import hooks
from trainkit.engine.amp_trainer import AMPTrainer
from trainkit.engine.ddp import create_ddp_model
from trainkit.engine.default_trainer import DefaultTrainer
from trainkit.engine.defaults import DefaultPredictor, default_argument_parser, default_setup
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.launch import DEFAULT_TIMEOUT, LaunchError, launch
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.engine.trainer_base import TrainerBase
from trainkit.engine.writers import build_writers, default_writers

__all__ = [
    "DEFAULT_TIMEOUT",
    "AMPTrainer",
    "DefaultPredictor",
    "DefaultTrainer",
    "HookBase",
    "HookPriority",
    "LaunchError",
    "SimpleTrainer",
    "TrainerBase",
    "build_writers",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "hooks",
    "launch",
]
