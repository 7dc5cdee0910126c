"""``instantiate``: build the objects a LazyConfig describes (``_target_`` and its arguments)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping
from typing import Any

from trainkit.config.cfg_node import ConfigError, did_you_mean
from trainkit.utils.registry import _convert_target_to_string, _target_name, locate

__all__ = ["dump_dataclass", "instantiate"]

logger = logging.getLogger(__name__)

_TARGET = "_target_"


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def instantiate(cfg: Any) -> Any:
    """Build what ``cfg`` describes, arguments first (depth first), as detectron2 does.

    A mapping with ``_target_`` is called: ``_target_(**other keys)``, each argument
    instantiated first; ``_target_`` is a callable or its dotted import path. A list (or
    ``ListConfig``) is instantiated item by item, and so is a tuple, which omegaconf >= 2.4
    keeps as a ``TupleConfig`` (the result is a plain tuple). Anything else, a mapping
    without ``_target_`` included, is returned as it is.

    Args:
        cfg: a ``LazyCall`` description, a list of them, or any value.

    Returns:
        The object built (a ``ListConfig`` of objects for a ``ListConfig``).

    Raises:
        ConfigError: If a ``_target_`` cannot be imported or is not callable, the arguments
            do not fit its signature (with the closest parameter names), or a value is
            missing (``???``). Errors raised by the target itself propagate unchanged.
    """
    import omegaconf
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    if isinstance(cfg, ListConfig):
        return ListConfig([instantiate(x) for x in cfg], flags={"allow_objects": True})
    if isinstance(cfg, list):
        # Many constructors take lists of objects (augmentations, hooks, layers).
        return [instantiate(x) for x in cfg]
    if isinstance(cfg, getattr(omegaconf, "TupleConfig", ())):
        # omegaconf >= 2.4 keeps a config's tuples as TupleConfig (older versions made them
        # lists): their items are built too, and the target gets a plain tuple.
        return tuple(instantiate(x) for x in cfg)
    if isinstance(cfg, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(cfg)):
        # A dataclass instance assigned into a config became a config of its fields.
        return OmegaConf.to_object(cfg)
    if not (isinstance(cfg, Mapping) and _TARGET in cfg):
        return cfg
    try:
        kwargs = {key: instantiate(value) for key, value in cfg.items()}
    except MissingMandatoryValue as e:
        raise ConfigError(
            f"config key {e.full_key} has no value (???); set it in the config or on the "
            f"command line ({e.full_key}=VALUE)."
        ) from None
    target = kwargs.pop(_TARGET)
    name = _target_name(target)
    if isinstance(target, str):
        try:
            target = locate(target)
        except ImportError:
            raise ConfigError(
                f"_target_ {name!r} cannot be imported; check its spelling and that its "
                "package is installed."
            ) from None
    if not callable(target):
        raise ConfigError(f"_target_ {name} is a {type(target).__name__}, not a callable.")
    _check_arguments(target, name, kwargs)
    try:
        return target(**kwargs)
    except TypeError:
        # The target's own TypeError, not the arguments' (those were checked): say where.
        logger.error("Error while instantiating %s", name)
        raise


def dump_dataclass(obj: Any) -> dict[str, Any]:
    """Return a dataclass instance as a config that :func:`instantiate` builds back.

    Nested dataclasses (also in lists and tuples) become configs too.

    Raises:
        TypeError: If ``obj`` is not a dataclass instance.
    """
    if not _is_dataclass_instance(obj):
        raise TypeError(f"dump_dataclass needs a dataclass instance, got {obj!r}")
    out: dict[str, Any] = {_TARGET: _convert_target_to_string(type(obj))}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if _is_dataclass_instance(value):
            value = dump_dataclass(value)
        elif isinstance(value, (list, tuple)):
            value = [dump_dataclass(v) if _is_dataclass_instance(v) else v for v in value]
        out[field.name] = value
    return out


def _check_arguments(target: Any, name: str, kwargs: dict[str, Any]) -> None:
    """Raise a ConfigError if ``kwargs`` cannot bind to ``target``'s signature."""
    if "cfg" in kwargs:
        return  # a @configurable callable given a config: its from_config decides
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # a builtin without a signature: let the call decide
    params = signature.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for key in kwargs:
            if key not in params:
                hint = did_you_mean(key, params)
                raise ConfigError(f"{name} has no argument {key!r} (set in its config).{hint}")
    try:
        signature.bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"cannot call {name} with the config's arguments: {e}.") from None
