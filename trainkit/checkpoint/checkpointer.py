"""Atomic, unwrapped, ``weights_only``-safe checkpoints around fvcore's ``Checkpointer``.

A checkpoint holds tensors and plain containers (dict, OrderedDict, list, tuple, set) of
numbers, strings, bytes, ``None``, ``torch.dtype``/``device``/``Size``: what
``torch.load(weights_only=True)``, used by every load here, rebuilds without running code.
``save`` refuses anything else up front, naming the entry, rather than write a file that
cannot be resumed from. Convert numpy arrays to tensors or lists, and numpy's RNG state with
:func:`trainkit.utils.env.get_rng_state`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from fvcore.common.checkpoint import Checkpointer as _FvcoreCheckpointer
from torch import nn

from trainkit.checkpoint._background import BackgroundWriter, HostStaging
from trainkit.checkpoint._files import (
    CheckpointError,
    CorruptCheckpointError,
    find_unsafe_value,
    local_checkpoint_path,
    read_checkpoint_file,
)
from trainkit.checkpoint.c2_model_loading import align_and_update_state_dicts
from trainkit.checkpoint.model_state import (
    IncompatibleKeys,
    ShapeMismatchError,
    describe_incompatible,
    is_sharded,
    matched_model_state,
    missing_keys_without_aliases,
    unwrap_model,
)
from trainkit.checkpoint.sharded import (
    is_checkpoint_dir,
    publish_directory,
    read_sharded_checkpoint,
    shard_like,
    write_sharded_checkpoint,
)
from trainkit.utils import comm
from trainkit.utils.errors import MissingFileError
from trainkit.utils.file_io import PathManager, atomic_write

__all__ = ["Checkpointable", "Checkpointer"]

logger = logging.getLogger(__name__)

_TAG_FILE = "last_checkpoint"


def _split_matching_heuristics(path: str) -> tuple[str, bool]:
    """``"w.pth?matching_heuristics=True"`` -> ``("w.pth", True)``; other paths as they are."""
    base, sep, query = path.rpartition("?")
    if not sep or not query.startswith("matching_heuristics="):
        return path, False
    value = query.split("=", 1)[1]
    if value not in ("True", "False", "true", "false", "1", "0"):
        raise CheckpointError(
            f"{path!r}: matching_heuristics must be True or False, got {value!r}."
        )
    return base, value in ("True", "true", "1")


@runtime_checkable
class Checkpointable(Protocol):
    """Anything whose state can be saved and restored: modules, optimizers, schedulers, hooks."""

    def state_dict(self) -> dict[str, Any]:
        """Return the state as tensors and plain containers (see the module docstring)."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """Restore the state returned by :meth:`state_dict`."""
        ...


class Checkpointer:
    """Save and load a model plus any :class:`Checkpointable` objects.

    It wraps an fvcore ``Checkpointer`` (the model, directory and checkpointables) and
    writes, reads and restores them itself. Beyond fvcore (and the module docstring's
    content rule): saves are atomic (temp file, fsync, rename, then the ``last_checkpoint``
    tag) and hold the bare module's state; loads accept ``module.`` and ``_orig_mod.``
    prefixes, explain corrupt files by name and report shape mismatches in one message;
    :meth:`resume_or_load` falls back to older checkpoints. With ``async_save=True`` one
    background thread writes and tags, in the order of the saves. A model sharded by
    :func:`~trainkit.modeling.shard_model` is saved as a directory every process writes its
    shards into (:mod:`~trainkit.checkpoint.sharded`): its saves are collective, and
    ``save_to_disk`` then names the process that writes the rest, renames and tags. Drive
    one checkpointer from one thread. It does not decide *when* to save
    (:class:`PeriodicCheckpointer` does) and writes only local files (``os.replace``).
    Subclasses change loading at fvcore's override points, which every load calls
    (detectron2's ``DetectionCheckpointer`` way): ``_load_file``, ``_load_model`` (which calls
    ``_convert_ndarray_to_tensor``) and ``_log_incompatible_keys``.
    """

    def __init__(
        self,
        model: nn.Module,
        save_dir: str = "",
        *,
        save_to_disk: bool | None = None,
        trust_pickle: bool = False,
        strict: bool = False,
        allow_shape_mismatch: bool = True,
        async_save: bool = False,
        blocking_context: Callable[[], AbstractContextManager[Any]] | None = None,
        **checkpointables: Checkpointable,
    ) -> None:
        """Track ``model`` and ``checkpointables`` under ``save_dir``.

        Args:
            model: the model, possibly wrapped in DDP or ``torch.compile``.
            save_dir: directory of checkpoints and the ``last_checkpoint`` tag; ``""``
                disables saving.
            save_to_disk: whether :meth:`save` writes; ``None`` means on rank 0 only.
            trust_pickle: load with full pickle instead of ``weights_only=True``; only for
                trusted files: unpickling can run any code the file names.
            strict: refuse a model state whose keys or shapes differ from the model's
                (by default such entries are skipped and reported).
            allow_shape_mismatch: skip (and report) entries whose shapes differ, as
                detectron2 does; False refuses such a checkpoint, listing them.
            async_save: write files in a background thread; :meth:`save` then blocks only
                to copy the state to host memory (``SOLVER.CHECKPOINT_ASYNC``), a copy kept
                and reused by the next save: host memory as large as the state.
            blocking_context: called by each :meth:`save`; its context manager wraps what
                the caller waits for (the previous write, then the copy; everything when
                saving synchronously). ``DefaultTrainer`` marks the watchdog's
                ``checkpoint`` phase with it.
            checkpointables: objects saved and restored under their keyword, e.g.
                ``optimizer=opt, scheduler=sched``.
        """
        if save_to_disk is None:
            save_to_disk = comm.is_main_process()
        self._fvcore = _FvcoreCheckpointer(unwrap_model(model), save_dir, save_to_disk=save_to_disk)
        # The project-wide PathManager, so handlers registered by users apply here too.
        self._fvcore.path_manager = PathManager
        for key, obj in checkpointables.items():
            self.add_checkpointable(key, obj)
        self.logger = logger
        self.trust_pickle = trust_pickle
        self.strict = strict
        self.allow_shape_mismatch = allow_shape_mismatch
        self.async_save = async_save
        self._blocking_context = blocking_context or contextlib.nullcontext
        self._writer = BackgroundWriter()
        self._staging = HostStaging()  # holds one host copy between async saves
        self._restoring_path = ""  # the file _load_model is loading, for its messages
        self._background_group: Any = None  # async sharded saves' own Gloo group

    @property
    def model(self) -> nn.Module:
        """The bare model (DDP and ``torch.compile`` wrappers removed)."""
        return self._fvcore.model

    @property
    def checkpointables(self) -> dict[str, Checkpointable]:
        """The objects saved beside the model, by key (see :meth:`add_checkpointable`)."""
        return self._fvcore.checkpointables

    @property
    def save_dir(self) -> str:
        """The directory of the checkpoints and the ``last_checkpoint`` tag."""
        return self._fvcore.save_dir

    @property
    def save_to_disk(self) -> bool:
        """Whether :meth:`save` writes (on one rank)."""
        return self._fvcore.save_to_disk

    @property
    def path_manager(self) -> Any:
        """The iopath ``PathManager`` that lists and reads ``save_dir`` (and fetches paths)."""
        return self._fvcore.path_manager

    @path_manager.setter
    def path_manager(self, path_manager: Any) -> None:
        # detectron2's DetectionCheckpointer sets its own in __init__.
        self._fvcore.path_manager = path_manager

    def add_checkpointable(self, key: str, checkpointable: Checkpointable) -> None:
        """Track one more object under ``key`` (see the constructor's ``checkpointables``).

        Raises:
            KeyError: If ``key`` is taken or is ``"model"``.
            TypeError: If the object lacks ``state_dict``/``load_state_dict``.
        """
        if key == "model":
            raise KeyError("'model' is reserved for the model's state; pick another key")
        if not hasattr(checkpointable, "load_state_dict"):
            raise TypeError(f"checkpointable {key!r} has no load_state_dict() method")
        self._fvcore.add_checkpointable(key, checkpointable)

    def save(self, name: str, *, tag_last: bool = True, **kwargs: Any) -> None:
        """Atomically write ``save_dir/{name}.pth`` and then point ``last_checkpoint`` at it.

        Does nothing when ``save_dir`` is empty or ``save_to_disk`` is False (other ranks).
        With ``async_save``, returns once the state is copied to host memory. A sharded model
        is saved as the directory ``save_dir/{name}/`` by every process (call it on all).

        Args:
            name: file name without ``.pth``.
            tag_last: point ``last_checkpoint`` at the new file (what ``--resume`` loads);
                False for side copies such as the best model, never a resume point.
            kwargs: extra data stored next to the states (returned by :meth:`load`).

        Raises:
            ValueError: If ``name`` contains a directory or an extra key shadows a state.
            TypeError: If some value could not be loaded back with ``weights_only=True``.
            CheckpointWriteError: If the previous background write failed (no save is made).
        """
        sharded = is_sharded(self.model)
        if not self.save_dir or not (self.save_to_disk or sharded):
            return
        basename = name if sharded else f"{name}.pth"
        if os.path.basename(basename) != basename:
            raise ValueError(f"checkpoint name {name!r} must be a file name, not a path")
        with self._blocking_context():
            # One write at a time, in order: the previous one is complete (and tagged)
            # before this state is even copied, so at most one host copy exists.
            self._writer.wait()
            data = {"model": self.model.state_dict()}
            data.update((key, obj.state_dict()) for key, obj in self.checkpointables.items())
            if clashes := sorted(set(kwargs) & set(data)):
                raise ValueError(f"extra data keys {clashes} clash with checkpointable names")
            data.update(kwargs)
            unsafe = None if self.trust_pickle else find_unsafe_value(data)
            if unsafe is not None:
                raise TypeError(
                    f"Cannot save {basename}: {unsafe}, which torch.load(weights_only=True) "
                    "cannot read back. Store tensors and plain containers only (convert "
                    "numpy arrays with torch.from_numpy or .tolist())."
                )
            if self.save_to_disk:
                self.path_manager.mkdirs(self.save_dir)
            save_file = os.path.join(self.save_dir, basename)
            if sharded:
                self._save_sharded(save_file, data, tag_last)
                return
            if not self.async_save:
                self.logger.info("Saving checkpoint to %s", save_file)
                self._write_checkpoint(save_file, data, tag_last)
                return
            host_copy = self._staging.copy(data)
        del data  # the live state: only the copy goes to the writer thread
        self.logger.info("Saving checkpoint to %s (written in the background)", save_file)
        self._writer.submit(
            f"write of checkpoint {save_file}",
            functools.partial(self._write_checkpoint, save_file, host_copy, tag_last),
            advice="The last_checkpoint tag still names the previous checkpoint; fix the cause "
            "(e.g. free disk space) and resume with --resume.",
        )

    def checkpoint_path(self, name: str) -> str:
        """Return where :meth:`save` writes checkpoint ``name``: a file, or a sharded directory."""
        return os.path.join(self.save_dir, name if is_sharded(self.model) else f"{name}.pth")

    def _save_sharded(self, save_dir: str, data: dict[str, Any], tag_last: bool) -> None:
        # Collective. Written under a hidden name, renamed into place once complete.
        name = os.path.basename(save_dir)
        partial = os.path.join(self.save_dir, f".{name}.partial")
        if self.save_to_disk:
            shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-save
            os.makedirs(partial)
        comm.synchronize()  # nobody writes shards into the stale directory
        group = self._checkpoint_group() if self.async_save else None
        self.logger.info(
            "Saving sharded checkpoint to %s%s",
            save_dir,
            " (written in the background)" if self.async_save else "",
        )
        written = write_sharded_checkpoint(
            data,
            partial,
            is_writer=self.save_to_disk,
            process_group=group,
            in_background=self.async_save,
        )
        del data

        def finish() -> None:
            written()
            if self.save_to_disk:
                publish_directory(partial, save_dir)
                if tag_last:
                    self.tag_last_checkpoint(name)

        if not self.async_save:
            finish()
            return
        self._writer.submit(
            f"write of checkpoint {save_dir}",
            finish,
            advice="The last_checkpoint tag still names the previous checkpoint; fix the cause "
            "(e.g. free disk space) and resume with --resume.",
        )

    def _checkpoint_group(self) -> Any:
        # DCP's collectives in the writer thread run on a group of their own, so they never
        # interleave with training's on the default group (created collectively, once).
        if self._background_group is None:
            import torch.distributed as dist

            self._background_group = dist.new_group(backend="gloo")
        return self._background_group

    def _write_checkpoint(self, save_file: str, data: dict[str, Any], tag_last: bool) -> None:
        # Runs on the writer thread when saving asynchronously. The tag moves only after
        # the new file is complete and durable: a crash leaves it naming a loadable file.
        with atomic_write(save_file, "wb") as f:
            torch.save(data, f)
        if tag_last:
            self.tag_last_checkpoint(os.path.basename(save_file))

    @property
    def write_pending(self) -> bool:
        """Whether a background write (or work queued after it) has not finished yet."""
        return self._writer.pending

    def wait(self) -> None:
        """Block until the last background write is on disk and tagged (no-op if none).

        Raises:
            CheckpointWriteError: If a background write failed and was not reported yet.
        """
        self._writer.wait()

    def raise_if_write_failed(self) -> None:
        """Raise the failure of a finished background write, if any; never blocks.

        Raises:
            CheckpointWriteError: As :meth:`wait`.
        """
        self._writer.raise_if_failed()

    def call_after_write(self, fn: Callable[[], None], what: str) -> None:
        """Run ``fn`` once the checkpoint saved last is on disk and tagged.

        With nothing pending, that is now. Otherwise ``fn`` runs in the writer thread right
        after that write, not at all if the write fails; its own failure is reported like a
        failed write, described by ``what``.
        """
        if not self._writer.pending:
            self._writer.raise_if_failed()
            fn()
            return
        self._writer.submit(what, fn, after_success=True)

    def close(self) -> None:
        """:meth:`wait`, then stop the writer thread and free the host copy (until a later save)."""
        try:
            self._writer.close()
        finally:
            self._staging.clear()

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        """Atomically record ``last_filename_basename`` as the newest checkpoint."""
        with atomic_write(os.path.join(self.save_dir, _TAG_FILE), "w") as f:
            f.write(last_filename_basename)

    def has_checkpoint(self) -> bool:
        """Return whether ``save_dir`` has a ``last_checkpoint`` tag."""
        return bool(self.save_dir) and self._fvcore.has_checkpoint()

    def get_checkpoint_file(self) -> str:
        """Return the path the ``last_checkpoint`` tag names, or ``""`` without a tag."""
        path = self._fvcore.get_checkpoint_file() if self.save_dir else ""
        return path if os.path.basename(path) else ""  # an empty tag names nothing

    def get_all_checkpoint_files(self) -> list[str]:
        """Return every checkpoint in ``save_dir``, newest first (by modification time).

        Files ending in ``.pth`` and complete sharded checkpoint directories.
        """
        if not self.save_dir or not self.path_manager.isdir(self.save_dir):
            return []
        files = self._fvcore.get_all_checkpoint_files()
        if os.path.isdir(self.save_dir):
            entries = (os.path.join(self.save_dir, e) for e in os.listdir(self.save_dir))
            files += [e for e in entries if not e.startswith(".") and is_checkpoint_dir(e)]
        return sorted(files, key=lambda p: (os.path.getmtime(p), p), reverse=True)

    def load(self, path: str, checkpointables: list[str] | None = None) -> dict[str, Any]:
        """Load the model (and checkpointables) from ``path``.

        Args:
            path: a local path or any path ``PathManager`` resolves; ``""`` loads nothing.
                With ``?matching_heuristics=True`` appended (detectron2's syntax), weights
                named without the model's prefixes load by suffix matching
                (:func:`~trainkit.checkpoint.c2_model_loading.align_and_update_state_dicts`).
            checkpointables: names of checkpointables to restore; ``None`` means all,
                ``[]`` only the model.

        Returns:
            What is left of the checkpoint: extra data from ``save(**extra)`` and states
            that were not restored.

        Raises:
            MissingFileError: A ``FileNotFoundError``: if ``path`` does not exist.
            CorruptCheckpointError: If the file cannot be read.
            UntrustedCheckpointError: If the file needs full pickle and ``trust_pickle`` is
                False.
            CheckpointError: With ``strict=True``, if the model state does not match.
        """
        if not path:
            self.logger.info("No checkpoint given; the model keeps its initialisation.")
            return {}
        path, matching_heuristics = _split_matching_heuristics(path)
        local_path = path if os.path.isdir(path) else local_checkpoint_path(self.path_manager, path)
        checkpoint = self._load_file(local_path)
        if matching_heuristics:
            checkpoint["model"] = align_and_update_state_dicts(
                self.model.state_dict(), checkpoint["model"], c2_conversion=False
            )
        return self._restore(checkpoint, local_path, checkpointables)

    def resume_or_load(
        self, path: str, resume: bool = True, *, checkpointables: list[str] | None = None
    ) -> dict[str, Any]:
        """Resume from ``save_dir`` if asked and possible, else load the weights at ``path``.

        With ``resume`` and a ``last_checkpoint`` tag, the tagged file is loaded with the
        ``checkpointables`` named (as in :meth:`load`; those not restored are returned for
        the caller). If it is unreadable (missing, truncated, corrupt), the other ``.pth``
        files in ``save_dir`` are tried newest first, with a warning naming each skipped
        file. Otherwise only the model is loaded from ``path`` (``""``: nothing). Returns
        what :meth:`load` returns.

        Raises:
            CheckpointWriteError: If this checkpointer's last background write failed.
            CheckpointError: If resuming and no checkpoint in ``save_dir`` is readable.
            MissingFileError: A ``FileNotFoundError``: if ``path`` is used and does not exist.
        """
        self._writer.wait()  # a checkpoint still being written in the background counts
        if resume and self.has_checkpoint():
            return self._resume_newest_loadable(checkpointables)
        return self.load(path, checkpointables=[])

    def _resume_newest_loadable(self, checkpointables: list[str] | None) -> dict[str, Any]:
        tagged = self.get_checkpoint_file()
        candidates = [tagged] if tagged else []
        candidates += [f for f in self.get_all_checkpoint_files() if f != tagged]
        problems = []
        for candidate in candidates:
            try:
                checkpoint = self._load_file(candidate)
            except (MissingFileError, CorruptCheckpointError) as e:
                self.logger.warning("Skipping checkpoint %s: %s", candidate, e)
                problems.append(f"{candidate}: {e}")
                continue
            if problems:
                self.logger.warning("Resuming from older checkpoint %s", candidate)
            self.logger.info("Resuming from %s", candidate)
            try:
                return self._restore(checkpoint, candidate, checkpointables)
            except ShapeMismatchError as e:
                # The run's own checkpoint no longer fits: the config changed.
                raise ShapeMismatchError(
                    f"{e} It is the checkpoint --resume continues from: run with the "
                    "config that wrote it, or train into another OUTPUT_DIR."
                ) from None
        raise CheckpointError(
            f"Cannot resume: no readable checkpoint in {self.save_dir}. Tried:\n  "
            + "\n  ".join(problems or ["(no .pth files)"])
            + "\nMove the broken files away, or start without --resume."
        )

    def _load_file(self, f: str) -> dict[str, Any]:
        """Read the local file ``f`` as ``{"model": state dict, ...}`` (fvcore's override point).

        A sharded checkpoint directory is read in the layout of this checkpointer's model
        (:func:`~trainkit.checkpoint.sharded.read_sharded_checkpoint`).

        Raises:
            As :func:`~trainkit.checkpoint.read_checkpoint_file` (with ``trust_pickle``).
        """
        if os.path.isdir(f):
            return read_sharded_checkpoint(f, self.model, trust_pickle=self.trust_pickle)
        return read_checkpoint_file(f, trust_pickle=self.trust_pickle)

    def _load_model(self, checkpoint: dict[str, Any]) -> IncompatibleKeys:
        """Load ``checkpoint["model"]`` (popped) into the model; fvcore's override point.

        Projects subclass ``DetectionCheckpointer`` and override this to remap or filter
        names, calling ``super()._load_model(checkpoint)``; what it returns is what the
        load then reports (a subclass may drop keys from its lists first).

        Returns:
            The missing and unexpected keys and the entries skipped for their shapes.
        """
        state = checkpoint.pop("model")
        if isinstance(state, Mapping):  # else matched_model_state explains
            self._convert_ndarray_to_tensor(state)
        state, incorrect_shapes = matched_model_state(
            self.model,
            state,
            self._restoring_path,
            strict=self.strict,
            allow_shape_mismatch=self.allow_shape_mismatch,
        )
        if is_sharded(self.model):
            # Whole tensors (a file, or a directory read whole) become this process's shards.
            own = self.model.state_dict()
            state = {k: shard_like(v, own[k]) if k in own else v for k, v in state.items()}
        result = self.model.load_state_dict(state, strict=False)
        return IncompatibleKeys(
            missing_keys_without_aliases(self.model, result.missing_keys),
            list(result.unexpected_keys),
            incorrect_shapes,
        )

    def _convert_ndarray_to_tensor(self, state_dict: dict[str, Any]) -> None:
        """Turn the numpy arrays of a model state (old checkpoints) into tensors, in place.

        Raises:
            CorruptCheckpointError: If a value is neither a tensor nor an array.
        """
        for key, value in state_dict.items():
            if isinstance(value, np.ndarray):
                state_dict[key] = torch.from_numpy(value)
            elif not isinstance(value, torch.Tensor):
                raise CorruptCheckpointError(
                    f"Checkpoint {self._restoring_path}: model entry {key!r} is a "
                    f"{type(value).__name__}, not a tensor or array"
                )

    def _log_incompatible_keys(self, incompatible: IncompatibleKeys) -> None:
        """Log what of the model state did not match the model (fvcore's override point)."""
        if any(incompatible):
            self.logger.warning(
                "The checkpoint does not fully match the model:\n%s",
                describe_incompatible(incompatible),
            )

    def _restore(
        self, checkpoint: dict[str, Any], path: str, checkpointables: list[str] | None
    ) -> dict[str, Any]:
        self.logger.info("Loading checkpoint from %s", path)
        self._restoring_path = path
        incompatible = self._load_model(checkpoint)
        if incompatible is not None:  # as fvcore: a subclass's _load_model may return None
            self._log_incompatible_keys(incompatible)
        names = list(self.checkpointables) if checkpointables is None else checkpointables
        for key in names:
            if key not in self.checkpointables:
                raise KeyError(
                    f"{key!r} is not a checkpointable of this Checkpointer; registered: "
                    f"{', '.join(self.checkpointables) or '(none)'}"
                )
            if key in checkpoint:
                self.logger.info("Loading %s from %s", key, path)
                self.checkpointables[key].load_state_dict(checkpoint.pop(key))
            else:
                self.logger.warning("%s has no state for %r; it keeps its current state", path, key)
        return checkpoint
