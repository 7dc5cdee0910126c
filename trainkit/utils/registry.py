"""``Registry`` (name -> object, for config strings) and ``locate`` (dotted path -> object).

``locate`` and its inverse are detectron2's, without needing hydra.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import pydoc
from collections.abc import Iterator
from typing import Any

from fvcore.common.registry import Registry as _FvcoreRegistry

from trainkit.utils.errors import UnknownNameError

__all__ = ["Registry", "locate"]


class Registry(_FvcoreRegistry):
    """A name -> object map filled by ``@REGISTRY.register()``.

    An fvcore ``Registry`` (``isinstance`` holds; ``register``, ``get``, ``in`` and iteration
    over ``(name, object)`` pairs behave as fvcore documents) except that an unknown name
    raises :class:`~trainkit.utils.errors.UnknownNameError` (a ``KeyError``) listing every
    registered name and the closest matches, so a config typo is fixed in one step;
    registering a name twice raises ``ValueError`` (fvcore: ``AssertionError``); and
    :meth:`remove` undoes a registration (for tests). The entries live in this class's own
    dict: fvcore has no public way to remove one, and its private attributes may change.
    """

    def __init__(self, name: str) -> None:
        """Create an empty registry called ``name`` (used in messages)."""
        super().__init__(name)
        self._registry_name = name
        self._entries: dict[str, Any] = {}

    @property
    def name(self) -> str:
        """The registry's name, e.g. ``"META_ARCH"``."""
        return self._registry_name

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._entries)

    def register(self, obj: Any = None) -> Any:
        """Register ``obj`` under ``obj.__name__``; without ``obj``, return a decorator.

        Raises:
            ValueError: If another object is already registered under that name.
        """
        if obj is None:
            return self._add
        self._add(obj)
        return None

    def _add(self, obj: Any) -> Any:
        name = obj.__name__
        if name in self._entries:
            # A bug in the code that registers (two classes with one name), not a user error.
            old = self._entries[name]
            raise ValueError(
                f"{name!r} is already registered in the {self.name} registry (as "
                f"{getattr(old, '__module__', '?')}.{getattr(old, '__qualname__', repr(old))}); "
                f"rename one of them, or remove({name!r}) the old one first."
            )
        self._entries[name] = obj
        return obj

    def get(self, name: str) -> Any:
        """Return the object registered as ``name``.

        Raises:
            UnknownNameError: A ``KeyError`` naming ``name`` and listing what is registered.
        """
        if name in self._entries:
            return self._entries[name]
        raise UnknownNameError(self.unknown_name_message(name))

    def unknown_name_message(self, name: str, key: str | None = None) -> str:
        """Return the one-line message for a name that is not registered.

        Args:
            name: the name looked up.
            key: the config key that gave it (e.g. ``"MODEL.META_ARCHITECTURE"``), if any.

        Returns:
            What is wrong (the key and the name), the closest registered names, all of
            them, and what to do.
        """
        known = self.names()
        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        where = f"{key} {name!r}" if key else repr(name)
        fix = f"Fix {key}, or register" if key else "Register"
        return (
            f"{where} is not registered in the {self.name} registry.{hint} Registered: "
            f"{', '.join(known) or '(none)'}. {fix} your class with .register() on this "
            "registry (in a module imported before the lookup)."
        )

    def remove(self, name: str) -> Any:
        """Forget ``name`` and return what was registered under it (tests use this to clean up).

        Raises:
            UnknownNameError: If ``name`` is not registered.
        """
        obj = self.get(name)
        del self._entries[name]
        return obj

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self._entries.items()))

    def __repr__(self) -> str:
        return f"Registry({self.name}: {', '.join(self.names()) or '(empty)'})"

    __str__ = __repr__


def locate(name: str) -> Any:
    """Return the object named by a dotted path such as ``"torch.optim.SGD"``.

    The path is ``{module}.{qualname}``: a class nested in a class (``"pkg.mod.A.B"``) and
    builtins (``"len"``) work too. This is the inverse of :func:`_convert_target_to_string`.

    Args:
        name: the dotted path.

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
    config strings survive moving an implementation between private modules. ``target``
    is anything with ``__module__`` and ``__qualname__``.
    """
    module_parts = target.__module__.split(".")
    for length in range(1, len(module_parts)):
        candidate = f"{'.'.join(module_parts[:length])}.{target.__qualname__}"
        with contextlib.suppress(ImportError):
            if locate(candidate) is target:
                return candidate
    return f"{target.__module__}.{target.__qualname__}"


def _target_name(target: Any) -> str:
    """``target`` as a string for messages: itself if a str, its import path, else its repr."""
    if isinstance(target, str):
        return target
    try:
        return _convert_target_to_string(target)
    except AttributeError:
        return repr(target)
