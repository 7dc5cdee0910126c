"""``CfgNode`` with strict, explained merges, ``_BASE_`` inheritance and safe YAML only."""

from __future__ import annotations

import ast
import copy
import difflib
import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

from fvcore.common.config import CfgNode as _FvcoreCfgNode

from trainkit.config.compat import upgrade_partial
from trainkit.config.errors import ConfigError
from trainkit.config.provenance import (
    ORIGIN_COMMAND_LINE,
    display_path,
    flat_leaves,
    origins_of,
)
from trainkit.config.yaml_files import BASE_KEY, load_yaml_with_origins

__all__ = ["CfgNode", "ConfigError", "did_you_mean"]


# An origin argument of the checked merge: one origin for every key, or one per full key.
_Origins = Union[Mapping[str, str], str]


class CfgNode(_FvcoreCfgNode):
    """A yacs/fvcore config node whose merges are strict and explain themselves.

    Unlike fvcore's node:

    * an unknown key, in a file or in ``merge_from_list``, raises :class:`ConfigError` naming
      the key, the file and the closest existing keys;
    * a value of the wrong type names the key, the expected and the given type; an int is
      accepted where a float is expected, and a list where a tuple is (and vice versa);
    * ``_BASE_`` paths are relative to the including file, followed recursively, and a cycle
      is an error that shows the chain of files;
    * YAML is parsed with the safe loader, so a config file cannot run code; a file with a
      ``!!python/...`` tag is refused, saying where, unless merged with ``allow_unsafe=True``;
    * the merges record where each value came from (:meth:`get_origin`; see
      :mod:`trainkit.config.provenance`): a file and line, or the command line; auto-scaling
      and run time record theirs. An assignment records nothing and costs nothing extra.
    """

    # ---- provenance ------------------------------------------------------------------
    def get_origin(self, full_key: str) -> str | None:
        """Return where the value of ``full_key`` (e.g. ``"SOLVER.BASE_LR"``) came from.

        Ask the config the merges were made into (the root), not one of its groups.

        Returns:
            ``"FILE:LINE"``, ``"command line"``, ``"auto-scaling (...)"`` or ``"run time
            (...)"``; None for a value no merge set (a default, or a value set by code) or
            one changed since by code (the recorded value no longer matches).

        Raises:
            KeyError: If ``full_key`` names no leaf of this config.
        """
        return origins_of(self).get(full_key, self._leaf(full_key))

    def set_origin(self, full_key: str, origin: str) -> None:
        """Record ``origin`` for the current value of ``full_key`` (allowed when frozen).

        Raises:
            KeyError: If ``full_key`` names no leaf of this config.
        """
        origins_of(self).record(full_key, origin, self._leaf(full_key))

    def _leaf(self, full_key: str) -> Any:
        node: Any = self
        *parents, leaf = full_key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, CfgNode) else None
        if not isinstance(node, CfgNode) or leaf not in node or isinstance(node[leaf], dict):
            raise KeyError(f"{full_key} is not a config key with a value")
        return node[leaf]

    # ---- loading files ---------------------------------------------------------------
    @classmethod
    def load_yaml_with_base(cls, filename: str, allow_unsafe: bool = False) -> dict[str, Any]:
        """Load a YAML config file as a dict, with its ``_BASE_`` files merged underneath.

        Args:
            filename: the config file.
            allow_unsafe: as for :func:`~trainkit.config.yaml_files.load_yaml_with_origins`:
                accept ``!!python/...`` tags (they can run any code), only for trusted files.

        Raises:
            ConfigError: As :func:`~trainkit.config.yaml_files.load_yaml_with_origins`.
        """
        return load_yaml_with_origins(filename, allow_unsafe=allow_unsafe)[0]

    def merge_from_file(self, cfg_filename: str, allow_unsafe: bool = False) -> None:
        """Merge a YAML file (and its ``_BASE_`` chain) into this config.

        Args:
            cfg_filename: the config file.
            allow_unsafe: accept ``!!python/...`` tags (PyYAML's unsafe loader, with a logged
                warning; see :meth:`load_yaml_with_base`). detectron2 accepts them by default.

        Raises:
            ConfigError: On any problem with the file or its keys and values.
        """
        if type(self).load_yaml_with_base.__func__ is not CfgNode.load_yaml_with_base.__func__:
            # A subclass changed the loading (a detectron2 extension point): use it; the
            # origins are then the file without lines.
            loaded = self.load_yaml_with_base(cfg_filename, allow_unsafe=allow_unsafe)
            origin: _Origins = display_path(os.path.abspath(cfg_filename))
        else:
            loaded, origin = load_yaml_with_origins(cfg_filename, allow_unsafe=allow_unsafe)
        if "VERSION" in self:
            # A file of an older detectron2 VERSION: its renamed keys become today's.
            upgrade_partial(loaded, cfg_filename)
        self._merge_checked(loaded, source=f"file {cfg_filename}", origins=origin)

    def merge_from_other_cfg(self, cfg_other: _FvcoreCfgNode) -> None:
        """Merge another config node into this one with the same checks as a file.

        The origins ``cfg_other`` recorded come along; a value it changes without one is
        then one set by code.
        """
        store = origins_of(cfg_other)
        origins = {k: o for k, v in flat_leaves(cfg_other).items() if (o := store.get(k, v))}
        self._merge_checked(cfg_other, source="another config", origins=origins)

    def merge_from_list(self, cfg_list: list[str]) -> None:
        """Merge ``["KEY.PATH", value, ...]`` pairs (e.g. command-line overrides).

        Values given as strings are parsed as Python literals when they look like one
        (``"0.1"``, ``"(1, 2)"``, ``"True"``), as yacs does.

        Raises:
            ConfigError: On an odd-length list, an unknown key or a wrong value type.
        """
        flags = [item for item in cfg_list[0::2] if isinstance(item, str) and item[:1] == "-"]
        if flags:
            # argparse's REMAINDER takes everything after the first KEY VALUE pair.
            raise ConfigError(
                f"{flags[0]} came after the config overrides, so it was read as a key; put "
                "the script's flags before the KEY VALUE pairs."
            )
        if len(cfg_list) % 2:
            raise ConfigError(
                f"config overrides must come in KEY VALUE pairs; got an odd number of items: "
                f"{list(cfg_list)}"
            )
        for full_key, value in zip(cfg_list[0::2], cfg_list[1::2]):
            if not isinstance(full_key, str):
                raise ConfigError(
                    f"config override key {full_key!r} is a {type(full_key).__name__}; keys "
                    "are names such as MODEL.DEVICE, followed by their value."
                )
            if full_key == BASE_KEY:
                raise ConfigError("_BASE_ can only be used inside config files")
            node: Any = self
            for part in full_key.split("."):
                if not isinstance(node, _FvcoreCfgNode) or not (
                    part in node or node.is_new_allowed()
                ):
                    self._raise_unknown(full_key, "the command line")
                if part not in node:
                    break
                node = node[part]
            for part in reversed(full_key.split(".")):
                value = {part: value}
            self._merge_checked(value, source="the command line", origins=ORIGIN_COMMAND_LINE)

    # ---- the checked merge -----------------------------------------------------------
    def _merge_checked(
        self,
        other: dict[str, Any],
        source: str,
        origins: _Origins,
        prefix: str = "",
        root: CfgNode | None = None,
    ) -> None:
        root = self if root is None else root
        for key, value in other.items():
            if not isinstance(key, str):
                # YAML reads `1:` or `yes:` as a number or a bool, not as a key name.
                raise ConfigError(
                    f"config key {prefix}{key!r} (in {source}) is a {type(key).__name__}, not a "
                    "name; every key is a name such as MODEL.DEVICE. Fix the key."
                )
            full_key = prefix + key
            if key == BASE_KEY:
                raise ConfigError(f"_BASE_ can only be used inside config files (in {source})")
            if key not in self:
                if not self.is_new_allowed():
                    root._raise_unknown(full_key, source)
                value = _decode(copy.deepcopy(value))
                is_group = isinstance(value, dict)
                self[key] = type(self)(value) if is_group else value
                leaves = flat_leaves(self[key], f"{full_key}.") if is_group else {full_key: value}
                origins_of(root).record_all(leaves, origins)
                continue
            current = self[key]
            if isinstance(current, _FvcoreCfgNode):
                if not isinstance(value, dict):
                    raise ConfigError(
                        f"config key {full_key} (in {source}) is a group of keys "
                        f"({', '.join(sorted(current))}); got the value {value!r}."
                    )
                current._merge_checked(value, source, origins, full_key + ".", root)
                continue
            self[key] = _coerce(full_key, current, _decode(value), source)
            # A value merged without an origin (another config's, set by code) records none.
            origins_of(root).record_all({full_key: self[key]}, origins)

    def _raise_unknown(self, full_key: str, source: str) -> None:
        hint = did_you_mean(full_key, flat_leaves(self))
        raise ConfigError(
            f"unknown config key {full_key} in {source}.{hint} Every key must exist in "
            f"trainkit/config/defaults.py (or be added to the config before merging)."
        )


