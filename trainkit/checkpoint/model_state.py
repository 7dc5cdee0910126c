"""A checkpoint's model state against a model: unwrapping, matching keys and shapes."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from trainkit.checkpoint._files import (
    CheckpointError,
    CorruptCheckpointError,
    read_checkpoint_file,
    strip_wrapper_prefixes,
)
from trainkit.utils.torch_private import compiled_original

__all__ = [
    "IncompatibleKeys",
    "ShapeMismatchError",
    "describe_incompatible",
    "find_shape_mismatches",
    "is_sharded",
    "matched_model_state",
    "missing_keys_without_aliases",
    "shape_changing_state_keys",
    "shape_mismatch_message",
    "unwrap_model",
]

# (key, shape in the checkpoint, shape in the model) of entries whose shapes differ.
_Mismatches = list[tuple[str, tuple[int, ...], tuple[int, ...]]]


class IncompatibleKeys(NamedTuple):
    """How a checkpoint's model state differed from the model it was loaded into."""

    missing_keys: list[str]
    unexpected_keys: list[str]
    incorrect_shapes: _Mismatches  # these entries were not loaded


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the bare module inside DDP / DataParallel / ``torch.compile`` wrappers.

    Saving the bare module keeps checkpoint keys free of ``module.`` and ``_orig_mod.``
    prefixes, so a checkpoint loads the same with or without the wrappers.
    """
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif (original := compiled_original(model)) is not None:  # torch.compile's wrapper
            model = original
        else:
            return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was sharded by FSDP2's ``fully_shard`` (its root is an ``FSDPModule``)."""
    # No import of FSDP (~0.5 s) for a run that never shards: then no model can be one.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    module_type = getattr(fsdp, "FSDPModule", None)  # torch >= 2.6
    return module_type is not None and isinstance(model, module_type)


class ShapeMismatchError(CheckpointError):
    """Entries of a checkpoint have other shapes than the model's (the message lists them)."""


def matched_model_state(
    model: nn.Module,
    state: Any,
    path: str,
    *,
    strict: bool = False,
    allow_shape_mismatch: bool = True,
) -> tuple[dict[str, Any], _Mismatches]:
    """Return the entries of a checkpoint's model state that load into ``model``.

    Wrapper prefixes (``module.``, ``_orig_mod.``) the model lacks are dropped, and entries
    whose shapes differ from the model's are left out, or refused (numpy arrays of old
    checkpoints are tensors by now: ``Checkpointer._convert_ndarray_to_tensor``).
    Quantization observers (:func:`shape_changing_state_keys`) never count as different.

    ``state`` is the checkpoint's ``"model"`` entry, ``path`` its file (for messages);
    ``strict`` refuses any missing, unexpected or differently shaped entry, and
    ``allow_shape_mismatch=False`` differently shaped ones. Returns ``(state to load,
    [(key, shape in the checkpoint, shape in the model), ...])``.

    Raises:
        CorruptCheckpointError: If ``state`` is not a state dict.
        ShapeMismatchError: If shapes differ and that is not allowed.
        CheckpointError: With ``strict``, if the state does not match the model.
    """
    model_state = model.state_dict()
    state = dict(_without_prefixes(state, path, set(model_state)))
    resizable = shape_changing_state_keys(model)
    model_shapes = {
        key: value.shape
        for key, value in model_state.items()
        # Lazy modules accept any shape until they are materialised.
        if key not in resizable and not isinstance(value, nn.parameter.UninitializedParameter)
    }
    incorrect_shapes = _shape_differences(state, model_shapes)
    if strict:
        expected = IncompatibleKeys(
            missing_keys=missing_keys_without_aliases(model, set(model_state) - set(state)),
            unexpected_keys=sorted(set(state) - set(model_state)),
            incorrect_shapes=incorrect_shapes,
        )
        if any(expected):
            # Checked before loading so a refused checkpoint leaves the model untouched.
            raise CheckpointError(
                f"Checkpoint {path} does not match the model (strict=True):\n"
                + describe_incompatible(expected)
            )
    if incorrect_shapes and not allow_shape_mismatch:
        raise ShapeMismatchError(shape_mismatch_message(path, incorrect_shapes))
    for key, _, _ in incorrect_shapes:
        del state[key]
    return state, incorrect_shapes


