"""The failing step's folder: what a rank writes to ``OUTPUT_DIR/failed_steps/iter_<N>/``.

When a step raises, a loss is non-finite or the device runs out of memory, the rank that finds it
writes, every file atomically (``docs/troubleshooting.md`` has the table): ``step.json`` (the step,
0-based as in ``metrics.json``; the data seed, world size, micro-batches, newest checkpoint's name,
trainer class, CPU threads, and every rank's and micro-batch's records, listed from the loader that
ran, ``loader.spec.steps_records``: a pure function of the seed and the step, so any rank writes
them all, also when the others are stuck in a collective), ``config.yaml`` (its data seed resolved),
and its own ``rank<R>.json`` (the error, a non-finite loss's terms, its micro-batches' shapes, the
host), ``rank<R>_rng.pt`` and, on a CUDA out-of-memory error with ``DEBUG.CUDA_MEMORY_HISTORY``,
``rank<R>_memory_snapshot.pickle``. The other ranks add their ``rank<R>`` files when they fail too.
``tools/replay_step.py`` rebuilds the step from the folder (:mod:`trainkit.engine.replay`); this
module also reads the folder back for it. Writing the folder never replaces the run's error: a
failure to write is logged and the run fails as it would.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import socket
from typing import Any

import torch

from trainkit.checkpoint import Checkpointer, read_unsharded_part
from trainkit.config import CfgNode
from trainkit.data.loading.loader import TrainLoader
from trainkit.data.plans.loader_state import is_global_position
from trainkit.engine.run_state import continued_position, upgrade_run_state
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE, exit_code_of
from trainkit.utils import comm
from trainkit.utils.env import get_rng_state
from trainkit.utils.errors import UsageError, add_note
from trainkit.utils.file_io import atomic_write
from trainkit.utils.torch_private import dump_cuda_memory_snapshot, record_cuda_memory_history

__all__ = [
    "FAILED_STEPS_DIR",
    "STEP_FILE",
    "FailedStepCapture",
    "ReplayError",
    "failed_step_dir",
    "failing_iteration",
    "load_trainer_class",
    "read_step_file",
    "trainer_spec",
]

logger = logging.getLogger(__name__)

FAILED_STEPS_DIR = "failed_steps"
"""The folder of ``OUTPUT_DIR`` that holds one ``iter_<N>`` folder per captured failure."""

STEP_FILE = "step.json"
"""The file of a failing step's folder that every rank would write the same."""

# Allocations the CUDA allocator keeps in its history (torch's default).
_MEMORY_HISTORY_ENTRIES = 100_000


class ReplayError(UsageError):
    """A failing step's folder (or the run it points to) cannot be replayed as given."""


def failed_step_dir(output_dir: str, iteration: int) -> str:
    """Return ``OUTPUT_DIR/failed_steps/iter_<iteration>`` (the iteration 0-based)."""
    return os.path.join(output_dir, FAILED_STEPS_DIR, f"iter_{iteration}")


def failing_iteration(error: BaseException, current_iter: int) -> int:
    """Return the step that failed: a non-finite loss's first bad step, else ``current_iter``.

    Deferred checks notice a non-finite loss after its first bad step, which the error names.
    """
    return error.iteration if isinstance(error, NonFiniteLossError) else current_iter


def trainer_spec(trainer_class: type) -> str:
    """Return how ``tools/replay_step.py --trainer`` names ``trainer_class``.

    ``module:Class`` for a class of an importable package, else ``path/to/script.py:Class``:
    a class defined in a script (``tools/train_net.py``'s ``Trainer``, also when another
    script imports it as a top-level module), which the replay imports from its file.
    """
    module, name = trainer_class.__module__, trainer_class.__qualname__
    if module in ("__main__", "__mp_main__") or "." not in module:
        with contextlib.suppress(TypeError):  # a class of no file (built in)
            return f"{os.path.abspath(inspect.getfile(trainer_class))}:{name}"
    return f"{module}:{name}"


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


