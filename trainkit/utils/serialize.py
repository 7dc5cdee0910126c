"""Pickling for callables the standard pickle refuses: lambdas, closures, local functions."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["PicklableWrapper"]


class PicklableWrapper:
    """Wrap an object (usually a callable) so that it pickles even if it is a lambda.

    Loader workers started with "spawn" or "forkserver" receive the dataset, and its mapper,
    pickled; pickle stores functions by qualified name, which a lambda or a nested function
    lacks. The wrapper pickles the object by value with ``cloudpickle`` and unpickles to a
    wrapper again; calling it calls the object, other attributes are read through. It does
    not make unpicklable *state* picklable (open files, locks, CUDA streams).
    """

    def __init__(self, obj: Any) -> None:
        """Wrap ``obj`` (a wrapper is unwrapped first, so wrapping twice is harmless)."""
        while isinstance(obj, PicklableWrapper):
            obj = obj._obj
        self._obj = obj

    @property
    def wrapped(self) -> Any:
        """The wrapped object."""
        return self._obj

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # Imported here: only pickling needs it, and `import trainkit.data` stays cheap.
        import cloudpickle

        return _unwrap_payload, (cloudpickle.dumps(self._obj),)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._obj(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails. "_obj" itself missing means a half-built
        # wrapper (e.g. during unpickling by copy): fail instead of recursing.
        if name == "_obj":
            raise AttributeError(name)
        return getattr(self._obj, name)

    def __repr__(self) -> str:
        return f"PicklableWrapper({self._obj!r})"


def _unwrap_payload(payload: bytes) -> PicklableWrapper:
    # cloudpickle writes ordinary pickle data: pickle.loads reads it (importing cloudpickle
    # itself only if the payload refers to it).
    return PicklableWrapper(pickle.loads(payload))
