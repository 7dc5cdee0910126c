"""``DatasetCatalog`` (name -> function returning records) and ``MetadataCatalog``.

Both are process-wide registries, the allowed globals of this package. Tests restore them
with ``clear()`` (or remove what they registered).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from typing import Any

from trainkit.utils.errors import UnknownNameError

logger = logging.getLogger(__name__)

__all__ = ["DatasetCatalog", "Metadata", "MetadataCatalog"]


def _unknown_name_message(kind: str, name: str, known: list[str], how_to_add: str) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listed = ", ".join(repr(k) for k in sorted(known)) or "(none)"
    return f"{kind} {name!r} is not registered.{hint} Registered: {listed}. {how_to_add}"


class _DatasetCatalog:
    """Map a dataset name to a function that returns its records (a list of dicts).

    The function is called on every :meth:`get`, so registration is cheap and the records
    are only loaded when used. Names are unique: registering one twice is an error.
    """

    def __init__(self) -> None:
        self._funcs: dict[str, Callable[[], Any]] = {}

    def register(self, name: str, func: Callable[[], Any]) -> None:
        """Register ``func`` (no arguments, returns the records) under ``name``.

        Raises:
            TypeError: If ``func`` is not callable.
            ValueError: If ``name`` is already registered.
        """
        if not callable(func):
            raise TypeError(
                f"DatasetCatalog.register({name!r}, ...) needs a callable, got {func!r}"
            )
        if name in self._funcs:
            raise ValueError(
                f"Dataset {name!r} is already registered; pick another name or call "
                f"DatasetCatalog.remove({name!r}) first."
            )
        self._funcs[name] = func

    def get(self, name: str) -> Any:
        """Call the function registered as ``name`` and return its records.

        Raises:
            UnknownNameError: A ``KeyError``: if ``name`` is unknown; the message lists the
                registered names.
        """
        try:
            func = self._funcs[name]
        except KeyError:
            raise UnknownNameError(
                _unknown_name_message(
                    "Dataset",
                    name,
                    list(self._funcs),
                    "Register it with DatasetCatalog.register(name, func) or fix "
                    "DATASETS.TRAIN/TEST.",
                )
            ) from None
        return func()

    def list(self) -> list[str]:
        """Return the registered names, in registration order."""
        return list(self._funcs)

    def keys(self) -> set[str]:
        """Return the registered names as a set (detectron2's ``DatasetCatalog.keys()``)."""
        return set(self._funcs)

    def remove(self, name: str) -> None:
        """Forget ``name``.

        Raises:
            KeyError: If ``name`` is not registered.
        """
        if name not in self._funcs:
            raise KeyError(_unknown_name_message("Dataset", name, list(self._funcs), ""))
        del self._funcs[name]

    def clear(self) -> None:
        """Forget every registration (tests use this to reset the global catalog)."""
        self._funcs.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._funcs

    def __repr__(self) -> str:
        return f"DatasetCatalog(registered: {', '.join(self._funcs) or '(none)'})"


class Metadata:
    """An attribute bag of a dataset's metadata (class names, evaluator type, ...).

    An attribute is set once: setting it again to a *different* value raises, because two
    pieces of code disagreeing about, e.g., class names is a bug. Setting the same value is
    allowed.
    """

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __getattr__(self, key: str) -> Any:
        # Only called when normal lookup fails.
        if key.startswith("__") or key == "name":
            raise AttributeError(key)
        raise AttributeError(
            f"Metadata of dataset {self.__dict__.get('name')!r} has no attribute {key!r}; "
            "available: "
            f"{', '.join(sorted(self.as_dict())) or '(none)'}."
        )

    def __setattr__(self, key: str, value: Any) -> None:
        current = self.__dict__.get(key, _MISSING)
        if current is not _MISSING and current != value:
            raise ValueError(
                f"Metadata {key!r} of dataset {self.name!r} is already {current!r}; refusing to "
                f"change it to {value!r}. Use another dataset name, or MetadataCatalog.remove()."
            )
        object.__setattr__(self, key, value)

    def set(self, **kwargs: Any) -> Metadata:
        """Set several attributes; returns ``self`` for chaining."""
        for key, value in kwargs.items():
            setattr(self, key, value)
        return self

    def get(self, key: str, default: Any = None) -> Any:
        """Return attribute ``key``, or ``default`` if it is not set."""
        return self.__dict__.get(key, default)

    def as_dict(self) -> dict[str, Any]:
        """Return a copy of every attribute."""
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"Metadata({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


_MISSING = object()


class _MetadataCatalog:
    """Map a dataset name to its :class:`Metadata`, created empty on first :meth:`get`."""

    def __init__(self) -> None:
        self._metadata: dict[str, Metadata] = {}

    def get(self, name: str) -> Metadata:
        """Return the metadata of ``name``, creating an empty one if needed."""
        if name not in self._metadata:
            self._metadata[name] = Metadata(name)
        return self._metadata[name]

    def list(self) -> list[str]:
        """Return the names that have metadata."""
        return list(self._metadata)

    def remove(self, name: str) -> None:
        """Forget the metadata of ``name``.

        Raises:
            KeyError: If ``name`` has no metadata.
        """
        if name not in self._metadata:
            raise KeyError(_unknown_name_message("Metadata of", name, list(self._metadata), ""))
        del self._metadata[name]

    def clear(self) -> None:
        """Forget all metadata (tests use this to reset the global catalog)."""
        self._metadata.clear()


DatasetCatalog = _DatasetCatalog()
MetadataCatalog = _MetadataCatalog()
