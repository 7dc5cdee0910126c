"""The failing step's folder: what a rank writes to ``OUTPUT_DIR/failed_steps/iter_<N>/``.

When a step raises, a loss is non-finite or the device runs out of memory, the rank that finds
it writes (every file atomically, so a reader never sees half of one):

* ``step.json``: the step (``iteration``, 0-based as in ``metrics.json``), the data seed,
  the job's world size and ``SOLVER.ACCUMULATE_STEPS``, the newest checkpoint's name
  (``last_checkpoint``), the trainer class, the CPU threads per process, and the step's
  records for every rank and micro-batch (``records``: dataset indices, global positions
  and printable ids). The
  records are a pure function of the seed and the step (``loader.spec.steps_records``),
  so any rank writes them all, also when the others are stuck in a collective.
* ``config.yaml``: the run's config (its data seed resolved).
* ``rank<R>.json``: what this rank has: the error, the step's loss terms (of a non-finite
  loss), the shapes of its micro-batches (when the failing step is the one in progress) and
  the host; ``rank<R>_rng.pt``: its RNG states now.
* ``rank<R>_memory_snapshot.pickle``: on a CUDA out-of-memory error with
  ``DEBUG.CUDA_MEMORY_HISTORY``, the allocator's snapshot (https://pytorch.org/memory_viz).

The other ranks add their ``rank<R>`` files when they fail too (a non-finite loss found by
the deferred checks stops all ranks together). ``tools/replay_step.py`` rebuilds the step
from the folder on one process (:mod:`trainkit.engine.step_replay`). Writing the folder
never replaces the run's error: a failure to write is logged and the run fails as it would.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import weakref
from typing import TYPE_CHECKING, Any

import torch

from trainkit.checkpoint._files import read_checkpoint_file
from trainkit.data.plans.loader_state import is_global_position
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE
from trainkit.utils import comm
from trainkit.utils.env import get_rng_state
from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import atomic_write

if TYPE_CHECKING:
    from trainkit.engine.default_trainer import DefaultTrainer

__all__ = [
    "FAILED_STEPS_DIR",
    "STEP_FILE",
    "FailedStepCapture",
    "failed_step_dir",
    "failing_iteration",
    "trainer_spec",
]

logger = logging.getLogger(__name__)

FAILED_STEPS_DIR = "failed_steps"
"""The folder of ``OUTPUT_DIR`` that holds one ``iter_<N>`` folder per captured failure."""

STEP_FILE = "step.json"
"""The file of a failing step's folder that every rank would write the same."""

# Allocations the CUDA allocator keeps in its history (torch's default).
_MEMORY_HISTORY_ENTRIES = 100_000


def failed_step_dir(output_dir: str, iteration: int) -> str:
    """Return ``OUTPUT_DIR/failed_steps/iter_<iteration>`` (the iteration 0-based)."""
    return os.path.join(output_dir, FAILED_STEPS_DIR, f"iter_{iteration}")


def failing_iteration(error: BaseException, current_iter: int) -> int:
    """Return the step that failed: a non-finite loss's first bad step, else ``current_iter``.

    With deferred checks a non-finite loss is noticed some steps after the first bad one,
    which the error names.
    """
    if isinstance(error, NonFiniteLossError):
        return error.iteration
    return current_iter


def trainer_spec(trainer_class: type) -> str:
    """Return how ``tools/replay_step.py --trainer`` names ``trainer_class``.

    ``module:Class`` for a class of an importable package, else ``path/to/script.py:Class``:
    a class defined in a script (``tools/train_net.py``'s ``Trainer``, also when another
    script imports it as a top-level module), which the replay imports from its file.
    """
    module = trainer_class.__module__
    path = getattr(sys.modules.get(module), "__file__", None)
    if path and (module in ("__main__", "__mp_main__") or "." not in module):
        return f"{os.path.abspath(path)}:{trainer_class.__qualname__}"
    return f"{module}:{trainer_class.__qualname__}"


