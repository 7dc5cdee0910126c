"""``LazyConfig`` and ``LazyCall``: detectron2's new-style Python configs, on omegaconf.

A LazyConfig is a Python (or YAML) file whose top-level dicts and ``LazyCall(f)(...)``
objects form an omegaconf ``DictConfig``: plain values and descriptions of calls, built
later with :func:`~trainkit.config.instantiate`. omegaconf is imported only when one is
used, so ``import trainkit.config`` (and every training script that uses yacs configs) does
not load it.

Beyond detectron2: :meth:`LazyConfig.save` writes a YAML file that :meth:`LazyConfig.load`
reads back (detectron2 #3482, #3225), or says in one line which value it cannot write; and
:meth:`LazyConfig.apply_overrides` refuses a key that does not exist, with a did-you-mean.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import sys
import types
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from trainkit.config.cfg_node import ConfigError, did_you_mean
from trainkit.config.instantiate import dump_dataclass
from trainkit.utils.errors import MissingFileError
from trainkit.utils.file_io import PathManager, atomic_write
from trainkit.utils.registry import _convert_target_to_string, locate

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["LazyCall", "LazyConfig"]


class _ConfigImportError(ConfigError, ImportError):
    """A relative import in a config file that cannot be done (detectron2 raises ImportError)."""


class _OverrideKeyError(ConfigError, KeyError):
    """An override of a key that does not exist (detectron2, through omegaconf: KeyError)."""

    def __str__(self) -> str:
        # KeyError quotes its message; a user reads it as a sentence.
        return str(self.args[0]) if self.args else ""


# The __package__ of every config file this module executes: its relative imports are then
# resolved by file path (see _config_import), and the functions it defines carry this
# prefix in __module__, which is how save() knows that they cannot be imported back.
_LOADER_PACKAGE = "trainkit._cfg_loader"
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
                kwargs[key] = _dict_config(dump_dataclass(value))
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
        from omegaconf import OmegaConf

        filename = os.path.normpath(filename)
        if os.path.splitext(filename)[1] not in _EXTENSIONS:
            raise ConfigError(
                f"LazyConfig file {filename} must be a .py or .yaml file; YAML configs of "
                "CfgNode keys are read with get_cfg().merge_from_file instead."
            )
        if not PathManager.isfile(filename):
            raise MissingFileError(f"LazyConfig file not found: {filename}. Check the path.")
        if filename.endswith(".py"):
            namespace = _exec_config_file(filename)
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
                return _as_config(_top_level(namespace, keys, filename))
            return tuple(_as_config(_top_level(namespace, key, filename)) for key in keys)
        if not filename.endswith(".py"):
            return namespace
        return _dict_config(
            {
                name: _as_config(value)
                for name, value in namespace.items()
                if _is_config_value(value) and not name.startswith("_")
            }
        )

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
        from omegaconf import OmegaConf

        for override in overrides:
            key, sep, text = override.partition("=")
            key = key.strip()
            if key.startswith("~"):
                raise ConfigError(
                    f"config override {override!r} deletes a key, which is not supported; set "
                    "the key to null instead."
                )
            if not sep or not key.lstrip("+"):
                raise ConfigError(
                    f"config override {override!r} is not KEY=VALUE; write it like "
                    "train.max_iter=100 (LazyConfig overrides use '=', not a space)."
                )
            is_new = key.startswith("+")
            key = key.lstrip("+")
            _check_override_key(cfg, key, is_new)
            OmegaConf.update(cfg, key, parse_override_value(text), merge=True, force_add=is_new)
        return cfg

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


def parse_override_value(text: str) -> Any:
    """Return the value of one ``KEY=VALUE`` override: ``VALUE`` read as YAML, else as a string."""
    text = text.strip()
    if not text:
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def flat_config_items(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Return ``{"a.b.c": value}`` for every leaf of a LazyConfig (lists are leaves).

    Interpolations are not resolved; ``_target_`` callables stay objects.
    """
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat.update(flat_config_items(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _check_override_key(cfg: Any, key: str, is_new: bool) -> None:
    from omegaconf import DictConfig, ListConfig

    node = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        if isinstance(node, DictConfig):
            if part in node.keys():
                node = node[part] if _present(node, part) else None
                continue
            if is_new and depth == len(parts) - 1:
                return
            hint = did_you_mean(key, flat_config_items(cfg))
            raise _OverrideKeyError(
                f"unknown config key {key} in the command-line overrides.{hint} Prefix it "
                f"with + to add a new key (+{key}=VALUE)."
            )
        if isinstance(node, ListConfig) and part.isdigit():
            if int(part) >= len(node):
                raise _OverrideKeyError(
                    f"cannot set {key}: {prefix} is a list of {len(node)} items, so index "
                    f"{part} does not exist; set {prefix} to a longer list instead."
                )
            node = node[int(part)]
            continue
        raise _OverrideKeyError(
            f"cannot set {key}: {prefix or 'the config'} holds {type(node).__name__} "
            f"{node!r}, not a group of keys; set {prefix} itself."
        )


def _present(node: Any, key: str) -> bool:
    # A "???" (missing) value is a key without a value yet: it may be set, not walked into.
    from omegaconf import OmegaConf

    return not OmegaConf.is_missing(node, key)


def _exec_config_file(filename: str) -> dict[str, Any]:
    """Execute a ``.py`` config in a fresh namespace whose relative imports load by path."""
    with PathManager.open(filename, "r") as f:
        source = f.read()
    try:
        code = compile(source, filename, "exec")  # the file name appears in tracebacks
    except SyntaxError as e:
        raise ConfigError(
            f"{filename}:{e.lineno}: Python syntax error in the config ({e.msg})"
        ) from None
    module_name = f"{_LOADER_PACKAGE}{uuid.uuid4().hex[:8]}"
    namespace: dict[str, Any] = {
        "__file__": filename,
        "__name__": f"{module_name}.{os.path.splitext(os.path.basename(filename))[0]}",
        "__package__": module_name,
        # Our import only for this file's statements: builtins.__import__ stays untouched,
        # so other threads and modules imported meanwhile are unaffected.
        "__builtins__": {**vars(builtins), "__import__": _config_import},
    }
    exec(code, namespace)  # noqa: S102 - running a config file is what loading it means
    return namespace


def _config_import(
    name: str,
    globals: Mapping[str, Any] | None = None,  # noqa: A002 - __import__'s signature
    locals: Mapping[str, Any] | None = None,  # noqa: A002
    fromlist: Sequence[str] = (),
    level: int = 0,
) -> Any:
    package = (globals or {}).get("__package__") or ""
    if level == 0 or not package.startswith(_LOADER_PACKAGE):
        return builtins.__import__(name, globals, locals, fromlist, level)
    importer = str(globals["__file__"])  # type: ignore[index]
    if not name:
        raise _ConfigImportError(
            f"{importer}: 'from {'.' * level} import ...' (a relative import of a directory) is "
            "not supported in a config file; import names from a file: from .FILE import NAME."
        )
    directory = os.path.dirname(importer)
    for _ in range(level - 1):
        directory = os.path.dirname(directory)
    path = os.path.join(directory, *name.split(".")) + ".py"
    if not PathManager.isfile(path):
        raise _ConfigImportError(
            f"{importer}: 'from {'.' * level}{name} import ...' needs the file {path}, which "
            "does not exist."
        )
    module = types.ModuleType(f"{package}.{name}")
    module.__dict__.update(_exec_config_file(path))
    for attribute in fromlist:
        if attribute in module.__dict__:
            setattr(module, attribute, _as_config(module.__dict__[attribute]))
    return module


def _top_level(namespace: Any, key: str, filename: str) -> Any:
    if key not in namespace:
        names = [n for n in namespace if not n.startswith("_")]
        raise ConfigError(
            f"{filename} has no top-level value {key!r}.{did_you_mean(key, names)} It has: "
            f"{', '.join(sorted(names))}."
        )
    return namespace[key]


def _is_config_value(value: Any) -> bool:
    from omegaconf import DictConfig, ListConfig

    return isinstance(value, (DictConfig, ListConfig, dict))


def _as_config(value: Any) -> Any:
    # Top-level dicts of a config file become DictConfigs, so they can be edited by attribute.
    return _dict_config(value) if isinstance(value, dict) else value


def _dict_config(value: dict[str, Any]) -> DictConfig:
    from omegaconf import DictConfig

    return DictConfig(value, flags={"allow_objects": True})


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    try:
        return _convert_target_to_string(target)
    except AttributeError:
        return repr(target)


def _importable_name(value: Any) -> str | None:
    """The import path that locates ``value`` back, or None (a lambda, a config's function)."""
    module = getattr(value, "__module__", None) or ""
    if module.startswith(_LOADER_PACKAGE) or "<" in getattr(value, "__qualname__", "<"):
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
