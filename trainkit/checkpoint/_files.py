"""Reading checkpoint files safely, and checking that saved data stays ``weights_only``-loadable."""

from __future__ import annotations

import collections
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Any

import torch

from trainkit.checkpoint._background import HostStaging
from trainkit.utils.errors import MissingFileError, UsageError

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "UntrustedCheckpointError",
    "find_unsafe_value",
    "read_checkpoint_file",
    "strip_wrapper_prefixes",
]


class CheckpointError(UsageError, RuntimeError):
    """A checkpoint cannot be used as asked (wrong content, or a strict load found mismatches).

    A :class:`~trainkit.utils.errors.UsageError` (the user must replace, convert or trust the
    file, or change the config it is loaded into) and a ``RuntimeError``.
    """


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file cannot be read: truncated, corrupt, or not a torch checkpoint."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint file needs full pickle (arbitrary code) to load, and it was not trusted."""


# Leaf types torch.load(weights_only=True) rebuilds without an allow-list (checked on torch
# 2.13). Exact types, not isinstance: subclasses such as IntEnum or namedtuples are pickled
# by reference to their class and are refused on load.
_PLAIN_LEAVES = (
    type(None), bool, int, float, complex, str, bytes, bytearray,
    torch.dtype, torch.device, torch.Size,
)  # fmt: skip
_PLAIN_CONTAINERS = (dict, collections.OrderedDict, list, tuple, set)
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")
# detectron2's model-zoo schemes: "detectron2://" (its model zoo), "catalog://" (Detectron's
# ImageNet backbones).
_DETECTRON2_ZOO_PREFIXES = ("detectron2://", "catalog://")


def find_unsafe_value(obj: Any, where: str = "checkpoint") -> str | None:
    """Return where in ``obj`` (named ``where``) the first value ``weights_only`` refuses is.

    ``"checkpoint['optimizer']['x'] is a numpy.ndarray"``-style text, or ``None`` if all is
    tensors, plain containers and the leaf types above (or classes the user allow-listed
    with ``torch.serialization.add_safe_globals``).
    """
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN_LEAVES:
        return None
    if type(obj) in _PLAIN_CONTAINERS:
        if isinstance(obj, Mapping):
            found = (
                find_unsafe_value(key, f"{where} key") or find_unsafe_value(v, f"{where}[{key!r}]")
                for key, v in obj.items()
            )
        else:
            found = (find_unsafe_value(v, f"{where}[{i}]") for i, v in enumerate(obj))
        return next(filter(None, found), None)
    if type(obj) in torch.serialization.get_safe_globals():
        return None
    return f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}"


def local_checkpoint_path(path_manager: Any, path: str) -> str:
    """Return a local file for ``path`` (a local path, or one iopath's ``path_manager`` fetches).

    Raises:
        MissingFileError: A ``FileNotFoundError``: if there is no such checkpoint.
        CheckpointError: If ``path`` is a detectron2 model-zoo URL (``detectron2://``).
    """
    if os.path.isfile(path):
        return path
    if path.startswith(_DETECTRON2_ZOO_PREFIXES):
        raise CheckpointError(
            f"Checkpoint {path!r} is a detectron2 model-zoo URL, which trainkit does not "
            "support: its models are detectors and its ImageNet backbones Detectron pickles "
            "(.pkl) of another model's layer names. Set MODEL.WEIGHTS (train.init_checkpoint in "
            "a LazyConfig: detectron2's common/train.py defaults to such a URL) to a torch "
            "checkpoint (.pth) of your own model, or '' to start from its initialisation."
        )
    fix = (
        "Check the path (MODEL.WEIGHTS or the argument to load), or pass '' to start from the "
        "model's initialisation."
    )
    try:
        local = path_manager.get_local_path(path)
    except Exception as e:  # iopath raises various types for unknown schemes
        raise MissingFileError(f"Checkpoint {path!r} not found ({e}). {fix}") from e
    if not os.path.isfile(local):
        raise MissingFileError(f"Checkpoint {path!r} not found. {fix}")
    return local