def missing_keys_without_aliases(model: nn.Module, missing: Iterable[str]) -> list[str]:
    """Return ``missing`` without the keys whose tensor the checkpoint filled under another name.

    A tied parameter (``self.y = self.x``) is one tensor with two state-dict keys. A
    checkpoint saved without the alias (or from a model without it) fills the tensor through
    the other key, so the alias is not missing (fvcore filters such reused keys too).

    Args:
        model: the model the state was loaded into.
        missing: its state-dict keys the checkpoint had no entry for.

    Returns:
        The keys whose tensor no key of the checkpoint filled, sorted.
    """
    missing = set(missing)
    names_of: dict[int, list[str]] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        names_of.setdefault(id(value), []).append(key)
    loaded_elsewhere = {
        key
        for names in names_of.values()
        if len(names) > 1 and not missing.issuperset(names)
        for key in names
    }
    return sorted(missing - loaded_elsewhere)


def _without_prefixes(state: Any, path: str, model_keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise CorruptCheckpointError(
            f"Checkpoint {path}: 'model' is a {type(state).__name__}, not a state dict"
        )
    return strip_wrapper_prefixes(state, model_keys)


def _shape_differences(state: Mapping[str, Any], model_shapes: Mapping[str, Any]) -> _Mismatches:
    return [
        (key, tuple(value.shape), tuple(model_shapes[key]))
        for key, value in state.items()
        if key in model_shapes
        and hasattr(value, "shape")
        and tuple(value.shape) != tuple(model_shapes[key])
    ]


def shape_changing_state_keys(model: nn.Module) -> set[str]:
    """Return the full state keys of the bare ``model``'s modules that resize buffers on load.

    Quantization observers and fake-quantize modules start with empty or per-tensor
    buffers and load per-channel statistics of another shape by design (their
    ``_load_from_state_dict`` resizes), so such differences are not mismatches.
    """
    quantization = torch.ao.quantization
    resizing_types = (quantization.ObserverBase, quantization.FakeQuantizeBase)
    keys: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, resizing_types):
            prefix = f"{name}." if name else ""
            keys.update(prefix + key for key in module.state_dict())
    return keys


def shape_mismatch_message(path: str, incorrect_shapes: _Mismatches) -> str:
    """One line naming the entries of ``path`` whose shapes differ from the model's, and the fix.

    Args:
        path: the checkpoint file.
        incorrect_shapes: ``(key, shape in the checkpoint, shape in the model)`` triples.
    """
    shown = "; ".join(f"{k} {tuple(c)} vs {tuple(m)}" for k, c, m in incorrect_shapes[:5])
    more = f"; and {len(incorrect_shapes) - 5} more" if len(incorrect_shapes) > 5 else ""
    return (
        f"Checkpoint {path} does not fit the model: {len(incorrect_shapes)} entries have other "
        f"shapes (checkpoint vs model): {shown}{more}. Use weights made for this MODEL config, "
        "or skip those entries and train their layers from scratch: set "
        "MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH True (Checkpointer(allow_shape_mismatch=True) "
        "outside a config)."
    )


def find_shape_mismatches(
    path: str, model_shapes: Mapping[str, tuple[int, ...]], *, trust_pickle: bool = False
) -> _Mismatches:
    """Compare the model state in ``path`` with ``model_shapes`` without loading any data.

    The file is memory-mapped, so only its index is read, even for a large file.

    Args:
        path: a local checkpoint file.
        model_shapes: ``{state_dict key: shape}`` of the model.
        trust_pickle: as for :class:`Checkpointer`.

    Returns:
        ``(key, shape in the checkpoint, shape in the model)`` for every key both have with
        different shapes.

    Raises:
        CorruptCheckpointError, UntrustedCheckpointError: As :meth:`Checkpointer.load`.
    """
    state = read_checkpoint_file(path, trust_pickle=trust_pickle, keep_mapped=True)["model"]
    return _shape_differences(_without_prefixes(state, path, set(model_shapes)), model_shapes)


def describe_incompatible(incompatible: IncompatibleKeys) -> str:
    """Return the lines that list what did not match, for a log message."""
    lines = []
    if shapes := incompatible.incorrect_shapes:
        lines.append(f"  skipped {len(shapes)} entries whose shapes differ (checkpoint vs model):")
        lines += [f"    {key}: {ckpt} vs {model}" for key, ckpt, model in shapes]
    if incompatible.missing_keys:
        lines.append("  missing from the checkpoint (left as initialised):")
        lines += [f"    {k}" for k in sorted(incompatible.missing_keys)]
    if incompatible.unexpected_keys:
        lines.append("  in the checkpoint but not in the model (ignored):")
        lines += [f"    {k}" for k in sorted(incompatible.unexpected_keys)]
    return "\n".join(lines)
