"""Run a function again when it runs out of CUDA memory (detectron2's ``retry_if_cuda_oom``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["retry_if_cuda_oom"]

logger = logging.getLogger(__name__)

_Result = TypeVar("_Result")


def retry_if_cuda_oom(func: Callable[..., _Result]) -> Callable[..., _Result]:
    """Wrap ``func`` so that a CUDA out-of-memory error gets two more tries.

    The first retry runs after ``torch.cuda.empty_cache()`` has released the cached blocks.
    If that runs out of memory too, the CUDA tensors among the arguments (positional and
    keyword, not inside containers) are copied to the CPU and ``func`` runs once more there,
    with a warning: its result is then on the CPU, and the caller moves it back if needed.
    With no CUDA tensor to move, the second error is raised. Other errors pass through at
    once. Meant for inference-time work whose memory depends on the input (pasting many
    masks, a large pairwise matrix); ``func`` must not have side effects a retry would repeat.

    Args:
        func: a function taking tensors (or anything else) as arguments.

    Returns:
        The wrapped function.
    """

    @functools.wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> _Result:
        try:
            return func(*args, **kwargs)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
        try:
            return func(*args, **kwargs)
        except torch.cuda.OutOfMemoryError:
            cpu_args = [_to_cpu(arg) for arg in args]
            cpu_kwargs = {key: _to_cpu(value) for key, value in kwargs.items()}
            moved = any(a is not b for a, b in zip(cpu_args, args)) or any(
                cpu_kwargs[key] is not value for key, value in kwargs.items()
            )
            if not moved:
                raise
        logger.warning("%r ran out of CUDA memory twice; running it on the CPU.", func)
        return func(*cpu_args, **cpu_kwargs)

    return wrapped


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cuda":
        return value.to("cpu")
    return value
