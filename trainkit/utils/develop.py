"""Stand-ins for names whose optional dependency is missing (detectron2's ``utils.develop``).

A module that offers a feature only when an optional package imports binds the name to
a stand-in otherwise, so that importing the module still works::

    try:
        from shapely.geometry import Polygon
    except ImportError:
        Polygon = create_dummy_class("Polygon", "shapely")

Using the stand-in (calling it, or reading a public attribute of a class) raises an
``ImportError`` naming the dependency; importing it, subclassing it and ``isinstance`` checks
work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["create_dummy_class", "create_dummy_func"]


def _message(name: str, dependency: str | Sequence[str], message: str) -> str:
    names = dependency if isinstance(dependency, str) else ", ".join(dependency)
    text = f"{name} needs {names}, which could not be imported; install it to use {name}."
    return f"{text} {message}" if message else text


class _Missing(type):
    """Metaclass of the stand-in classes: subclassing works, using one raises."""

    _missing_message: str

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImportError(cls._missing_message)

    def __getattr__(cls, key: str) -> NoReturn:
        # Only for attributes the class lacks; dunder and private lookups (pickle, inspect,
        # typing) keep seeing an ordinary AttributeError.
        if key.startswith("_"):
            raise AttributeError(key)
        raise ImportError(cls._missing_message)


def create_dummy_class(klass: str, dependency: str | Sequence[str], message: str = "") -> type:
    """Return a stand-in for class ``klass`` whose ``dependency`` could not be imported.

    Args:
        klass: the class's name.
        dependency: the package (or packages) it needs.
        message: appended to the error, e.g. how to install the dependency.

    Returns:
        A class whose instantiation and public attribute reads raise ``ImportError``.
    """
    namespace = {"__qualname__": klass, "_missing_message": _message(klass, dependency, message)}
    return _Missing(klass, (), namespace)


def create_dummy_func(func: str, dependency: str | Sequence[str], message: str = "") -> Any:
    """Return a stand-in for function ``func`` whose ``dependency`` could not be imported.

    Args:
        func: the function's name.
        dependency, message: as for :func:`create_dummy_class`.

    Returns:
        A function that raises ``ImportError`` when called.
    """
    text = _message(func, dependency, message)

    def missing(*args: Any, **kwargs: Any) -> NoReturn:
        raise ImportError(text)

    missing.__name__ = missing.__qualname__ = func
    missing.__doc__ = f"Unavailable: {text}"
    return missing