def read_step_file(folder: str) -> dict[str, Any]:
    """Return the ``step.json`` of a failing step's folder.

    Raises:
        ReplayError: If ``folder`` holds none.
    """
    path = os.path.join(folder, STEP_FILE)
    if not os.path.isfile(path):
        raise ReplayError(
            f"{folder} holds no {STEP_FILE}; give a folder OUTPUT_DIR/failed_steps/iter_<N> "
            "that a failed run wrote."
        )
    with open(path) as f:
        return json.load(f)


def _is_captured(error: BaseException) -> bool:
    """Whether ``error`` is a step's failure, not a stop, a user error or a peer's echo."""
    if not isinstance(error, Exception) or isinstance(error, UsageError):
        return False
    exit_code = exit_code_of(error)
    if exit_code is not None and exit_code != NON_FINITE_EXIT_CODE:
        return False  # an agreed stop (pre-emption)
    # A collective that failed because a peer vanished: the peer writes the folder.
    return not (torch.distributed.is_available() and isinstance(error, torch.distributed.DistError))


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
        f.write(json.dumps(data, indent=1) + "\n")


class FailedStepCapture:
    """Write the failing step's folder of one run (see the module docstring).

    ``DefaultTrainer.train`` calls :meth:`before_train`, :meth:`capture` when the step
    fails, then :meth:`after_train`.

    Args:
        cfg: the run's config (``OUTPUT_DIR``, the data seed, the batch, ``DEBUG``); the
            one :meth:`before_train` gets replaces it (a resume may change the data seed).
        trainer_class: the trainer class the replay rebuilds the run with.
        checkpointer: the run's checkpointer (its newest checkpoint is named in the folder).
    """

    def __init__(self, cfg: CfgNode, trainer_class: type, checkpointer: Checkpointer) -> None:
        self._cfg, self._trainer_class, self._checkpointer = cfg, trainer_class, checkpointer
        # Where the loop started (step, loader position): a failing step's records are listed
        # from the newest of it and the last checkpoint's.
        self._start: tuple[int, dict[str, Any] | None] = (0, None)

    def before_train(self, cfg: CfgNode, start_iter: int, position: dict[str, Any] | None) -> None:
        """Note where the loop starts; with ``DEBUG.CUDA_MEMORY_HISTORY``, record allocations.

        Args:
            cfg: the run's config as it trains.
            start_iter: the first iteration the loop runs.
            position: the train loader's position before it.
        """
        self._cfg, self._start = cfg, (start_iter, position)
        if self._records_memory():
            # Costs time on every allocation: only while training (after_train stops it).
            record_cuda_memory_history(True, _MEMORY_HISTORY_ENTRIES)

    def after_train(self) -> None:
        """Stop recording allocations (after :meth:`capture`, which may save them)."""
        if self._records_memory():
            record_cuda_memory_history(False)

    def capture(
        self, error: BaseException, current_iter: int, batches: list[Any], loader: Any
    ) -> str | None:
        """Write the folder of the step ``error`` ended, if it is a step's failure.

        Adds a note naming the folder to ``error`` (shown as the last line of its traceback
        and of the launcher's report) and logs it.

        Args:
            error: what the step raised (or a non-finite loss found later).
            current_iter: the iteration the loop was in.
            batches: this rank's micro-batches of that step (their shapes are recorded).
            loader: the train loader that ran (the step's records are listed from it).

        Returns:
            The folder, or ``None`` when ``error`` is not captured (a user error, an agreed
            stop, a collective whose peer vanished) or writing it failed (logged).
        """
        if not _is_captured(error):
            return None
        iteration = failing_iteration(error, current_iter)
        folder = failed_step_dir(self._cfg.OUTPUT_DIR, iteration)
        try:
            os.makedirs(folder, exist_ok=True)
            in_progress = batches if current_iter == iteration else None
            self._write_rank_files(folder, error, iteration, current_iter, in_progress)
            self._write_step_files(folder, iteration, loader)
        except Exception:
            logger.exception("Could not write the failing step's folder %s", folder)
            return None
        message = (
            f"The failing step (iteration {iteration}) was captured in {folder}; replay it on "
            f"one process with: python tools/replay_step.py {folder}"
        )
        logger.error("%s", message)
        add_note(error, message)
        return folder

    # ---- what this rank has ---------------------------------------------------------------
    def _write_rank_files(
        self,
        folder: str,
        error: BaseException,
        iteration: int,
        current_iter: int,
        batches: list[Any] | None,
    ) -> None:
        rank = comm.get_rank()
        info: dict[str, Any] = {
            "rank": rank,
            "world_size": comm.get_world_size(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "iteration": iteration,
            "noticed_at": current_iter,
            "error": {
                "type": type(error).__name__,
                "message": str(error),
                "exit_code": exit_code_of(error) or 1,
            },
            "loss_terms": error.losses if isinstance(error, NonFiniteLossError) else None,
            "batch_shapes": _shapes(batches) if batches else None,
            "rng_file": f"rank{rank}_rng.pt",
            "memory_snapshot": None,
        }
        if isinstance(error, torch.OutOfMemoryError) and self._records_memory():
            info["memory_snapshot"] = name = f"rank{rank}_memory_snapshot.pickle"
            tmp = os.path.join(folder, f".{name}.tmp")
            dump_cuda_memory_snapshot(tmp)
            os.replace(tmp, os.path.join(folder, name))
        with atomic_write(os.path.join(folder, info["rng_file"]), "wb") as f:
            torch.save(get_rng_state(), f)
        _write_json(os.path.join(folder, f"rank{rank}.json"), info)

    def _records_memory(self) -> bool:
        return bool(self._cfg.DEBUG.CUDA_MEMORY_HISTORY) and torch.cuda.is_available()

    # ---- what every rank would write the same ---------------------------------------------
    def _write_step_files(self, folder: str, iteration: int, loader: Any) -> None:
        cfg = self._cfg
        checkpoint = self._checkpointer.get_checkpoint_file()
        step: dict[str, Any] = {
            "iteration": iteration,
            "seed": cfg.SEED,
            "world_size": comm.get_world_size(),
            "accumulate_steps": cfg.SOLVER.ACCUMULATE_STEPS,
            "ims_per_batch": cfg.SOLVER.IMS_PER_BATCH,
            "last_checkpoint": os.path.basename(checkpoint) if checkpoint else None,
            "trainer": trainer_spec(self._trainer_class),
            # CPU kernels may sum in another order with another number of threads.
            "num_threads": torch.get_num_threads(),
            "records": None,
            "records_note": "",
        }
        try:
            step["records"] = self._records(iteration, checkpoint, loader)
        except Exception as e:  # the rest of the folder is still worth having
            logger.warning("Could not list the records of step %d: %s", iteration, e)
            step["records_note"] = f"{type(e).__name__}: {e}"
        with atomic_write(os.path.join(folder, "config.yaml"), "w") as f:
            f.write(cfg.dump())
        _write_json(os.path.join(folder, STEP_FILE), step)

    def _records(self, iteration: int, checkpoint: str, loader: Any) -> list[dict[str, Any]]:
        """Every rank's and micro-batch's records of step ``iteration``.

        Listed from the newest known loader position before it: the last checkpoint's, or
        where this loop started (with aspect-ratio grouping a step depends on the steps
        before, so the plan composes those in between).
        """
        start_iter, state = self._start
        if checkpoint:
            saved = upgrade_run_state(read_unsharded_part(checkpoint, keep_mapped=True))
            saved_state = continued_position(saved, comm.get_world_size())
            saved_iter = saved.get("iteration", -1)
            if is_global_position(saved_state) and start_iter <= saved_iter + 1 <= iteration:
                state = saved_state
        if not is_global_position(state) or not isinstance(loader, TrainLoader):
            raise TypeError(
                "the train loader has no position in the global stream (a stream dataset, a "
                "per-rank sampler or a loader of its own), so its records are not known"
            )
        # The loader that ran: its own records and plan, not the config's.
        (step,) = loader.spec.steps_records(1, state=state, first_step=iteration)
        ids = loader.spec.record_ids()
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