def did_you_mean(full_key: str, known: Iterable[str]) -> str:
    """Return `` Did you mean X?`` (with other close keys) for an unknown dotted key, or ``""``.

    Close spellings first; failing those, keys with the same last part (``SOLVER.LR`` and
    ``TRAIN.LR``). Shared by yacs merges and LazyConfig overrides.
    """
    known = list(known)
    close = difflib.get_close_matches(full_key, known, n=3, cutoff=0.6)
    if not close:
        leaf = full_key.rsplit(".", 1)[-1]
        close = [k for k in known if k.rsplit(".", 1)[-1] == leaf][:3]
    hint = f" Did you mean {close[0]}?" if close else ""
    if len(close) > 1:
        hint += f" (other close keys: {', '.join(close[1:])})"
    return hint


def _decode(value: Any) -> Any:
    """A string that reads as a Python literal (``"0.1"``, ``"(1, 2)"``) as that value, as yacs."""
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):  # a plain string such as a path or a name
        return value


def _coerce(full_key: str, current: Any, value: Any, source: str) -> Any:
    """Return ``value`` converted to ``current``'s type, or raise a ConfigError."""
    if current is None or value is None:
        return value
    expected, given = type(current), type(value)
    if given is expected:
        return value
    if expected in (list, tuple) and given in (list, tuple):
        inner = type(current[0]) if current else None
        if inner in (list, tuple):  # e.g. a tuple of tuples, which YAML gives as lists
            return expected(inner(v) if isinstance(v, (list, tuple)) else v for v in value)
        return expected(value)
    if expected is float and given is int:
        return float(value)
    raise ConfigError(
        f"config key {full_key} (in {source}) expects {expected.__name__} "
        f"(default {current!r}), got {given.__name__} {value!r}."
    )
