"""Where each config value came from: one store for ``CfgNode`` and LazyConfig alike.

An *origin* is a short string:

* ``FILE:LINE`` — a YAML file through its ``_BASE_`` chain, or a LazyConfig file (the
  top-level statement that set the key, relative imports followed);
* ``command line`` — ``CfgNode.merge_from_list``, ``LazyConfig.apply_overrides``;
* ``auto-scaling (...)``, ``run time (...)`` — trainkit's code, which records what it
  changes (:func:`record_changes`; the old value and its origin follow);
* ``code`` — a ``cfg.X.Y = v`` in a script. An assignment records nothing, so such a key is
  found by its value: it differs from the defaults or from the value its origin set.

The merges (``merge_from_file``, ``merge_from_list``, ``merge_from_other_cfg``,
``LazyConfig.load``, ``LazyConfig.apply_overrides``) record them in the :class:`Origins` kept
beside the values of the config merged into (:func:`origins_of`; ask that one, the root),
as yacs keeps its flags: ``clone``, ``copy.deepcopy`` of a ``CfgNode`` and pickling keep it;
``dump()``, ``==`` and ``LazyConfig.save`` ignore it. A copy of a LazyConfig
(``copy.deepcopy``, ``OmegaConf.merge``) has none: its values are listed as set by code.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from trainkit.utils.registry import _target_name

if TYPE_CHECKING:
    # yacs's node, which trainkit's CfgNode extends (importing that one would be circular).
    from fvcore.common.config import CfgNode

__all__ = [
    "ORIGIN_AUTO_SCALING",
    "ORIGIN_CODE",
    "ORIGIN_COMMAND_LINE",
    "ORIGIN_RUN_TIME",
    "ConfigChange",
    "Origins",
    "config_changes",
    "format_config_changes",
    "listed_changes",
    "origins_of",
    "record_changes",
]

ORIGIN_COMMAND_LINE = "command line"
ORIGIN_AUTO_SCALING = "auto-scaling"
ORIGIN_RUN_TIME = "run time"
ORIGIN_CODE = "code"

# The attribute of a config's instance __dict__ that holds its Origins.
_STORE = "__origins__"


class ConfigChange(NamedTuple):
    """A key of a config as ``--print-config`` lists it: its full name, value and origin."""

    key: str
    value: Any
    origin: str


class Origins:
    """Where the values of one config came from: ``{dotted key: (origin, value then)}``.

    The value a merge set is kept with its origin, so that a later change that recorded
    nothing (code) is seen: the origin then no longer holds (:meth:`get` returns None).
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, Any]] = {}

    def record(self, key: str, origin: str, value: Any) -> None:
        """Record that ``origin`` set ``key`` to ``value``."""
        self._entries[key] = (origin, _snapshot(value))

    def get(self, key: str, value: Any) -> str | None:
        """Return the origin of ``key`` if its value is still ``value``, else None."""
        origin, recorded = self._entries.get(key, (None, None))
        return origin if origin is not None and recorded == _snapshot(value) else None

    def record_all(self, leaves: Mapping[str, Any], origins: Mapping[str, str] | str) -> None:
        """Record ``leaves`` (``{key: value}``) as set by ``origins``: one origin for all, or
        ``{key: origin}`` (a leaf without its own takes its deepest parent's; else none)."""
        for key, value in leaves.items():
            origin = origins if isinstance(origins, str) else _origin_below(origins, key)
            if origin is not None:
                self.record(key, origin, value)


def origins_of(cfg: Any) -> Origins:
    """Return the :class:`Origins` of ``cfg`` (a ``CfgNode`` or a LazyConfig), made if none."""
    return vars(cfg).setdefault(_STORE, Origins())


