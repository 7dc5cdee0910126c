"""Command-line overrides of a LazyConfig (``KEY=VALUE``), refusing keys that do not exist.

The leaves an override sets are recorded as set on the ``command line``
(:mod:`trainkit.config.provenance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from trainkit.config.cfg_node import ConfigError, did_you_mean
from trainkit.config.provenance import ORIGIN_COMMAND_LINE, flat_leaves, origins_of

__all__ = ["apply_overrides", "flat_config_items", "parse_override_value"]


class _OverrideKeyError(ConfigError, KeyError):
    """An override of a key that does not exist (detectron2, through omegaconf: KeyError)."""

    def __str__(self) -> str:
        # KeyError quotes its message; a user reads it as a sentence.
        return str(self.args[0]) if self.args else ""


def apply_overrides(cfg: Any, overrides: Sequence[str]) -> Any:
    """Set values from ``KEY=VALUE`` strings in place (see ``LazyConfig.apply_overrides``)."""
    from omegaconf import OmegaConf

    keys: list[str] = []
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
        keys.append(key)
    if keys:
        # The leaves an override set: the key, below it, or the list holding it.
        leaves = {
            leaf: value
            for leaf, value in flat_config_items(cfg).items()
            if any(k == leaf or k.startswith(leaf + ".") or leaf.startswith(k + ".") for k in keys)
        }
        origins_of(cfg).record_all(leaves, ORIGIN_COMMAND_LINE)
    return cfg


def parse_override_value(text: str) -> Any:
    """Return the value of one ``KEY=VALUE`` override: ``VALUE`` read as YAML, else as a string."""
    text = text.strip()
    if not text:
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def flat_config_items(cfg: Any) -> dict[str, Any]:
    """Return ``{"a.b.c": value}`` for every leaf of a LazyConfig (lists are leaves).

    Interpolations are not resolved; ``_target_`` callables stay objects.
    """
    from omegaconf import OmegaConf

    return flat_leaves(
        OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    )


def _check_override_key(cfg: Any, key: str, is_new: bool) -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    node = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        if isinstance(node, DictConfig):
            if part in node.keys():
                # A "???" (missing) value is a key without a value yet: set, not walked into.
                node = None if OmegaConf.is_missing(node, part) else node[part]
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
