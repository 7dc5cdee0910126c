"""``CfgNode`` with strict, explained merges, ``_BASE_`` inheritance and safe YAML only."""

from __future__ import annotations

import copy
import difflib
import os
from typing import Any

import yaml
from fvcore.common.config import CfgNode as _FvcoreCfgNode

from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import PathManager

__all__ = ["CfgNode", "ConfigError", "get_cfg"]

BASE_KEY = "_BASE_"


class ConfigError(UsageError, ValueError):
    """A config file, override or value that cannot be used; the message says what to change."""


class CfgNode(_FvcoreCfgNode):
    """A yacs/fvcore config node whose merges are strict and explain themselves.

    Differences from fvcore's node:

    * an unknown key, in a file or in ``merge_from_list``, raises :class:`ConfigError` naming
      the key, the file and the closest existing keys;
    * a value of the wrong type names the key, the expected and the given type; an int is
      accepted where a float is expected, and a list where a tuple is (and vice versa);
    * ``_BASE_`` paths are relative to the including file, followed recursively, and a cycle
      is an error that shows the chain of files;
    * YAML is always parsed with the safe loader, so a config file cannot run code.
    """

    # ---- loading files ---------------------------------------------------------------
    @classmethod
    def load_yaml_with_base(
        cls, filename: str, allow_unsafe: bool = False, _chain: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Load a YAML config file as a dict, with its ``_BASE_`` files merged underneath.

        Args:
            filename: the config file.
            allow_unsafe: ignored; trainkit never runs code from a config (kept for
                detectron2 compatibility).

        Returns:
            The merged dict.

        Raises:
            ConfigError: On a missing file, a YAML syntax error, a non-mapping document or a
                ``_BASE_`` cycle.
        """
        del allow_unsafe
        path = os.path.abspath(os.path.expanduser(filename)) if "://" not in filename else filename
        if not _chain and not PathManager.exists(path):
            # As the user typed it: that is what they will look for on their command line.
            raise ConfigError(f"config file not found: {filename}. Check the path.")
        if path in _chain:
            cycle = " -> ".join([*_chain[_chain.index(path) :], path])
            raise ConfigError(f"_BASE_ cycle in config files: {cycle}. Remove one of the links.")
        data = cls._read_yaml(path, included_from=_chain[-1] if _chain else None)
        if BASE_KEY not in data:
            return data
        bases = data.pop(BASE_KEY)
        bases = bases if isinstance(bases, (list, tuple)) else [bases]
        merged: dict[str, Any] = {}
        for base in bases:
            if not isinstance(base, str):
                raise ConfigError(
                    f"{path}: _BASE_ must be a file name or a list of them, got {base!r}"
                )
            base_path = os.path.expanduser(base)
            if not os.path.isabs(base_path) and "://" not in base_path:
                base_path = os.path.join(os.path.dirname(path), base_path)
            _merge_dicts(cls.load_yaml_with_base(base_path, _chain=(*_chain, path)), merged)
        _merge_dicts(data, merged)
        return merged

    @staticmethod
    def _read_yaml(path: str, included_from: str | None) -> dict[str, Any]:
        where = f" (the _BASE_ of {included_from})" if included_from else ""
        if not PathManager.exists(path):
            raise ConfigError(f"config file not found: {path}{where}. Check the path.")
        try:
            with PathManager.open(path, "r") as f:
                data = yaml.safe_load(f)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(
                f"YAML syntax error in {path}{line}: {e.problem or e}. Fix the file{where}."
            ) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse {path} as YAML: {e}") from None
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"config file {path}{where} is not UTF-8 text (byte {e.start}: "
                f"{e.object[e.start : e.start + 1]!r}); is it the right file?"
            ) from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path} must hold a mapping of config keys, got a {type(data).__name__}."
            )
        return data

    def merge_from_file(self, cfg_filename: str, allow_unsafe: bool = False) -> None:
        """Merge a YAML file (and its ``_BASE_`` chain) into this config.

        Raises:
            ConfigError: On any problem with the file or its keys and values.
        """
        loaded = self.load_yaml_with_base(cfg_filename, allow_unsafe=allow_unsafe)
        self._merge_checked(loaded, source=f"file {cfg_filename}")

    def merge_from_other_cfg(self, cfg_other: _FvcoreCfgNode) -> None:
        """Merge another config node into this one with the same checks as a file."""
        self._merge_checked(cfg_other, source="another config")

    def merge_from_list(self, cfg_list: list[str]) -> None:
        """Merge ``["KEY.PATH", value, ...]`` pairs (e.g. command-line overrides).

        Values given as strings are parsed as Python literals when they look like one
        (``"0.1"``, ``"(1, 2)"``, ``"True"``), as yacs does.

        Raises:
            ConfigError: On an odd-length list, an unknown key or a wrong value type.
        """
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
            node, parts = self, full_key.split(".")
            for depth, part in enumerate(parts):
                if not isinstance(node, _FvcoreCfgNode):
                    self._raise_unknown(full_key, "the command line")
                if part not in node:
                    if node.is_new_allowed():
                        break
                    self._raise_unknown(full_key, "the command line")
                if depth < len(parts) - 1:
                    node = node[part]
            self._merge_checked(_nest(parts, value), source="the command line")

    # ---- the checked merge -----------------------------------------------------------
    def _merge_checked(
        self, other: dict[str, Any], source: str, prefix: str = "", root: CfgNode | None = None
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
                if self.is_new_allowed():
                    self[key] = _to_node(type(self), self._decode_cfg_value(copy.deepcopy(value)))
                    continue
                root._raise_unknown(full_key, source)
            current = self[key]
            if isinstance(current, _FvcoreCfgNode):
                if not isinstance(value, dict):
                    raise ConfigError(
                        f"config key {full_key} (in {source}) is a group of keys "
                        f"({', '.join(sorted(current))}); got the value {value!r}."
                    )
                current._merge_checked(value, source, prefix=full_key + ".", root=root)
                continue
            self[key] = _coerce(full_key, current, self._decode_cfg_value(value), source)

    def _raise_unknown(self, full_key: str, source: str) -> None:
        known = _flatten_keys(self)
        close = difflib.get_close_matches(full_key, known, n=3, cutoff=0.6)
        if not close:
            leaf = full_key.rsplit(".", 1)[-1]
            close = [k for k in known if k.rsplit(".", 1)[-1] == leaf][:3]
        hint = f" Did you mean {close[0]}?" if close else ""
        if len(close) > 1:
            hint += f" (other close keys: {', '.join(close[1:])})"
        raise ConfigError(
            f"unknown config key {full_key} in {source}.{hint} Every key must exist in "
            f"trainkit/config/defaults.py (or be added to the config before merging)."
        )


def _merge_dicts(src: dict[str, Any], dst: dict[str, Any]) -> None:
    # Values from src win; nested mappings merge key by key.
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge_dicts(value, dst[key])
        else:
            dst[key] = copy.deepcopy(value)


def _nest(parts: list[str], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return out


def _to_node(node_type: type, value: Any) -> Any:
    return node_type(value) if isinstance(value, dict) else value


def _flatten_keys(node: _FvcoreCfgNode, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        if isinstance(value, _FvcoreCfgNode):
            keys.extend(_flatten_keys(value, prefix + key + "."))
        else:
            keys.append(prefix + key)
    return keys


def _coerce(full_key: str, current: Any, value: Any, source: str) -> Any:
    """Return ``value`` converted to ``current``'s type, or raise a ConfigError."""
    if current is None or value is None:
        return value
    expected, given = type(current), type(value)
    if given is expected:
        return value
    if expected in (list, tuple) and given in (list, tuple):
        return expected(value)
    if expected is float and given is int:
        return float(value)
    raise ConfigError(
        f"config key {full_key} (in {source}) expects {expected.__name__} "
        f"(default {current!r}), got {given.__name__} {value!r}."
    )


def get_cfg() -> CfgNode:
    """Return a fresh copy of trainkit's default config."""
    from trainkit.config.defaults import _C

    return _C.clone()