def _is_captured(error: BaseException) -> bool:
    """Whether ``error`` is a step's failure, not a stop, a user error or a peer's echo."""
    if not isinstance(error, Exception) or isinstance(error, UsageError):
        return False
    exit_code = getattr(error, "exit_code", None)
    if exit_code is not None and exit_code != NON_FINITE_EXIT_CODE:
        return False  # an agreed stop (pre-emption)
    # A collective that failed because a peer vanished: the peer writes the folder.
    return not (torch.distributed.is_available() and isinstance(error, torch.distributed.DistError))


def _error_info(error: BaseException) -> dict[str, Any]:
    return {
        "type": type(error).__name__,
        "message": str(error),
        "exit_code": getattr(error, "exit_code", 1),
    }


def _shapes(value: Any) -> Any:
    """The shapes (and dtypes) of the tensors in a batch, in the batch's structure."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {str(k): _shapes(v) for k, v in value.items() if not isinstance(v, (str, bytes))}
    if isinstance(value, (list, tuple)):
        return [_shapes(v) for v in value]
    return type(value).__name__


def _write_json(path: str, data: dict[str, Any]) -> None:
    with atomic_write(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


class FailedStepCapture:
    """Write the failing step's folder for one ``DefaultTrainer`` (see the module docstring).

    ``DefaultTrainer.train`` calls :meth:`before_train`, :meth:`capture` when the loop
    raises, then :meth:`after_train`.

    Args:
        trainer: the trainer; held through a weak reference, as hooks do.
    """

    def __init__(self, trainer: DefaultTrainer) -> None:
        self._trainer_ref = weakref.ref(trainer)
        # The loader position the loop started from, and the step it starts: the records
        # of a failing step are listed from the newest of it and the last checkpoint's.
        self._start: tuple[int, dict[str, Any] | None] = (0, None)

    @property
    def _trainer(self) -> DefaultTrainer:
        trainer = self._trainer_ref()
        if trainer is None:
            raise RuntimeError("the trainer of this FailedStepCapture was deleted")
        return trainer

    def before_train(self) -> None:
        """Note where the loop starts; with ``DEBUG.CUDA_MEMORY_HISTORY``, record allocations."""
        trainer = self._trainer
        self._start = (trainer.start_iter, trainer._trainer.loader_state_dict())
        if self._records_memory():
            # Costs time on every allocation: only while training (after_train stops it).
            torch.cuda.memory._record_memory_history(max_entries=_MEMORY_HISTORY_ENTRIES)

    def after_train(self) -> None:
        """Stop recording allocations (after :meth:`capture`, which may save them)."""
        if self._records_memory():
            torch.cuda.memory._record_memory_history(enabled=None)

    def capture(self, error: BaseException) -> str | None:
        """Write the folder of the step ``error`` ended, if it is a step's failure.

        Adds a note naming the folder to ``error`` (shown as the last line of its traceback
        and of the launcher's report) and logs it.

        Returns:
            The folder, or ``None`` when ``error`` is not captured (a user error, an agreed
            stop, a collective whose peer vanished) or writing it failed (logged).
        """
        if not _is_captured(error):
            return None
        trainer = self._trainer
        iteration = failing_iteration(error, trainer.iter)
        folder = failed_step_dir(trainer.cfg.OUTPUT_DIR, iteration)
        try:
            os.makedirs(folder, exist_ok=True)
            self._write_rank_files(folder, error, iteration)
            self._write_step_files(folder, iteration)
        except Exception:
            logger.exception("Could not write the failing step's folder %s", folder)
            return None
        message = (
            f"The failing step (iteration {iteration}) was captured in {folder}; replay it on "
            f"one process with: python tools/replay_step.py {folder}"
        )
        logger.error("%s", message)
        error.add_note(message)
        return folder

    # ---- what this rank has ---------------------------------------------------------------
    def _write_rank_files(self, folder: str, error: BaseException, iteration: int) -> None:
        trainer, rank = self._trainer, comm.get_rank()
        step = trainer._trainer
        batches = getattr(step, "_step_batches", None) if trainer.iter == iteration else None
        info: dict[str, Any] = {
            "rank": rank,
            "world_size": comm.get_world_size(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "iteration": iteration,
            "noticed_at": trainer.iter,
            "error": _error_info(error),
            "loss_terms": error.losses if isinstance(error, NonFiniteLossError) else None,
            "batch_shapes": _shapes(batches) if batches else None,
            "rng_file": f"rank{rank}_rng.pt",
            "memory_snapshot": None,
        }
        if isinstance(error, torch.OutOfMemoryError) and self._records_memory():
            info["memory_snapshot"] = name = f"rank{rank}_memory_snapshot.pickle"
            tmp = os.path.join(folder, f".{name}.tmp")
            torch.cuda.memory._dump_snapshot(tmp)
            os.replace(tmp, os.path.join(folder, name))
        with atomic_write(os.path.join(folder, info["rng_file"]), "wb") as f:
            torch.save(get_rng_state(), f)
        _write_json(os.path.join(folder, f"rank{rank}.json"), info)

    def _records_memory(self) -> bool:
        return bool(self._trainer.cfg.DEBUG.CUDA_MEMORY_HISTORY) and torch.cuda.is_available()

    # ---- what every rank would write the same ---------------------------------------------
    def _write_step_files(self, folder: str, iteration: int) -> None:
        trainer = self._trainer
        cfg = trainer.cfg
        checkpoint = trainer.checkpointer.get_checkpoint_file()
        step: dict[str, Any] = {
            "iteration": iteration,
            "seed": cfg.SEED,
            "world_size": comm.get_world_size(),
            "accumulate_steps": cfg.SOLVER.ACCUMULATE_STEPS,
            "ims_per_batch": cfg.SOLVER.IMS_PER_BATCH,
            "last_checkpoint": os.path.basename(checkpoint) if checkpoint else None,
            "trainer": trainer_spec(type(trainer)),
            # CPU kernels may sum in another order with another number of threads.
            "num_threads": torch.get_num_threads(),
            "records": None,
            "records_note": "",
        }
        try:
            step["records"] = self._records(iteration, checkpoint)
        except Exception as e:  # the rest of the folder is still worth having
            logger.warning("Could not list the records of step %d: %s", iteration, e)
            step["records_note"] = f"{type(e).__name__}: {e}"
        with atomic_write(os.path.join(folder, "config.yaml"), "w") as f:
            f.write(cfg.dump())
        _write_json(os.path.join(folder, STEP_FILE), step)

    def _records(self, iteration: int, checkpoint: str) -> list[dict[str, Any]]:
        """Every rank's and micro-batch's records of step ``iteration``.

        Listed from the newest known loader position before it: the last checkpoint's, or
        where this loop started (with aspect-ratio grouping a step depends on the steps
        before, so the plan composes those in between).
        """
        trainer = self._trainer
        start_iter, state = self._start
        if checkpoint:
            saved = upgrade_run_state(
                read_checkpoint_file(checkpoint, trust_pickle=False, keep_mapped=True)
            )
            saved_state = continued_position(saved, comm.get_world_size())
            saved_iter = saved.get("iteration", -1)
            if is_global_position(saved_state) and start_iter <= saved_iter + 1 <= iteration:
                state = saved_state
        if not is_global_position(state):
            raise TypeError(
                "the train loader has no position in the global stream (a stream dataset, a "
                "per-rank sampler or a loader of its own), so its records are not known"
            )
        spec = trainer.data_loader.spec  # a global position: the loader is a TrainLoader
        (step,) = spec.steps_records(1, state=state, first_step=iteration)
        ids = spec.record_ids()
        return [
            {
                "rank": rank,
                "micro_batch": micro_batch,
                "record_ids": [ids(index) for index, _ in pairs],
                "indices": [index for index, _ in pairs],
                "positions": [position for _, position in pairs],
            }
            for rank, micro_batch, pairs in step.slots()
        ]
