"""Where each config value came from, and the report of the keys that differ from the defaults.

Every leaf a :class:`~trainkit.config.CfgNode` sets records an *origin*, a short string:

* ``FILE:LINE`` — a YAML file, through its ``_BASE_`` chain (the line of the key);
* ``command line`` — ``merge_from_list`` (the trailing ``KEY VALUE`` pairs of a script);
* ``auto-scaling (...)`` — rescaled to the world size (the old value and its origin follow);
* ``run time (...)`` — resolved when the run started, such as a random ``SEED``;
* ``code (FILE:LINE)`` — a plain ``cfg.X.Y = v`` in a script; ``code`` alone when the value
  was changed in a way that left no trace (an item assignment, an in-place edit).

The origins travel with the config (``clone``, pickling, freezing) and are never part of
its values: ``dump()`` and ``==`` are unchanged.
"""

from __future__ import annotations

import os
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

if TYPE_CHECKING:
    from trainkit.config.cfg_node import CfgNode

__all__ = [
    "ORIGIN_AUTO_SCALING",
    "ORIGIN_CODE",
    "ORIGIN_COMMAND_LINE",
    "ORIGIN_RUN_TIME",
    "ConfigChange",
    "config_changes",
    "format_config_changes",
    "record_changes",
]

ORIGIN_COMMAND_LINE = "command line"
ORIGIN_AUTO_SCALING = "auto-scaling"
ORIGIN_RUN_TIME = "run time"
ORIGIN_CODE = "code"


class ConfigChange(NamedTuple):
    """A key whose value differs from the defaults: its full name, value and origin."""

    key: str
    value: Any
    origin: str


def display_path(path: str) -> str:
    """Return ``path`` relative to the working directory when it lies inside it."""
    if "://" in path:
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def code_origin(frame: FrameType) -> str:
    """Return the origin of a value assigned by the code running in ``frame``."""
    return f"{ORIGIN_CODE} ({display_path(frame.f_code.co_filename)}:{frame.f_lineno})"


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


def config_changes(cfg: CfgNode, defaults: CfgNode) -> list[ConfigChange]:
    """Return every key of ``cfg`` whose value differs from ``defaults``, with its origin.

    Args:
        cfg: the config.
        defaults: what to compare with, usually :func:`~trainkit.config.get_cfg`'s. Keys
            absent from it (added by a script) count as different.

    Returns:
        The changes, sorted by key; an origin that was not recorded is ``"code"``.
    """
    baseline = flat_leaves(defaults)
    return [
        ConfigChange(key, value, cfg.get_origin(key) or ORIGIN_CODE)
        for key, value in sorted(flat_leaves(cfg).items())
        if key not in baseline or baseline[key] != value
    ]


def record_changes(before: CfgNode, after: CfgNode, origin: str) -> None:
    """Give every key whose value differs between ``before`` and ``after`` the origin ``origin``.

    The origin recorded in ``after`` also says what the value replaced and where that came
    from, e.g. ``auto-scaling from 1 to 2 workers (was 0.1 from configs/x.yaml:5)``.

    Args:
        before: the config before a step that changed values (not modified).
        after: the config after it (frozen or not).
        origin: what changed them (``ORIGIN_AUTO_SCALING``, ``ORIGIN_RUN_TIME`` with detail).
    """
    old = flat_leaves(before)
    for key, value in flat_leaves(after).items():
        if key in old and old[key] != value:
            was = before.get_origin(key)
            source = f"from {was}" if was else "the default"
            after.set_origin(key, f"{origin} (was {_yaml_value(old[key])}, {source})")


def format_config_changes(changes: list[ConfigChange], header: str = "") -> str:
    """Return ``changes`` as YAML, one ``KEY: VALUE  # ORIGIN`` line per key.

    The text loads with ``yaml.safe_load`` as ``{dotted key: value}``; the origins are the
    comments. ``header`` (may span lines) is written first as ``#`` comments.
    """
    rows = [(f"{change.key}: {_yaml_value(change.value)}", change.origin) for change in changes]
    width = min(max((len(text) for text, _ in rows), default=0), 60)
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    out += [f"{text.ljust(width)}  # {origin}" for text, origin in rows]
    if not rows:
        out.append("# (no key differs from the defaults)")
    return "\n".join(out) + "\n"


def _yaml_value(value: Any) -> str:
    # Dumped inside a one-item flow list, so every value (scalar or list) fits on one line
    # without the document-end marker yaml adds after a lone scalar.
    return yaml.safe_dump([_plain(value)], default_flow_style=True, width=2**31).strip()[1:-1]


def _plain(value: Any) -> Any:
    # The safe dumper knows lists, not tuples.
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def flat_leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Return ``{"A.B.C": value}`` for every leaf of a config (or nested dict)."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            flat.update(flat_leaves(value, prefix + key + "."))
        else:
            flat[prefix + key] = value
    return flat
