"""Merging optimizer param groups: one group per distinct set of hyper-parameters."""

from __future__ import annotations

from typing import Any

__all__ = ["reduce_param_groups"]

# Entries of a param group that list one item per parameter, not hyper-parameters.
_GROUP_LIST_KEYS = ("params", "param_names")


def _expand_param_groups(params: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split param groups into one group per parameter, in order of first appearance.

    A parameter listed in several groups gets the union of their hyper-parameters; a later
    group's value wins. An optional ``"param_names"`` list stays aligned with ``"params"``.

    Raises:
        ValueError: If a group has no ``"params"`` or its ``"param_names"`` has another length.
    """
    per_param: dict[Any, dict[str, Any]] = {}
    for index, group in enumerate(params):
        if "params" not in group:
            raise ValueError(f"param group {index} has no 'params' entry: {sorted(group)}")
        members = list(group["params"])
        names = group.get("param_names")
        if names is not None and len(names) != len(members):
            raise ValueError(
                f"param group {index} has {len(members)} params but {len(names)} param_names"
            )
        hyperparams = {k: v for k, v in group.items() if k not in _GROUP_LIST_KEYS}
        for position, param in enumerate(members):
            # Tensors hash by identity, so two parameters never share an entry even when
            # their values are equal (and the elementwise __eq__ is never reached).
            entry = per_param.setdefault(param, {})
            entry.update(hyperparams)
            entry["params"] = [param]
            if names is not None:
                entry["param_names"] = [names[position]]
    return list(per_param.values())


def reduce_param_groups(params: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge param groups so that each distinct set of hyper-parameters has one group.

    Groups are expanded per parameter (:func:`_expand_param_groups`), then parameters with
    equal hyper-parameters are gathered in order of first appearance. Few groups keep
    torch's multi-tensor (``foreach``) optimizer kernels fast.

    Args:
        params: ``torch.optim``-style param groups (``{"params": [...], **hyperparams}``,
            optionally with ``"param_names"``).

    Returns:
        The merged groups, each ``{**hyperparams, "params": [...]}`` (plus ``"param_names"``
        where the input had them).

    Raises:
        ValueError: If a group has no ``"params"``, or parameters with and without
            ``"param_names"`` would share a group.
    """
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for entry in _expand_param_groups(params):
        hyperparams = {k: v for k, v in entry.items() if k not in _GROUP_LIST_KEYS}
        # Sorted so that the order in which keys were set does not split equal groups.
        key = tuple(sorted((k, _hashable(v)) for k, v in hyperparams.items()))
        group = merged.setdefault(key, {**hyperparams, "params": []})
        if group["params"] and ("param_names" in group) != ("param_names" in entry):
            # torch refuses optimizers whose groups mix named and unnamed parameters too.
            raise ValueError(
                "param groups mix parameters with and without 'param_names'; name all or none."
            )
        group["params"].extend(entry["params"])
        if "param_names" in entry:
            group.setdefault("param_names", []).extend(entry["param_names"])
    return list(merged.values())


def _hashable(value: Any) -> Any:
    # Config values such as betas may arrive as lists; compare them as tuples.
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
