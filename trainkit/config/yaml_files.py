"""Reading YAML config files: the safe loader, refused ``!!python`` tags, ``_BASE_`` chains.

:func:`load_yaml_with_origins` is what ``CfgNode.load_yaml_with_base`` and
``CfgNode.merge_from_file`` read a file with: its values, ``_BASE_`` files merged underneath
(relative to the including file, recursively, a cycle refused), and each key's ``FILE:LINE``.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from typing import Any

import yaml

from trainkit.config.errors import ConfigError
from trainkit.config.provenance import display_path, yaml_key_lines
from trainkit.utils.file_io import PathManager

__all__ = ["BASE_KEY", "load_yaml_with_origins"]

logger = logging.getLogger(__name__)

BASE_KEY = "_BASE_"
# The tag in PyYAML's "could not determine a constructor for the tag '...'".
_TAG_IN_PROBLEM = re.compile(r"for the tag '([^']*)'")
# Tags that build Python objects (tuples, and any class: running code); the safe loader
# refuses them.
_PYTHON_TAG_PREFIX = "tag:yaml.org,2002:python/"


def load_yaml_with_origins(
    filename: str, allow_unsafe: bool = False, _chain: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, str]]:
    """Load a YAML config file with its ``_BASE_`` files merged underneath.

    Args:
        filename: the config file (a local path, ``~`` expanded, or a URL).
        allow_unsafe: read a file (or ``_BASE_`` file) that the safe loader refuses for a
            ``!!python/...`` tag with PyYAML's unsafe loader, with a logged warning: such a
            file can run any code. Only for files you trust.

    Returns:
        ``(values, {full key: "FILE:LINE"})``; the including file's values and lines win
        over its bases'.

    Raises:
        ConfigError: On a missing file, a YAML syntax error, an unsafe tag without
            ``allow_unsafe``, a non-mapping document or a ``_BASE_`` cycle.
    """
    path = os.path.abspath(os.path.expanduser(filename)) if "://" not in filename else filename
    where = f" (the _BASE_ of {_chain[-1]})" if _chain else ""
    if not PathManager.exists(path):
        # The top file as the user typed it: what they will look for on their command line.
        raise ConfigError(
            f"config file not found: {path + where if _chain else filename}. Check the path."
        )
    if path in _chain:
        cycle = " -> ".join([*_chain[_chain.index(path) :], path])
        raise ConfigError(f"_BASE_ cycle in config files: {cycle}. Remove one of the links.")
    data, origins = _read_yaml(path, where, allow_unsafe)
    if BASE_KEY not in data:
        return data, origins
    bases = data.pop(BASE_KEY)
    bases = bases if isinstance(bases, (list, tuple)) else [bases]
    merged: dict[str, Any] = {}
    merged_origins: dict[str, str] = {}
    for base in bases:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: _BASE_ must be a file name or a list of them, got {base!r}")
        base_path = os.path.expanduser(base)
        if not os.path.isabs(base_path) and "://" not in base_path:
            base_path = os.path.join(os.path.dirname(path), base_path)
        base_data, base_origins = load_yaml_with_origins(base_path, allow_unsafe, (*_chain, path))
        _merge_dicts(base_data, merged)
        merged_origins.update(base_origins)
    _merge_dicts(data, merged)
    merged_origins.update(origins)  # the including file wins, as for the values
    return merged, merged_origins


def _read_yaml(
    path: str, where: str, allow_unsafe: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """One file's values and key lines; ``where`` says whose ``_BASE_`` it is, for messages."""
    try:
        try:
            root, data = _compose_and_construct(path, yaml.SafeLoader)
        except yaml.constructor.ConstructorError as e:
            tag = _python_tag(e)
            if tag is None:
                raise
            mark = e.problem_mark
            at = f"{display_path(path)}:{mark.line + 1}" if mark else display_path(path)
            if not allow_unsafe:
                raise ConfigError(
                    f"{at}{where}: the YAML tag {tag} is refused by design: trainkit reads "
                    "config files with the safe loader, so a config cannot run code. "
                    "Write the value as plain YAML, or, for a file you trust, load it with "
                    "cfg.merge_from_file(path, allow_unsafe=True)."
                ) from None
            logger.warning(
                "Loading %s with PyYAML's unsafe loader (allow_unsafe=True; tag %s at %s): "
                "a config file loaded this way can run any code.",
                display_path(path),
                tag,
                at,
            )
            root, data = _compose_and_construct(path, yaml.UnsafeLoader)
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
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of config keys, got a {type(data).__name__}."
        )
    return data, yaml_key_lines(root, display_path(path))


def _compose_and_construct(path: str, loader_class: type) -> tuple[yaml.Node | None, Any]:
    # Composed first, so the nodes give each key's line.
    with PathManager.open(path, "r") as f:
        loader = loader_class(f)
        try:
            root = loader.get_single_node()
            return root, loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()


def _python_tag(error: yaml.constructor.ConstructorError) -> str | None:
    """Return the ``!!python/...`` tag the safe loader refused, or None for another error."""
    found = _TAG_IN_PROBLEM.search(error.problem or "")
    if found is None or not found.group(1).startswith(_PYTHON_TAG_PREFIX):
        return None
    return "!!" + found.group(1)[len("tag:yaml.org,2002:") :]


def _merge_dicts(src: dict[str, Any], dst: dict[str, Any]) -> None:
    # Values from src win; nested mappings merge key by key.
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge_dicts(value, dst[key])
        else:
            dst[key] = copy.deepcopy(value)
