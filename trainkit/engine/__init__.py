"""Training loops, hooks, launching and default setup."""

from trainkit.engine import hooks
from trainkit.engine.defaults import (
    DefaultTrainer,
    create_ddp_model,
    default_argument_parser,
    default_setup,
    default_writers,
)
from trainkit.engine.launch import DEFAULT_TIMEOUT, LaunchError, launch
from trainkit.engine.train_loop import AMPTrainer, HookBase, SimpleTrainer, TrainerBase

__all__ = [
    "DEFAULT_TIMEOUT",
    "AMPTrainer",
    "DefaultTrainer",
    "HookBase",
    "LaunchError",
    "SimpleTrainer",
    "TrainerBase",
    "create_ddp_model",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "hooks",
    "launch",
]
