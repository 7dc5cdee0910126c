"""Checkpoint directories of a sharded model: every process writes and reads its own shards.

A sharded checkpoint is a directory ``save_dir/{name}/`` holding what a checkpoint file holds::

    .metadata            torch.distributed.checkpoint's (DCP's) index of every tensor's chunks
    __<rank>_0.distcp    one process's shards (parameters, optimizer state, EMA, ...)
    run.pth              everything else, as rank 0 holds it: the checkpoint's dict with each
                         sharded tensor (a DTensor) replaced by ``None`` and its place listed
                         under ``"__sharded__"``: buffers, RNG states, scalars, plain data

No process ever holds the whole model: each writes its shards, and reads back the chunks of the
shards it holds in the layout of the model it loads into, so a directory loads on any number of
processes and any shard size (DCP reshards), or whole into an unsharded model on one process
with no process group. ``run.pth`` is read with ``weights_only=True`` like every checkpoint file
(DCP pickles non-tensor values, which its reader unpickles with ``weights_only=False``: none are
given to it).

A directory counts once it is complete: it is written under a hidden name, and rank 0 renames it
into place after DCP wrote ``.metadata`` (which DCP's coordinator does after every process
wrote its shards), so a crash mid-save leaves the previous checkpoint as the newest.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainkit.checkpoint._files import (
    CheckpointError,
    CorruptCheckpointError,
    read_checkpoint_file,
)
from trainkit.checkpoint.model_state import unwrap_model
from trainkit.utils.file_io import atomic_write, fsync_directory

__all__ = [
    "RUN_FILE",
    "check_parameter_names",
    "is_checkpoint_dir",
    "optimizer_parameter_names",
    "publish_directory",
    "read_sharded_checkpoint",
    "read_unsharded_part",
    "shard_like",
    "shard_optimizer_state",
    "split_sharded",
    "write_sharded_checkpoint",
]

RUN_FILE = "run.pth"
_SHARDED = "__sharded__"
_METADATA = ".metadata"


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def is_checkpoint_dir(path: str) -> bool:
    """Return whether ``path`` is a complete sharded checkpoint directory."""
    return os.path.isfile(os.path.join(path, _METADATA)) and os.path.isfile(
        os.path.join(path, RUN_FILE)
    )


def split_sharded(
    data: Any, select: Callable[[tuple[Any, ...], Any], bool] | None = None
) -> tuple[Any, dict[str, Any]]:
    """Split a checkpoint's dict into what rank 0 writes whole and the tensors DCP writes.

    Args:
        data: the checkpoint's dict.
        select: ``select(path, value)`` says whether DCP writes the leaf ``value`` found at
            ``path`` (the keys and indices leading to it); by default every DTensor. A
            converter selects whole tensors (a file's parameters and their optimizer state).

    Returns:
        ``(rest, sharded)``: ``data`` rebuilt with every selected leaf replaced by ``None``
        (dicts, lists and tuples), and ``{key: tensor}`` where ``key`` is the JSON list of the
        path to it (also listed in ``rest["__sharded__"]`` when ``data`` is a dict).
    """
    sharded: dict[str, Any] = {}

    def walk(obj: Any, path: tuple[Any, ...]) -> Any:
        if _is_dtensor(obj) if select is None else select(path, obj):
            sharded[json.dumps(path)] = obj
            return None
        if isinstance(obj, dict):
            rebuilt = type(obj)() if type(obj) is not dict else {}
            for key, value in obj.items():
                rebuilt[key] = walk(value, (*path, key))
            if hasattr(obj, "_metadata"):  # a module state dict's version metadata
                rebuilt._metadata = obj._metadata  # type: ignore[attr-defined]
            return rebuilt
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(walk(value, (*path, i)) for i, value in enumerate(obj))
        return obj

    rest = walk(data, ())
    if isinstance(rest, dict):
        rest[_SHARDED] = list(sharded)
    return rest, sharded


def write_sharded_checkpoint(
    data: dict[str, Any],
    partial_dir: str,
    *,
    is_writer: bool,
    process_group: Any = None,
    in_background: bool = False,
    select: Callable[[tuple[Any, ...], Any], bool] | None = None,
) -> Callable[[], None]:
    """Write ``data`` into ``partial_dir``: this process's shards, and ``run.pth`` on the writer.

    Collective: every process of ``process_group`` calls it with its own ``data``. The
    directory is made (and a stale one emptied) by the caller before, on the writer, with
    every process waiting for it. With ``select``, one process writes it all, alone.

    Args:
        data: the checkpoint's dict (DTensors are written by DCP, the rest by the writer).
        partial_dir: the hidden directory (see :func:`publish_directory`).
        is_writer: whether this process writes ``run.pth`` (rank 0).
        process_group: the group DCP's collectives run on (``None``: the default group).
        in_background: stage the shards to host memory now and write them in DCP's thread;
            the returned function then waits for that.
        select: the leaves DCP writes (see :func:`split_sharded`), by default the DTensors.
            Given, they are whole tensors (a file converted to a directory) and this process
            (the writer) writes them with no process group: DCP stores each as one chunk,
            which :func:`read_sharded_checkpoint` reads in any loading model's layout.

    Returns:
        A function that returns once this process's part is on disk (at once when not in
        the background); on the writer, ``.metadata`` is then written too.

    Raises:
        ValueError: If ``select`` is given with ``in_background`` or to another process.
    """
    import torch.distributed.checkpoint as dcp

    if select is not None and (in_background or not is_writer):
        raise ValueError("select (whole tensors) is written by the writer alone, not in_background")
    rest, sharded = split_sharded(data, select)
    if is_writer:
        with atomic_write(os.path.join(partial_dir, RUN_FILE), "wb") as f:
            torch.save(rest, f)
    writer = dcp.FileSystemWriter(partial_dir)
    if not in_background:
        alone = select is not None  # whole tensors: nothing to coordinate with other processes
        dcp.save(sharded, storage_writer=writer, process_group=process_group, no_dist=alone)
        return lambda: None
    future = dcp.async_save(sharded, storage_writer=writer, process_group=process_group)
    return lambda: future.result()


def publish_directory(partial_dir: str, final_dir: str) -> None:
    """Rename the complete ``partial_dir`` to ``final_dir``, replacing an older one.

    An existing ``final_dir`` (``model_final`` saved again) is moved aside first and deleted
    after; a crash between the two renames leaves no directory by that name, and a resume
    falls back to the previous checkpoint.
    """
    parent = os.path.dirname(final_dir)
    old = os.path.join(parent, f".{os.path.basename(final_dir)}.old")
    if os.path.lexists(final_dir):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final_dir, old)
    os.replace(partial_dir, final_dir)
    fsync_directory(parent)
    shutil.rmtree(old, ignore_errors=True)


def read_sharded_checkpoint(
    path: str, model: nn.Module | None, *, trust_pickle: bool = False
) -> dict[str, Any]:
    """Read the checkpoint directory ``path`` as a dict like a checkpoint file's.

    Each sharded tensor is read in the layout of ``model``'s sharded parameters (this
    process's shards only), or whole when ``model`` is not sharded (or ``None``).

    Collective:
        With a process group and a sharded ``model``: every process of the job reads together.

    Raises:
        CorruptCheckpointError: If the directory is incomplete or cannot be read.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if not is_checkpoint_dir(path):
        raise CorruptCheckpointError(
            f"Checkpoint directory {path} is incomplete (no {_METADATA} or {RUN_FILE}): it was "
            "not written to the end; delete it, or resume from another checkpoint."
        )
    checkpoint = read_checkpoint_file(os.path.join(path, RUN_FILE), trust_pickle=trust_pickle)
    keys = checkpoint.pop(_SHARDED, [])
    reader = dcp.FileSystemReader(path)
    try:
        stored = reader.read_metadata().state_dict_metadata
        layout = _shard_layout(model)
        templates = {key: _empty(stored[key], layout) for key in keys}
        sharded_here = layout is not None and dist.is_available() and dist.is_initialized()
        dcp.load(templates, storage_reader=reader, no_dist=not sharded_here)
    except (KeyError, OSError, RuntimeError, ValueError) as e:
        raise CorruptCheckpointError(
            f"Cannot read the shards of checkpoint directory {path}: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}; the directory is damaged or "
            "incomplete: delete it, or resume from another checkpoint."
        ) from e
    for key, tensor in templates.items():
        _set_at(checkpoint, json.loads(key), tensor)
    return checkpoint