def read_checkpoint_file(
    path: str, *, trust_pickle: bool, keep_mapped: bool = False
) -> dict[str, Any]:
    """Load a local checkpoint file onto the CPU, explaining every failure by file name.

    Args:
        path: a local file.
        trust_pickle: load with full pickle (runs code named in the file) instead of
            ``weights_only=True``.
        keep_mapped: leave every tensor backed by the file's memory mapping (for a caller
            that only reads shapes and drops the result).

    Returns:
        The loaded dict; a bare state dict (tensors only) is returned as ``{"model": it}``.

    Raises:
        MissingFileError: A ``FileNotFoundError``: if ``path`` does not exist.
        UntrustedCheckpointError: If the file holds objects ``weights_only`` refuses.
        CorruptCheckpointError: If the file cannot be read or is not a checkpoint.
        CheckpointError: If a ``.pkl`` file cannot be read by torch (a Detectron pickle).
    """
    if not os.path.isfile(path):
        # torch.load's own error would be reported below as a corrupt file.
        raise MissingFileError(f"Checkpoint {path} not found; check the path.")
    # Memory-map a zip-format file (torch.save's since 1.6): the model's tensors are copied
    # from the page cache straight into its parameters, about twice torch.load's speed.
    # Other entries are materialised below, so nothing keeps the file mapped after loading.
    use_mmap = zipfile.is_zipfile(path)
    try:
        data = _torch_load(path, trust_pickle, use_mmap)
    except (CorruptCheckpointError, UntrustedCheckpointError) as e:
        if path.endswith(".pkl"):
            raise CheckpointError(
                f"Checkpoint {path} is not a torch checkpoint but, by its .pkl name, a "
                "Detectron (Caffe2-era) pickle of numpy arrays from detectron2's model zoo, "
                "which trainkit does not load: detectron2 renames their Caffe2 layer names "
                "to its own detection models' as it loads them. Use a .pth written by "
                "torch.save or a Checkpointer (convert the arrays with torch.from_numpy)."
            ) from e
        raise
    if not isinstance(data, dict):
        raise CorruptCheckpointError(
            f"Checkpoint {path} holds a {type(data).__name__}, not a dict; it was not written "
            "by a trainkit/fvcore/detectron2 Checkpointer or torch.save(state_dict)."
        )
    if "model" not in data:
        if data and all(isinstance(v, torch.Tensor) for v in data.values()):
            return {"model": data}  # a bare state dict, e.g. torch.save(model.state_dict())
        raise CorruptCheckpointError(
            f"Checkpoint {path} has no 'model' entry (top-level keys: "
            f"{', '.join(map(str, list(data)[:10]))}). Convert it to "
            "{'model': state_dict} or save the bare state dict."
        )
    if use_mmap and not keep_mapped:
        # The model state is copied into the model and dropped; anything else may be kept
        # by whoever loads it, and a mapped tensor would keep the file's disk space after
        # checkpoint rotation deletes it: copy it into memory.
        copied = HostStaging().copy({k: v for k, v in data.items() if k != "model"})
        data = {k: data[k] if k == "model" else copied[k] for k in data}
    return data


def _torch_load(path: str, trust_pickle: bool, use_mmap: bool) -> Any:
    """``torch.load`` onto the CPU, each failure turned into a checkpoint error naming ``path``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle, mmap=use_mmap)
    except pickle.UnpicklingError as e:
        match = _UNSUPPORTED_GLOBAL.search(str(e))
        if match is None:
            raise _corrupt(path, e) from e
        raise UntrustedCheckpointError(
            f"Checkpoint {path} stores a Python object of type {match.group(1)}, which "
            "torch.load(weights_only=True) refuses because unpickling it can run arbitrary "
            "code. If you trust this file, load it with Checkpointer(..., trust_pickle=True); "
            "better, re-save it so it holds only tensors and plain containers."
        ) from e
    except (ImportError, AttributeError) as e:
        if not trust_pickle:
            raise _corrupt(path, e) from e
        raise CheckpointError(
            f"Checkpoint {path} refers to Python code that cannot be imported here: {e}"
        ) from e
    except Exception as e:
        # Damaged bytes surface from deep inside torch.load as many types (RuntimeError from
        # the zip reader, EOFError, struct.error, UnicodeDecodeError, ...); all mean the
        # same thing to the user.
        raise _corrupt(path, e) from e


def _corrupt(path: str, error: BaseException) -> CorruptCheckpointError:
    try:
        size = f"{os.path.getsize(path)} bytes"
    except OSError:
        size = "unknown size"
    # A weights_only failure on damaged bytes opens with generic advice to retry with
    # weights_only=False, wrong for a corrupt file; its cause follows "WeightsUnpickler error:".
    message = str(error).split("WeightsUnpickler error:", 1)[-1]
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return CorruptCheckpointError(
        f"Cannot read checkpoint {path} ({size}): {type(error).__name__}: "
        f"{lines[0] if lines else type(error).__name__}. The file is truncated or corrupt (an "
        "interrupted copy or a full disk?); delete it or replace it with a good copy."
    )


def strip_wrapper_prefixes(
    state_dict: Mapping[str, Any], model_keys: set[str]
) -> collections.OrderedDict[str, Any]:
    """Drop ``module.`` (DDP) and ``_orig_mod.`` (torch.compile) prefixes the model lacks.

    A prefix is removed only when every key has it and the bare model's ``model_keys`` do
    not, so a model with a submodule literally named ``module`` keeps its keys. Returns a new
    ``OrderedDict`` (``_metadata`` carried over and renamed).
    """
    result = collections.OrderedDict(state_dict)
    metadata = getattr(state_dict, "_metadata", None)
    metadata = collections.OrderedDict(metadata) if metadata is not None else None
    changed = True
    while changed and result:
        changed = False
        for prefix in ("module.", "_orig_mod."):
            if all(k.startswith(prefix) for k in result) and not (
                model_keys and all(k.startswith(prefix) for k in model_keys)
            ):
                result = collections.OrderedDict((k[len(prefix) :], v) for k, v in result.items())
                if metadata is not None:
                    # Module version metadata is keyed by module path: "" is the wrapper
                    # (dropped), "module" the wrapped model (becomes ""), "module.xx" a
                    # submodule (becomes "xx").
                    metadata = collections.OrderedDict(
                        ((k + ".").removeprefix(prefix)[:-1], v) for k, v in metadata.items() if k
                    )
                changed = True
    if metadata is not None:
        result._metadata = metadata  # type: ignore[attr-defined]
    return result
