"""Executing a LazyConfig's ``.py`` file: a fresh namespace whose relative imports load by path.

detectron2's config files import one another relatively (``from ..common.train import train``)
without being a package; here each such import executes the named file anew, so a file
loaded twice gives two independent configs.
"""

from __future__ import annotations

import builtins
import os
import types
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainkit.config.cfg_node import ConfigError
from trainkit.config.provenance import relative_import_file
from trainkit.utils.file_io import PathManager

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["LOADER_PACKAGE", "as_config", "dict_config", "exec_config_file"]


class _ConfigImportError(ConfigError, ImportError):
    """A relative import in a config file that cannot be done (detectron2 raises ImportError)."""


# The __package__ of every config file this module executes: its relative imports are then
# resolved by file path (see _config_import), and the functions it defines carry this
# prefix in __module__, which is how save() knows that they cannot be imported back.
LOADER_PACKAGE = "trainkit._cfg_loader"


def exec_config_file(filename: str) -> dict[str, Any]:
    """Execute a ``.py`` config in a fresh namespace whose relative imports load by path."""
    with PathManager.open(filename, "r") as f:
        source = f.read()
    try:
        code = compile(source, filename, "exec")  # the file name appears in tracebacks
    except SyntaxError as e:
        raise ConfigError(
            f"{filename}:{e.lineno}: Python syntax error in the config ({e.msg})"
        ) from None
    module_name = f"{LOADER_PACKAGE}{uuid.uuid4().hex[:8]}"
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
    if level == 0 or not package.startswith(LOADER_PACKAGE):
        return builtins.__import__(name, globals, locals, fromlist, level)
    importer = str(globals["__file__"])  # type: ignore[index]
    if not name:
        raise _ConfigImportError(
            f"{importer}: 'from {'.' * level} import ...' (a relative import of a directory) is "
            "not supported in a config file; import names from a file: from .FILE import NAME."
        )
    path = relative_import_file(importer, name, level)
    if not PathManager.isfile(path):
        raise _ConfigImportError(
            f"{importer}: 'from {'.' * level}{name} import ...' needs the file {path}, which "
            "does not exist."
        )
    module = types.ModuleType(f"{package}.{name}")
    module.__dict__.update(exec_config_file(path))
    for attribute in fromlist:
        if attribute in module.__dict__:
            setattr(module, attribute, as_config(module.__dict__[attribute]))
    return module


def as_config(value: Any) -> Any:
    """Return ``value`` as a ``DictConfig`` (editable by attribute) if a dict, else as it is."""
    return dict_config(value) if isinstance(value, dict) else value


def dict_config(value: dict[str, Any]) -> DictConfig:
    """Return ``value`` as a ``DictConfig`` that may hold any object (callables, dataclasses)."""
    from omegaconf import DictConfig

    return DictConfig(value, flags={"allow_objects": True})
