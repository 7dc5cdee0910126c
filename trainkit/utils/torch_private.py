"""Every name of torch that torch does not promise to keep, read in this one module.

Each function says which underscored (or otherwise unpublished) part of torch it reads and
the torch versions it was checked on: 2.13 is the CPU build of the tests' machine
(``tests/utils/test_torch_private.py``), 2.11 the CUDA build of the GPU machine
(``tests/gpu/test_torch_private.py``; "2.11" is named only where that check has run). The
tests fail loudly when a name is gone, rather than a count silently staying 0, and check
that no other module of the package reads such a name. Heavy parts of torch (Dynamo) are
imported inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "CUDA_SYNC_WARNING",
    "compiled_original",
    "dump_cuda_memory_snapshot",
    "dynamo_cache_entries",
    "dynamo_graph_breaks",
    "dynamo_recompile_limit",
    "grad_scaler_found_inf",
    "queue_backward_callback",
    "record_cuda_memory_history",
    "steps_with_scaler_state",
]

CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"
"""What ``torch.cuda.set_sync_debug_mode("warn")`` warns at each host-device wait (the text of
``c10/cuda/CUDAFunctions``; checked on 2.11 by ``tests/gpu/test_step.py``)."""


def grad_scaler_found_inf(
    scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer
) -> list[torch.Tensor] | None:
    """Return the scaler's inf/NaN flag per device for ``optimizer``'s last step, no wait.

    Reads ``GradScaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]``
    (checked on 2.11 and 2.13): ``GradScaler`` says whether it skipped a step only through
    ``get_scale()``, a wait for the device. ``None`` before a step was unscaled.

    Raises:
        RuntimeError: If this torch keeps the record elsewhere (a renamed internal).
    """
    try:
        states = scaler._per_optimizer_states
    except AttributeError:
        raise RuntimeError(
            f"torch {torch.__version__}'s GradScaler has no _per_optimizer_states; "
            "trainkit.utils.torch_private.grad_scaler_found_inf needs updating"
        ) from None
    per_device = states[id(optimizer)].get("found_inf_per_device")
    return None if per_device is None else list(per_device.values())


def steps_with_scaler_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` takes a ``GradScaler``'s state on the device (fused ones).

    Reads the optimizer's ``_step_supports_amp_scaling`` flag (checked on 2.11 and 2.13),
    which ``GradScaler.step`` reads itself; without it, the scaler reads whether to skip on
    the host, a wait per step.
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def queue_backward_callback(loss: torch.Tensor, callback: Callable[[], None]) -> None:
    """Call ``callback()`` in ``loss.backward()`` once every gradient is computed.

    Queues it on autograd's engine (``torch.autograd.Variable._execution_engine``, checked
    on 2.13; the GPU check that reaches it, ``tests/gpu/test_stragglers.py``, has not run on
    2.11 yet) from the loss's gradient hook, the first thing backward runs: final
    callbacks run in the order queued, so it runs before one queued later, such as DDP's
    wait for its gradient all-reduce. Nothing happens for a loss without a gradient.
    """
    if not loss.requires_grad:
        return
    engine = torch.autograd.Variable._execution_engine

    def queue(grad: torch.Tensor) -> None:
        engine.queue_callback(callback)

    loss.register_hook(queue)


def dynamo_recompile_limit() -> int:
    """Return how many graphs Dynamo keeps per compiled function before running it eager.

    ``torch._dynamo.config.recompile_limit`` (torch >= 2.6; ``cache_size_limit`` before;
    checked on 2.11 and 2.13).
    """
    import torch._dynamo

    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", None) or config.cache_size_limit)


def dynamo_cache_entries(function: Callable[..., Any]) -> int:
    """Return how many graphs Dynamo holds for ``function`` (a method's underlying function).

    ``torch._dynamo.eval_frame._debug_get_cache_entry_list`` (checked on 2.11 and 2.13).
    """
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(function.__code__))


def dynamo_graph_breaks() -> int:
    """Return the graph breaks Dynamo counted in this process.

    ``torch._dynamo.utils.counters["graph_break"]`` (checked on 2.11 and 2.13).
    """
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def compiled_original(model: nn.Module) -> nn.Module | None:
    """Return the module ``torch.compile`` wrapped in ``model``, or ``None`` if it is not one.

    ``OptimizedModule._orig_mod`` (checked on 2.13), read by name so
    ``torch._dynamo`` (slow to import) is not loaded to check the type.
    """
    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, nn.Module) else None


def record_cuda_memory_history(enabled: bool, max_entries: int = 100_000) -> None:
    """Start (or stop) recording the CUDA allocator's history for a snapshot.

    ``torch.cuda.memory._record_memory_history`` (documented at
    https://pytorch.org/memory_viz; present in 2.13, not yet run on a CUDA build here).
    """
    if enabled:
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def dump_cuda_memory_snapshot(path: str) -> None:
    """Write the CUDA allocator's recorded history to ``path`` (``_dump_snapshot``).

    Present in 2.13; not yet run on a CUDA build here (``tests/gpu/test_torch_private.py``).
    """
    torch.cuda.memory._dump_snapshot(path)
