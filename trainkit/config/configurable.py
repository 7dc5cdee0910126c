"""``@configurable``: one callable that accepts either a config or explicit arguments.

detectron2's pattern, so its models and mappers port unchanged::

    class Head(nn.Module):
        @configurable
        def __init__(self, in_features: int, num_classes: int = 10): ...

        @classmethod
        def from_config(cls, cfg, in_features):
            return {"in_features": in_features, "num_classes": cfg.MODEL.NUM_CLASSES}

    Head(cfg, in_features=64)                 # from the config
    Head(in_features=64, num_classes=3)       # explicit
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

from yacs.config import CfgNode as _YacsCfgNode

__all__ = ["configurable"]

_F = TypeVar("_F", bound=Callable[..., Any])


@overload
def configurable(init_func: _F, *, from_config: None = None) -> _F: ...


@overload
def configurable(
    init_func: None = None, *, from_config: Callable[..., dict[str, Any]] | None = None
) -> Callable[[_F], _F]: ...


def configurable(
    init_func: Callable[..., Any] | None = None,
    *,
    from_config: Callable[..., dict[str, Any]] | None = None,
) -> Any:
    """Let ``init_func`` (an ``__init__``) or a decorated function also take a config.

    ``@configurable`` on ``__init__`` needs a ``from_config(cls, cfg, ...)`` classmethod;
    ``@configurable(from_config=f)`` on a function takes ``f(cfg, ...)``, also reachable as
    ``decorated.from_config``. Either returns the arguments. Called with a config first (or
    as ``cfg=``), the config goes through ``from_config``: positional arguments after it go
    to ``from_config`` only, and keyword arguments it does not take pass on to the decorated
    callable, overriding what it returned. Called without a config, the arguments go
    straight through.

    Args:
        init_func: the ``__init__`` being decorated (the bare ``@configurable`` form).
        from_config: for a function: maps ``(cfg, ...)`` to the function's arguments.

    Returns:
        The decorated ``__init__``, or a decorator for a function.

    Raises:
        TypeError: When decorating: if ``@configurable`` is not on an ``__init__`` or
            ``from_config`` is not a function. When calling: if ``from_config`` is not a
            classmethod or its first parameter is not named ``cfg``.
        AttributeError: When calling a class whose decorated ``__init__`` has no
            ``from_config`` to go with it.
    """
    if init_func is not None:
        if from_config is not None or not inspect.isfunction(init_func):
            raise TypeError(
                "@configurable takes either an __init__ to decorate or from_config=..., "
                "not both; see trainkit.config.configurable's docstring."
            )
        if init_func.__name__ != "__init__":
            raise TypeError(
                f"bare @configurable decorates an __init__, not {init_func.__name__!r}; for a "
                "function use @configurable(from_config=...)."
            )
        return _configurable_init(init_func)
    if from_config is None:
        return configurable  # "@configurable()" means the same as "@configurable"
    if not inspect.isfunction(from_config):
        raise TypeError(
            f"configurable(from_config=...) needs a function, got {type(from_config).__name__}"
        )
    return functools.partial(_configurable_function, from_config=from_config)


def _configurable_init(init_func: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init_func)
    def wrapped_init(self: Any, *args: Any, **kwargs: Any) -> None:
        from_config_func = _class_from_config(type(self))
        if _called_with_cfg(args, kwargs):
            init_func(self, **_arguments_from_config(from_config_func, args, kwargs))
        else:
            init_func(self, *args, **kwargs)

    return wrapped_init


def _class_from_config(cls: type) -> Callable[..., dict[str, Any]]:
    try:
        from_config_func = cls.from_config  # type: ignore[attr-defined]
    except AttributeError as e:
        raise AttributeError(
            f"{cls.__qualname__} has a @configurable __init__ but no 'from_config' classmethod; "
            "add `@classmethod def from_config(cls, cfg, ...)` returning the __init__ arguments."
        ) from e
    if not inspect.ismethod(from_config_func):
        raise TypeError(
            f"{cls.__qualname__}.from_config must be a classmethod (decorate it with @classmethod)."
        )
    return from_config_func


def _configurable_function(
    orig_func: Callable[..., Any], *, from_config: Callable[..., dict[str, Any]]
) -> Callable[..., Any]:
    @functools.wraps(orig_func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _called_with_cfg(args, kwargs):
            return orig_func(**_arguments_from_config(from_config, args, kwargs))
        return orig_func(*args, **kwargs)

    wrapped.from_config = from_config  # type: ignore[attr-defined]
    return wrapped


def _is_config(obj: Any) -> bool:
    if isinstance(obj, _YacsCfgNode):
        return True
    # OmegaConf is optional; a DictConfig can only exist if it was imported already.
    omegaconf = sys.modules.get("omegaconf")
    return omegaconf is not None and isinstance(obj, omegaconf.DictConfig)


def _called_with_cfg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # Only the first positional argument or a keyword named "cfg" can be the config: a config
    # passed anywhere else is an ordinary argument of the explicit form.
    return bool(args) and _is_config(args[0]) or _is_config(kwargs.get("cfg"))


def _arguments_from_config(
    from_config_func: Callable[..., dict[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Call ``from_config_func`` with what it accepts and add the remaining keyword arguments.

    Raises:
        TypeError: If ``from_config_func``'s first parameter is not ``cfg``, it cannot take
            the positional arguments given, or it returns something other than a mapping.
    """
    name = getattr(from_config_func, "__qualname__", repr(from_config_func))
    signature = inspect.signature(from_config_func)
    parameters = signature.parameters
    if next(iter(parameters), None) != "cfg":
        raise TypeError(f"{name} must take 'cfg' as its first argument")
    takes_anything = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters.values())
    passed_on: dict[str, Any] = {}
    if not takes_anything:
        passed_on = {key: kwargs.pop(key) for key in list(kwargs) if key not in parameters}
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            # Positional arguments after the config can only go to from_config: forwarding
            # them to __init__ by position would be ambiguous.
            raise TypeError(
                f"{name} cannot take these arguments ({e}). In the config form, positional "
                "arguments after the config go to from_config; pass the others by keyword."
            ) from None
    explicit = from_config_func(*args, **kwargs)
    if not isinstance(explicit, Mapping):
        raise TypeError(
            f"{name} must return a dict of arguments for the decorated callable, "
            f"got {type(explicit).__name__}"
        )
    # Keyword arguments from_config does not know override what it derived from the config.
    return {**explicit, **passed_on}
