"""detectron2's import path for the loop, its hooks and the two step trainers.

Each lives in its own module: ``HookBase``/``HookPriority`` in :mod:`~trainkit.engine.hook_base`,
``TrainerBase`` (the loop) in :mod:`~trainkit.engine.trainer_base`, ``SimpleTrainer`` (one
optimisation step) in :mod:`~trainkit.engine.simple_trainer` and ``AMPTrainer`` in
:mod:`~trainkit.engine.amp_trainer`. Code written for detectron2 imports them from here.
"""

from trainkit.engine.amp_trainer import AMPTrainer
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.engine.simple_trainer import SimpleTrainer
from trainkit.engine.trainer_base import TrainerBase

__all__ = ["AMPTrainer", "HookBase", "HookPriority", "SimpleTrainer", "TrainerBase"]