def _shard_layout(model: nn.Module | None) -> tuple[Any, Any] | None:
    """``(mesh, placements)`` of ``model``'s sharded parameters, or ``None`` if not sharded."""
    if model is None:
        return None
    for param in model.parameters():
        if _is_dtensor(param):
            return param.device_mesh, param.placements
    return None


def _empty(stored: Any, layout: tuple[Any, Any] | None) -> torch.Tensor:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.tensor import empty

    if not isinstance(stored, TensorStorageMetadata):
        raise ValueError(f"a sharded entry is stored as {type(stored).__name__}, not a tensor")
    size, dtype = tuple(stored.size), stored.properties.dtype
    if layout is None:
        return torch.empty(size, dtype=dtype)
    mesh, placements = layout
    return empty(*size, dtype=dtype, device_mesh=mesh, placements=placements)


def _set_at(obj: Any, path: list[Any], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    if isinstance(obj, tuple):  # rebuilt by split_sharded; tuples hold no DTensor in practice
        raise CorruptCheckpointError(
            f"a sharded tensor at {path} sits in a tuple, which cannot be filled in place; "
            "return a list or dict from that state_dict instead of a tuple."
        )
    obj[path[-1]] = value


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Return ``value`` (a whole tensor) as ``like``'s shards when ``like`` is a DTensor.

    Every process holds ``value`` whole (read from a file) and keeps its own shards; no
    collective. Anything else is returned as it is.
    """
    if not _is_dtensor(like) or _is_dtensor(value) or not isinstance(value, torch.Tensor):
        return value
    from torch.distributed.tensor import distribute_tensor

    local = value.to(device=like.device_mesh.device_type, dtype=like.dtype)
    return distribute_tensor(local, like.device_mesh, like.placements, src_data_rank=None)


def optimizer_parameter_names(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[str]:
    """Return the name in ``model`` of each parameter ``optimizer`` holds, in state-dict order.

    The order of ``optimizer.state_dict()``'s indices; a parameter of another module is
    named ``""``. Checkpoints record it beside the optimizer's state, so a state written by
    another optimizer layout (or converted between formats) is matched by name.
    """
    names = {id(p): n for n, p in unwrap_model(model).named_parameters()}
    return [names.get(id(p), "") for group in optimizer.param_groups for p in group["params"]]


def shard_optimizer_state(
    optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> dict[str, Any]:
    """Return ``optimizer.state_dict()``-shaped ``state`` with whole tensors made shards.

    Each per-parameter tensor shaped like its (sharded) parameter becomes that parameter's
    shards (:func:`shard_like`); scalars such as Adam's ``step`` stay as they are. For a
    state read from a file or an unsharded run into a sharded model's optimizer.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    converted = dict(state)
    converted["state"] = {
        index: {
            key: shard_like(value, params[index])
            if isinstance(value, torch.Tensor) and value.shape == params[index].shape
            else value
            for key, value in per_param.items()
        }
        for index, per_param in state.get("state", {}).items()
    }
    return converted


def check_parameter_names(
    saved: list[str] | None, optimizer: torch.optim.Optimizer, model: nn.Module
) -> None:
    """Refuse an optimizer state saved for parameters other than ``optimizer``'s, in order.

    Args:
        saved: the names the checkpoint recorded (:func:`optimizer_parameter_names`);
            ``None`` (a checkpoint from before they were recorded) is not checked.

    Raises:
        CheckpointError: Naming the first parameter that differs.
    """
    if saved is None:
        return
    current = optimizer_parameter_names(optimizer, model)
    if list(saved) == current:
        return
    index = next((i for i, (a, b) in enumerate(zip(saved, current)) if a != b), None)
    difference = (
        f"{len(saved)} parameters there, {len(current)} here"
        if index is None
        else f"parameter {index} is {saved[index]!r} there, {current[index]!r} here"
    )
    raise CheckpointError(
        f"The checkpoint's optimizer state is for other parameters ({difference}): it was "
        "written by another model or optimizer set-up; resume with the config that wrote it, "
        "or start from its weights alone (MODEL.WEIGHTS, without --resume)."
    )


def read_unsharded_part(path: str, *, keep_mapped: bool = False) -> dict[str, Any]:
    """Read a checkpoint file whole, or a checkpoint directory without its shards.

    For what needs the run state only (the dry run, a failing step's records): a
    directory's ``run.pth``, with each sharded entry ``None``; no process group, and none of
    the shards is read.

    Raises:
        As :func:`~trainkit.checkpoint.read_checkpoint_file`.
    """
    if os.path.isdir(path):
        path = os.path.join(path, RUN_FILE)
    checkpoint = read_checkpoint_file(path, trust_pickle=False, keep_mapped=keep_mapped)
    checkpoint.pop(_SHARDED, None)
    return checkpoint
