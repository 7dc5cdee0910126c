"""Where each value of a LazyConfig came from: a file and line, or the command line.

A LazyConfig is a program, so its values carry no record of where they were set. The
origins are read from the files instead, without running them again: every top-level
assignment (``train.max_iter = 10``, ``model = L(f)(a=1, ...)``, ``dict(...)`` and
``{...}`` literals, argument by argument) and every relative import
(``from ..common.train import train``, followed into that file), in order, a later
statement replacing what an earlier one set below the same key. A value gets the origin of
the deepest key that records one: a leaf set by a call the files do not spell out
(``lr_multiplier = make_schedule(1)``) gets the line of that assignment. Values changed by
code that is not a top-level statement (a loop, a function) show that statement's line,
or ``code`` when none covers them.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Sequence
from typing import Any

from trainkit.config.lazy_overrides import flat_config_items
from trainkit.config.provenance import (
    ORIGIN_CODE,
    ORIGIN_COMMAND_LINE,
    ConfigChange,
    display_path,
    yaml_key_lines,
)
from trainkit.utils.registry import _convert_target_to_string

__all__ = ["lazy_config_values", "lazy_file_origins"]


def lazy_config_values(
    cfg: Any, config_file: str | None = None, overrides: Sequence[str] = ()
) -> list[ConfigChange]:
    """Return every leaf of ``cfg`` with its value and origin, sorted by key.

    A LazyConfig has no defaults to compare with, so every value is listed.

    Args:
        cfg: the loaded config (overrides applied).
        config_file: the file it was loaded from (``.py`` or ``.yaml``), or None.
        overrides: the ``KEY=VALUE`` command-line overrides that were applied.

    Returns:
        ``ConfigChange(key, value, origin)`` rows; callables are shown by import path.
    """
    origins = lazy_file_origins(config_file) if config_file else {}
    for override in overrides:
        key = override.partition("=")[0].strip().lstrip("+")
        _set(origins, key, ORIGIN_COMMAND_LINE)
    return [
        ConfigChange(key, _shown(value), _lookup(origins, key))
        for key, value in sorted(flat_config_items(cfg).items())
    ]


def lazy_file_origins(config_file: str) -> dict[str, str]:
    """Return ``{dotted key: "FILE:LINE"}`` for the keys a config file sets (see the module)."""
    if config_file.endswith((".yaml", ".yml")):
        import yaml

        with open(config_file) as f:
            root = yaml.compose(f, Loader=yaml.SafeLoader)
        return yaml_key_lines(root, display_path(config_file))
    return _py_origins(config_file, frozenset())


def _py_origins(path: str, seen: frozenset[str]) -> dict[str, str]:
    real = os.path.realpath(path)
    if real in seen or not os.path.isfile(path):
        return {}
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source, filename=path)
    shown = display_path(path)
    origins: dict[str, str] = {}
    for statement in tree.body:
        where = f"{shown}:{statement.lineno}"
        if isinstance(statement, ast.ImportFrom) and statement.level > 0 and statement.module:
            imported_file = _relative_file(path, statement.module, statement.level)
            imported = _py_origins(imported_file, seen | {real})
            for alias in statement.names:
                name = alias.asname or alias.name
                _set(origins, name, where)
                for key, origin in imported.items():
                    if key == alias.name or key.startswith(alias.name + "."):
                        origins[name + key[len(alias.name) :]] = origin
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                key = _dotted(target)
                if key is not None and statement.value is not None:
                    _set(origins, key, where + _computed_by(statement.value, source))
                    _record_arguments(statement.value, key, shown, origins)
    return origins


def _computed_by(value: ast.expr, source: str) -> str:
    """`` (expression)`` for a value the file computes (a call, a name), else ``""``.

    Its leaves then show where they really come from, e.g.
    ``(model_zoo.get_config("common/train.py").train)``.
    """
    if isinstance(value, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.UnaryOp, ast.BinOp)):
        return ""
    if isinstance(value, ast.Call) and (
        isinstance(value.func, ast.Call)
        or (isinstance(value.func, ast.Name) and value.func.id == "dict")
    ):
        return ""
    text = " ".join((ast.get_source_segment(source, value) or "").split())
    return f" ({text})" if text and len(text) <= 80 else ""


def _relative_file(importer: str, module: str, level: int) -> str:
    directory = os.path.dirname(importer)
    for _ in range(level - 1):
        directory = os.path.dirname(directory)
    return os.path.join(directory, *module.split(".")) + ".py"


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` (and ``a["b"]``) as a dotted key; None for other targets."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = _dotted(node.value)
        return None if parent is None else f"{parent}.{node.attr}"
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        parent = _dotted(node.value)
        return None if parent is None else f"{parent}.{node.slice.value}"
    return None


def _record_arguments(value: ast.expr, key: str, shown: str, origins: dict[str, str]) -> None:
    """Give each argument of ``L(f)(...)``, ``dict(...)`` or ``{...}`` its own line."""
    pairs: list[tuple[str, ast.expr]] = []
    if isinstance(value, ast.Call) and (
        isinstance(value.func, ast.Call)  # LazyCall(f)(...)
        or (isinstance(value.func, ast.Name) and value.func.id == "dict")
    ):
        pairs = [(kw.arg, kw.value) for kw in value.keywords if kw.arg is not None]
        if isinstance(value.func, ast.Call):
            origins[f"{key}._target_"] = f"{shown}:{value.lineno}"
    elif isinstance(value, ast.Dict):
        pairs = [
            (str(k.value), v)
            for k, v in zip(value.keys, value.values)
            if isinstance(k, ast.Constant)
        ]
    for name, argument in pairs:
        _set(origins, f"{key}.{name}", f"{shown}:{argument.lineno}")
        _record_arguments(argument, f"{key}.{name}", shown, origins)


def _set(origins: dict[str, str], key: str, origin: str) -> None:
    # A statement that sets a key replaces whatever earlier statements set below it.
    for old in [k for k in origins if k.startswith(key + ".")]:
        del origins[old]
    origins[key] = origin


def _lookup(origins: dict[str, str], key: str) -> str:
    parts = key.split(".")
    for length in range(len(parts), 0, -1):
        origin = origins.get(".".join(parts[:length]))
        if origin is not None:
            return origin
    return ORIGIN_CODE


def _shown(value: Any) -> Any:
    """A value as plain data for the YAML report: callables by import path, others by repr."""
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _shown(v) for k, v in value.items()}
    try:
        return _convert_target_to_string(value)
    except AttributeError:
        return repr(value)
