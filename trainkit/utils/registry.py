"""``Registry`` (name -> object, for config strings) and ``locate`` (dotted path -> object).

fvcore's ``Registry`` with a lookup error that lists the known names and near misses, plus
detectron2's ``locate`` and its inverse, which map ``"module.submodule.Class"`` strings
found in configs to objects without needing hydra.
"""

from __future__ import annotations

import difflib
import importlib
import pydoc
from typing import Any

from fvcore.common.registry import Registry as _FvcoreRegistry

__all__ = ["Registry", "locate"]


class Registry(_FvcoreRegistry):
    """A name -> object map filled by ``@REGISTRY.register()``.

    Unlike fvcore's, an unknown name raises ``KeyError`` whose message lists every
    registered name and the closest matches, so a typo in a config is fixed in one step.
    """

    def get(self, name: str) -> Any:
        """Return the object registered as ``name``.

        Raises:
            KeyError: If nothing is registered under ``name`` (the message lists what is).
        """
        if name in self._obj_map:
            return self._obj_map[name]
        known = sorted(self._obj_map)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(
            f"No object named {name!r} in the {self._name} registry.{hint} Registered: "
            f"{', '.join(known) or '(none)'}. Register yours with @{self._name}.register()."
        )

    def __str__(self) -> str:  # KeyError's repr would quote the message
        return f"Registry({self._name}: {', '.join(sorted(self._obj_map))})"


def locate(name: str) -> Any:
    """Return the object named by a dotted path such as ``"torch.optim.SGD"``.

    The path is ``{module}.{qualname}``: a class nested in a class (``"pkg.mod.A.B"``) and
    builtins (``"len"``) work too. This is the inverse of :func:`_convert_target_to_string`.

    Args:
        name: the dotted path.

    Returns:
        The object.

    Raises:
        ImportError: If no importable module and attribute chain matches ``name``.
    """
    found = pydoc.locate(name)
    if found is not None:
        return found
    # pydoc.locate gives up on some paths that do resolve (torch.optim.sgd.SGD among them):
    # import the longest importable module prefix, then follow attributes.
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            continue
        return obj
    raise ImportError(
        f"cannot locate {name!r}: no importable module and attribute path matches it; "
        "check the spelling and that its package is installed."
    )


def _convert_target_to_string(target: Any) -> str:
    """Return the shortest dotted path that :func:`locate` resolves back to ``target``.

    ``pkg.sub._impl.Thing`` becomes ``pkg.sub.Thing`` when ``pkg.sub`` re-exports it, so
    config strings survive moving an implementation between private modules.

    Args:
        target: a class, function or other object with ``__module__`` and ``__qualname__``.

    Returns:
        The dotted path.
    """
    module, qualname = target.__module__, target.__qualname__
    module_parts = module.split(".")
    for length in range(1, len(module_parts)):
        candidate = f"{'.'.join(module_parts[:length])}.{qualname}"
        try:
            if locate(candidate) is target:
                return candidate
        except ImportError:
            pass
    return f"{module}.{qualname}"
