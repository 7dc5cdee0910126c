"""Replaying a captured failing step on one process: the model at that step, then the step.

:func:`replay_failed_step` reads a folder that
:class:`~trainkit.engine.failed_steps.FailedStepCapture` wrote and rebuilds the step with the
run's trainer class (its ``build_model``, ``build_optimizer``, ``build_lr_scheduler``,
``build_train_loader``, checkpointer and step trainer):

1. the config of the run, with one process doing the work of all ``W``: its loader deals
   every step to ``W x k`` micro-batches (``SOLVER.ACCUMULATE_STEPS`` set to ``W x k``), so
   micro-batch ``q`` is micro-batch ``q // W`` of rank ``q % W``, mapped through the same
   mapper at the same global positions (the same augmentations); each is checked against
   the records its loader's spec lists for the run's ``W x k``
   (:meth:`~trainkit.data.spec.TrainDataSpec.steps_records`);
2. the newest checkpoint before the step (weights, optimizer, LR schedule, loader position,
   every rank's RNG states);
3. every step from there to the failing one: each rank's micro-batches
   (:func:`~trainkit.engine.rank_replay.run_rank`), the gradients averaged as DDP does
   (:func:`~trainkit.engine.rank_replay.ddp_average`), the ``after_backward`` hooks, the
   optimizer step and the LR scheduler hook's step;
4. the failing step itself, without its update: every micro-batch's loss terms, the records
   of a bad micro-batch run alone (which record, which term), the gradient norms.

Steps 3 and 4 are :class:`~trainkit.engine.replay_loop.ReplayLoop`'s. Hooks other than the
LR scheduler's ``after_step`` and the ``after_backward`` ones do not run (PreciseBN, EMA,
evaluation).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from trainkit.config import CfgNode, get_cfg
from trainkit.engine.failed_steps import STEP_FILE
from trainkit.engine.rank_replay import RankLocalState
from trainkit.engine.replay_loop import BadRecord, ReplayError, ReplayLoop, ReplayReport
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.utils.env import seed_all_rng

__all__ = [
    "BadRecord",
    "ReplayError",
    "ReplayReport",
    "load_trainer_class",
    "replay_config",
    "replay_failed_step",
]

logger = logging.getLogger(__name__)


def load_trainer_class(spec: str) -> type:
    """Import the trainer class ``spec`` names: ``module:Class`` or ``path/to/file.py:Class``.

    A file is imported under another name than ``__main__``, so a training script's
    ``if __name__ == "__main__":`` part does not run.

    Raises:
        ReplayError: If the module, file or class cannot be found.
    """
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ReplayError(f"--trainer {spec!r}: give module:Class or path/to/script.py:Class")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise ReplayError(f"--trainer {spec!r}: no file {where}; give its path")
            module_name = "_trainkit_replay_" + os.path.splitext(os.path.basename(where))[0]
            module_spec = importlib.util.spec_from_file_location(module_name, where)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as e:
        raise ReplayError(f"--trainer {spec!r}: cannot import {where} ({e})") from e
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type):
        raise ReplayError(f"--trainer {spec!r}: {where} has no class {name}")
    return found


def _read_step(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, STEP_FILE)
    if not os.path.isfile(path):
        raise ReplayError(
            f"{folder} holds no {STEP_FILE}; give a folder OUTPUT_DIR/failed_steps/iter_<N> "
            "that a failed run wrote."
        )
    with open(path) as f:
        return json.load(f)


def replay_config(folder: str, step: dict[str, Any], output_dir: str) -> CfgNode:
    """Return the run's config for a replay on one process (see the module docstring).

    The one process gets the whole step: ``SOLVER.ACCUMULATE_STEPS`` is ``W x k`` and no
    rescaling happens. Loader workers, the watchdog, trackers and ``MODEL.WEIGHTS`` are off;
    a CUDA run replays on the CPU when this machine has no GPU.
    """
    cfg = get_cfg()
    # Keys a project added to the schema (add_*_config in its script) load as they are.
    cfg.set_new_allowed(True)
    cfg.merge_from_file(os.path.join(folder, "config.yaml"))
    cfg.defrost()
    cfg.OUTPUT_DIR = output_dir
    cfg.SOLVER.ACCUMULATE_STEPS = step["world_size"] * step["accumulate_steps"]
    cfg.SOLVER.REFERENCE_WORLD_SIZE = 0
    cfg.DATALOADER.NUM_WORKERS = 0  # the same batches for any number of workers
    cfg.WATCHDOG_TIMEOUT_S = 0.0
    cfg.WRITERS = ("json",)
    cfg.MODEL.WEIGHTS = ""
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("The run used %s; this machine has no GPU: replaying on the CPU", "cuda")
        cfg.MODEL.DEVICE = "cpu"
    cfg.freeze()
    return cfg


def replay_failed_step(
    folder: str,
    trainer_class: type | None = None,
    *,
    checkpoint: str | None = None,
    output_dir: str | None = None,
    log: Callable[[str], None] = logger.info,
) -> ReplayReport:
    """Rebuild the failing step of ``folder`` on this process and run it (module docstring).

    Args:
        folder: ``OUTPUT_DIR/failed_steps/iter_<N>`` of a failed run.
        trainer_class: the ``DefaultTrainer`` (sub)class to build the parts with (default:
            the run's, recorded in the folder).
        checkpoint: start from this checkpoint instead of the newest one the run had.
        output_dir: where the replay's trainer may write (default: a temporary folder).
        log: where progress lines go.

    Returns:
        What the step did (:class:`ReplayReport`).

    Raises:
        ReplayError: If the folder, its run's checkpoint or the trainer cannot be used, or
            the replay goes another way than the run (other records, a failure before).
    """
    step = _read_step(folder)
    if trainer_class is None:
        trainer_class = load_trainer_class(step["trainer"])
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            return _replay(folder, step, trainer_class, checkpoint, output_dir or scratch, log)
    finally:
        torch.set_num_threads(threads)


def _replay(
    folder: str,
    step: dict[str, Any],
    trainer_class: type,
    checkpoint: str | None,
    output_dir: str,
    log: Callable[[str], None],
) -> ReplayReport:
    iteration, world_size = int(step["iteration"]), int(step["world_size"])
    cfg = replay_config(folder, step, output_dir)
    if not cfg.MODEL.DEVICE.startswith("cuda") and step.get("num_threads"):
        # CPU kernels may sum in another order with another number of threads.
        torch.set_num_threads(int(step["num_threads"]))
    # As default_setup seeds rank 0, whose initial weights DDP gives every rank.
    seed_all_rng(cfg.SEED)
    trainer = trainer_class(cfg)
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(folder)))
    if checkpoint is None and step["last_checkpoint"]:
        checkpoint = os.path.join(run_dir, step["last_checkpoint"])
    ranks, loader_state = _load_start(trainer, checkpoint or "", world_size)
    start = trainer.iter + 1 if checkpoint else 0
    if start > iteration:
        raise ReplayError(
            f"checkpoint {checkpoint} holds iteration {start - 1}, not before the failing "
            f"step {iteration}; give an older one with --checkpoint."
        )
    # The replay's loader deals each step to W x k micro-batches of one process; the run's
    # spec is the same data dealt to its W processes x k.
    run_spec = dataclasses.replace(
        trainer.data_loader.spec,
        world_size=world_size,
        rank=0,
        accumulate_steps=int(step["accumulate_steps"]),
    )
    planned = run_spec.steps_records(iteration - start + 1, state=loader_state, first_step=start)
    report = ReplayReport(iteration, checkpoint or "", range(start, iteration))
    ReplayLoop(trainer, ranks, run_spec.record_ids(), report, log).run(planned)
    return report


def _load_start(
    trainer: Any, checkpoint: str, world_size: int
) -> tuple[list[RankLocalState], dict[str, Any] | None]:
    """Load ``checkpoint`` into ``trainer``; return each rank's local state and the position."""
    ranks = [RankLocalState() for _ in range(world_size)]
    if not checkpoint:
        logger.warning("No checkpoint: replaying from iteration 0 with the model's initialisation")
        return ranks, trainer.data_loader.state_dict()
    if not os.path.isfile(checkpoint):
        raise ReplayError(f"checkpoint {checkpoint} not found; give one with --checkpoint")
    extra = trainer.checkpointer.load(checkpoint, checkpointables=[])
    state = upgrade_run_state(extra)
    # The loop, the step (optimizer, gradient scaler) and the hooks (the LR schedule).
    trainer.load_state_dict(state)
    saved = state.get("ranks") or [{}]
    data = continued_position(state, world_size)
    if data is None:
        raise ReplayError(f"checkpoint {checkpoint} holds no loader position; give another")
    trainer.data_loader.load_state_dict(data)
    if state.get("world_size") == world_size and len(saved) == world_size:
        for rank, local in zip(ranks, saved):
            rank.rng = local.get("rng")
    else:
        logger.warning(
            "Checkpoint %s was written by %s processes, the failing job had %d: each rank's "
            "random ops (dropout) are not replayed exactly",
            checkpoint,
            state.get("world_size"),
            world_size,
        )
    return ranks, data