def _snapshot(value: Any) -> Any:
    # An equal copy that later in-place edits of the config's lists cannot change.
    if isinstance(value, (list, tuple)):
        return tuple(_snapshot(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _snapshot(v) for k, v in value.items()}
    return value


def listed_changes(
    leaves: Mapping[str, Any], origins: Origins, baseline: Mapping[str, Any] | None = None
) -> list[ConfigChange]:
    """Return the keys ``--print-config`` lists, sorted, each with its origin.

    ``leaves`` are ``{dotted key: value}`` of a config, ``origins`` its store. A key whose
    value equals the ``baseline``'s (the defaults' leaves) is left out; without one (a
    LazyConfig) every key is listed. A value without an origin that holds was set by code.
    """
    missing = object()
    return [
        ConfigChange(key, value, origins.get(key, value) or ORIGIN_CODE)
        for key, value in sorted(leaves.items())
        if baseline is None or baseline.get(key, missing) != value
    ]


def config_changes(cfg: CfgNode, defaults: CfgNode) -> list[ConfigChange]:
    """Return every key of ``cfg`` whose value differs from ``defaults``, with its origin.

    ``defaults`` is usually :func:`~trainkit.config.get_cfg`; a key it lacks (added by a
    script) counts as different.
    """
    return listed_changes(flat_leaves(cfg), origins_of(cfg), flat_leaves(defaults))


def record_changes(before: CfgNode, after: CfgNode, origin: str) -> None:
    """Give every key whose value differs between ``before`` and ``after`` the origin ``origin``.

    What trainkit's code calls after changing a config (auto-scaling, a drawn ``SEED``). The
    origin recorded in ``after`` also says what the value replaced and where that came
    from, e.g. ``auto-scaling from 1 to 2 processes (was 0.1, from configs/x.yaml:5)``.

    Args:
        before: the config before a step that changed values (not modified).
        after: the config after it (frozen or not).
        origin: what changed them (``ORIGIN_AUTO_SCALING``, ``ORIGIN_RUN_TIME`` with detail).
    """
    old, was_from, store = flat_leaves(before), origins_of(before), origins_of(after)
    for key, value in flat_leaves(after).items():
        if key in old and old[key] != value:
            was = was_from.get(key, old[key])
            source = f"from {was}" if was else "the default"
            store.record(key, f"{origin} (was {_yaml_value(old[key])}, {source})", value)


def format_config_changes(changes: list[ConfigChange], header: str = "") -> str:
    """Return ``changes`` as YAML, one ``KEY: VALUE  # ORIGIN`` line per key.

    The text loads with ``yaml.safe_load`` as ``{dotted key: value}``; the origins are the
    comments. Callables (a LazyConfig's ``_target_``) are written as their import path.
    ``header`` (may span lines) is written first as ``#`` comments.
    """
    rows = [(f"{change.key}: {_yaml_value(change.value)}", change.origin) for change in changes]
    width = min(max((len(text) for text, _ in rows), default=0), 60)
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    out += [f"{text.ljust(width)}  # {origin}" for text, origin in rows]
    if not rows:
        out.append("# (no key set by a file, the command line or code)")
    return "\n".join(out) + "\n"


def _yaml_value(value: Any) -> str:
    # Dumped inside a one-item flow list, so every value (scalar or list) fits on one line
    # without the document-end marker yaml adds after a lone scalar.
    return yaml.safe_dump([_plain(value)], default_flow_style=True, width=2**31).strip()[1:-1]


def _plain(value: Any) -> Any:
    """``value`` as data the safe dumper writes: lists for tuples, import paths for callables."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _target_name(value)


def flat_leaves(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Return ``{"A.B.C": value}`` for every leaf of a ``CfgNode`` or nested mapping.

    Lists and empty mappings are leaves.
    """
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            flat.update(flat_leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _origin_below(origins: Mapping[str, str], key: str) -> str | None:
    """Return the origin of the deepest of ``key`` and its parents that ``origins`` has."""
    parts = key.split(".")
    found = (origins.get(".".join(parts[:n])) for n in range(len(parts), 0, -1))
    return next(filter(None, found), None)


# ---- reading origins from files ----------------------------------------------------------
def display_path(path: str) -> str:
    """Return ``path`` relative to the working directory when it lies inside it."""
    if "://" in path:
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def yaml_key_lines(node: yaml.Node | None, path: str, prefix: str = "") -> dict[str, str]:
    """Map each leaf key of a composed YAML mapping to ``"path:line"`` (1-based).

    ``node`` is the document's root node (safe loader), taken after construction so that
    ``<<`` merge keys are already flattened into it; ``path`` is the file as shown, and
    ``prefix`` the dotted name of ``node`` (recursion). Mappings are followed; every other
    value (scalar or sequence) is a leaf: ``{"SOLVER.BASE_LR": "configs/x.yaml:12", ...}``.
    """
    lines: dict[str, str] = {}
    if not isinstance(node, yaml.MappingNode):
        return lines
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue  # a complex key; the merge reports it
        full_key = prefix + str(key_node.value)
        if isinstance(value_node, yaml.MappingNode):
            lines.update(yaml_key_lines(value_node, path, full_key + "."))
        else:
            lines[full_key] = f"{path}:{key_node.start_mark.line + 1}"
    return lines


def python_key_lines(path: str, _seen: frozenset[str] = frozenset()) -> dict[str, str]:
    """Map the keys a LazyConfig ``.py`` file sets to ``"path:line"``, without running it.

    Every top-level assignment (``train.max_iter = 10``, ``model = L(f)(a=1, ...)``,
    ``dict(...)`` and ``{...}`` literals argument by argument) and every relative import
    (``from ..common.train import train``, followed into that file), in order, a later
    statement replacing what an earlier one set below the same key. A key below one of
    these (a leaf of ``lr_multiplier = make_schedule(1)``) takes the origin of the deepest
    key listed (:meth:`Origins.record_all`).
    """
    real = os.path.realpath(path)
    if real in _seen or not os.path.isfile(path):
        return {}
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    shown = display_path(path)
    origins: dict[str, str] = {}
    for statement in tree.body:
        where = f"{shown}:{statement.lineno}"
        if isinstance(statement, ast.ImportFrom) and statement.level > 0 and statement.module:
            imported_file = relative_import_file(path, statement.module, statement.level)
            imported = python_key_lines(imported_file, _seen | {real})
            for alias in statement.names:
                name = alias.asname or alias.name
                _set(origins, name, where)
                for key, origin in imported.items():
                    if key == alias.name or key.startswith(alias.name + "."):
                        origins[name + key[len(alias.name) :]] = origin
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for key in filter(None, map(_dotted, targets)):
                if statement.value is not None:
                    _set(origins, key, where)
                    _record_arguments(statement.value, key, shown, origins)
    return origins


def relative_import_file(importer: str, module: str, level: int) -> str:
    """Return the ``.py`` file ``from {"." * level}{module} import ...`` in ``importer`` names."""
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
