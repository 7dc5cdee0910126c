"""``LazyConfig`` and ``LazyCall``: detectron2's new-style Python configs, on omegaconf.

A LazyConfig is a Python (or YAML) file whose top-level dicts and ``LazyCall(f)(...)``
objects form an omegaconf ``DictConfig``: plain values and descriptions of calls, built
later with :func:`~trainkit.config.instantiate`. omegaconf is imported only when one is
used, so ``import trainkit.config`` (and every training script that uses yacs configs) does
not load it.

Beyond detectron2: :meth:`LazyConfig.save` writes a YAML file that :meth:`LazyConfig.load`
reads back (detectron2 #3482, #3225), or says in one line which value it cannot write;
:meth:`LazyConfig.apply_overrides` refuses a key that does not exist, with a did-you-mean;
and both record where each value came from, in the store a ``CfgNode`` uses
(:mod:`trainkit.config.provenance`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from trainkit.config.cfg_node import ConfigError, did_you_mean
from trainkit.config.instantiate import dump_dataclass
from trainkit.config.lazy_files import LOADER_PACKAGE, as_config, dict_config, exec_config_file
from trainkit.config.lazy_overrides import apply_overrides, flat_config_items
from trainkit.config.provenance import display_path, origins_of, python_key_lines, yaml_key_lines
from trainkit.utils.errors import MissingFileError
from trainkit.utils.file_io import PathManager, atomic_write
from trainkit.utils.registry import _convert_target_to_string, _target_name, locate

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["LazyCall", "LazyConfig"]


_TARGET = "_target_"
_EXTENSIONS = (".py", ".yaml", ".yml")


class LazyCall:
    """Describe a call without making it: ``LazyCall(f)(a=1)`` is ``{_target_: f, a: 1}``.

    The description is a ``DictConfig`` that can be edited, overridden, saved and then built
    with :func:`~trainkit.config.instantiate`::

        conv = LazyCall(nn.Conv2d)(in_channels=3, out_channels=16, kernel_size=3)
        conv.out_channels = 32
        layer = instantiate(conv)   # nn.Conv2d(3, 32, kernel_size=3)

    Args:
        target: a callable, its dotted import path, or a config that instantiates to one.
    """

    def __init__(self, target: Any) -> None:
        if not (callable(target) or isinstance(target, (str, Mapping))):
            raise TypeError(f"LazyCall needs a callable or its dotted import path, got {target!r}")
        self._target = target

    def __call__(self, *args: Any, **kwargs: Any) -> DictConfig:
        """Return the description of ``target(**kwargs)``; keyword arguments only."""
        from omegaconf import DictConfig

        if args:
            raise TypeError(
                f"LazyCall({_target_name(self._target)}) takes keyword arguments only (a config "
                "names every value it sets); pass them as name=value."
            )
        target = self._target
        if isinstance(target, type) and dataclasses.is_dataclass(target):
            # omegaconf would turn a dataclass type into a config of its fields (a
            # "structured config"): keep its import path instead, as detectron2 does.
            target = _convert_target_to_string(target)
        kwargs[_TARGET] = target
        for key, value in kwargs.items():
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                # An argument that is a dataclass instance (ShapeSpec(...)) would become a
                # config of its fields and lose its type; describe it as its own call.
                kwargs[key] = dict_config(dump_dataclass(value))
        return DictConfig(content=kwargs, flags={"allow_objects": True})


class LazyConfig:
    """Load, save, override and print LazyConfig files (static methods, as in detectron2)."""

    @staticmethod
    def load(filename: str, keys: str | Sequence[str] | None = None) -> Any:
        """Load a ``.py`` or ``.yaml`` config file.

        A ``.py`` file is executed; its relative imports (``from ..common.train import
        train``) load the named file by path, without a package, each time anew. Its
        top-level dicts and configs whose names do not start with ``_`` form the config.
        A ``.yaml`` file is read with the safe loader (what :meth:`save` writes).

        Args:
            filename: the file, absolute or relative to the working directory.
            keys: return only this top-level value (a str) or these values (a tuple).

        Returns:
            A ``DictConfig``; with ``keys`` the value(s) named, dicts as ``DictConfig``.

        Raises:
            ConfigError: If the file is not ``.py``/``.yaml`` or has a syntax error.
            MissingFileError: If it does not exist.
        """
        from omegaconf import DictConfig, ListConfig, OmegaConf

        filename = os.path.normpath(filename)
        if os.path.splitext(filename)[1] not in _EXTENSIONS:
            raise ConfigError(
                f"LazyConfig file {filename} must be a .py or .yaml file; YAML configs of "
                "CfgNode keys are read with get_cfg().merge_from_file instead."
            )
        if not PathManager.isfile(filename):
            raise MissingFileError(f"LazyConfig file not found: {filename}. Check the path.")
        if filename.endswith(".py"):
            namespace = exec_config_file(filename)
        else:
            with PathManager.open(filename, "r") as f:
                try:
                    data = yaml.safe_load(f)
                except yaml.YAMLError as e:
                    mark = getattr(e, "problem_mark", None)
                    where = f"{filename}:{mark.line + 1}" if mark is not None else filename
                    problem = getattr(e, "problem", None) or type(e).__name__
                    raise ConfigError(f"{where}: not a valid YAML file ({problem})") from None
            namespace = OmegaConf.create(data or {}, flags={"allow_objects": True})
        if keys is not None:
            if isinstance(keys, str):
                return as_config(_top_level(namespace, keys, filename))
            return tuple(as_config(_top_level(namespace, key, filename)) for key in keys)
        if filename.endswith(".py"):
            namespace = dict_config(
                {
                    name: as_config(value)
                    for name, value in namespace.items()
                    if isinstance(value, (DictConfig, ListConfig, dict))
                    and not name.startswith("_")
                }
            )
        # Where each value was set (a part asked for with ``keys`` gets the line of the
        # including file's statement that takes it, when that file is loaded).
        origins_of(namespace).record_all(flat_config_items(namespace), _file_origins(filename))
        return namespace

    @staticmethod
    def load_rel(filename: str, keys: str | Sequence[str] | None = None) -> Any:
        """Like :meth:`load`, with ``filename`` relative to the calling file (a config file).

        Raises:
            ConfigError: If the caller is not a file (``exec`` of a string, the REPL).
        """
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith("<"):
            raise ConfigError(
                f"LazyConfig.load_rel({filename!r}) was called from {caller}, not a file; use "
                "LazyConfig.load with a path instead."
            )
        return LazyConfig.load(os.path.join(os.path.dirname(caller), filename), keys)

    @staticmethod
    def save(cfg: Any, filename: str) -> None:
        """Write ``cfg`` to a YAML file that :meth:`load` reads back to an equal config.

        ``_target_`` callables are written as their import paths, tuples as lists,
        interpolations (``${..lr}``) as they are. The file is written whole or not at all.

        Raises:
            ConfigError: If a value cannot be written so that it loads back: a function or
                class defined in a config file (it has no import path), a lambda, or any other
                object that is not a number, string, list, dict or importable ``_target_``.
                The message names the key.
        """
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
        plain = _to_yaml_data(data, "", filename)
        text = yaml.safe_dump(
            plain, default_flow_style=None, allow_unicode=True, width=9999, sort_keys=False
        )
        with atomic_write(filename, "w") as f:
            f.write(text)

    @staticmethod
    def apply_overrides(cfg: Any, overrides: Sequence[str]) -> Any:
        """Set values from ``KEY=VALUE`` strings (the command line), in place.

        ``VALUE`` is read as YAML: ``10`` is an int, ``0.1`` a float, ``true`` a bool,
        ``null`` None, ``[1, 2]`` a list, anything else a string. ``+KEY=VALUE`` adds a key
        that does not exist yet (hydra's syntax, which detectron2 uses).

        Returns:
            ``cfg``.

        Raises:
            ConfigError: For an override that is not ``KEY=VALUE``, a key that does not
                exist (with the closest existing keys), a key below a plain value, or a
                deletion (``~KEY``, not supported).
        """
        return apply_overrides(cfg, overrides)

    @staticmethod
    def to_py(cfg: Any, prefix: str = "cfg.") -> str:
        """Return ``cfg`` as Python-like text, one ``prefix.key = value`` line per value.

        Calls are written as ``module.f(arg=value, ...)``. Meant for reading (logs, diffs),
        not always executable.
        """
        from omegaconf import OmegaConf

        try:
            data = OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve yet
            data = OmegaConf.to_container(cfg, resolve=False)
        return "\n".join(_py_lines(data, prefix)) + "\n"


def _file_origins(filename: str) -> dict[str, str]:
    """``{dotted key: "FILE:LINE"}`` of the keys a LazyConfig file sets (see provenance)."""
    if filename.endswith(".py"):
        return python_key_lines(filename)
    with PathManager.open(filename, "r") as f:
        return yaml_key_lines(yaml.compose(f, Loader=yaml.SafeLoader), display_path(filename))


def _top_level(namespace: Any, key: str, filename: str) -> Any:
    if key not in namespace:
        names = [n for n in namespace if not n.startswith("_")]
        raise ConfigError(
            f"{filename} has no top-level value {key!r}.{did_you_mean(key, names)} It has: "
            f"{', '.join(sorted(names))}."
        )
    return namespace[key]


def _importable_name(value: Any) -> str | None:
    """The import path that locates ``value`` back, or None (a lambda, a config's function)."""
    module = getattr(value, "__module__", None) or ""
    if module.startswith(LOADER_PACKAGE) or "<" in getattr(value, "__qualname__", "<"):
        return None
    try:
        name = _convert_target_to_string(value)
        return name if locate(name) is value else None
    except (AttributeError, ImportError):
        return None


def _to_yaml_data(value: Any, key: str, filename: str) -> Any:
    """``value`` as plain YAML data, or a ConfigError naming the key that cannot be written."""
    if isinstance(value, Mapping):
        out = {}
        for sub_key, sub_value in value.items():
            full_key = f"{key}.{sub_key}" if key else str(sub_key)
            if sub_key == _TARGET and callable(sub_value):
                name = _importable_name(sub_value)
                if name is None:
                    raise _unsaveable(filename, full_key, sub_value, "it has no import path")
                out[sub_key] = name
            else:
                out[sub_key] = _to_yaml_data(sub_value, full_key, filename)
        return out
    if isinstance(value, (list, tuple)):
        return [_to_yaml_data(v, f"{key}.{i}", filename) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    why = "only a _target_ can be a callable" if callable(value) else "YAML cannot hold it"
    raise _unsaveable(filename, key, value, why)


def _unsaveable(filename: str, key: str, value: Any, why: str) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(
        f"cannot save the config to {filename}: {key} is {shown} and {why}; define it in an "
        "importable module and use LazyCall(it) or its dotted path instead."
    )


def _py_expr(value: Any) -> str:
    if isinstance(value, Mapping) and _TARGET in value:
        args = ", ".join(f"{k}={_py_expr(v)}" for k, v in sorted(value.items()) if k != _TARGET)
        return f"{_target_name(value[_TARGET])}({args})"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {_py_expr(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py_expr(v) for v in value) + "]"
    if callable(value):
        return _target_name(value)
    return repr(value)


def _py_lines(data: Mapping[str, Any], prefix: str) -> list[str]:
    lines = []
    for key, value in sorted(data.items()):
        if isinstance(value, Mapping) and _TARGET not in value and value:
            lines.extend(_py_lines(value, f"{prefix}{key}."))
        else:
            lines.append(f"{prefix}{key} = {_py_expr(value)}")
    return lines
