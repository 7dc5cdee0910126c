"""Helpers for model code that ``torch.fx`` traces symbolically (detectron2's ``utils.tracing``).

During symbolic tracing the values flowing through ``forward`` are ``torch.fx.Proxy``
objects, so a Python check on them (``assert x.shape[0] > 0``) cannot be evaluated; these
helpers let such checks run in eager mode and step aside while tracing.
"""

from __future__ import annotations

import torch

__all__ = ["assert_fx_safe", "is_fx_tracing"]

# ``torch.fx.Tracer.trace`` replaces ``nn.Module.__call__`` for the duration of a trace and
# restores it after, so comparing against the original tells whether a trace is running
# without reading torch.fx's private state. tests/utils/test_tracing.py checks it still holds.
_MODULE_CALL = torch.nn.Module.__call__


@torch.jit.ignore
def is_fx_tracing() -> bool:
    """Return whether ``torch.fx`` is symbolically tracing a module right now."""
    return torch.nn.Module.__call__ is not _MODULE_CALL


@torch.jit.ignore
def assert_fx_safe(condition: bool, message: str) -> None:
    """Raise ``AssertionError(message)`` if ``condition`` is false; skip the check while tracing.

    Unlike detectron2's, it takes the condition's value only (not a string to evaluate) and
    returns nothing.

    Args:
        condition: the value to check (a Python bool or a one-element tensor).
        message: the error's text.
    """
    if not is_fx_tracing() and not bool(condition):
        raise AssertionError(message)
