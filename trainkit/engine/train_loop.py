"""detectron2's import path for the loop, its hooks and the two step trainers.

Each lives in its own module (``hook_base``, ``trainer_base``, ``simple_trainer``, ``amp_trainer``).
"""

from trainkit.engine.amp_trainer import AMPTrainer
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.engine.trainer_base import TrainerBase

__all__ = ["AMPTrainer", "HookBase", "HookPriority", "SimpleTrainer", "TrainerBase"]
