"""Wrapping a model for data-parallel training."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainkit.utils import comm

__all__ = ["create_ddp_model"]


def create_ddp_model(
    model: nn.Module, *, fp16_compression: bool = False, **kwargs: Any
) -> nn.Module:
    """Wrap ``model`` (already on its device) in DistributedDataParallel with several processes.

    Args:
        fp16_compression: compress gradients to fp16 for the all-reduce (NCCL only).
        kwargs: passed to ``DistributedDataParallel`` (e.g. ``broadcast_buffers=False``).

    Returns:
        ``model`` itself with one process, else the DDP wrapper.
    """
    if comm.get_world_size() == 1:
        return model
    if "device_ids" not in kwargs and next(model.parameters()).device.type == "cuda":
        kwargs["device_ids"] = [comm.get_local_rank()]
    ddp = DistributedDataParallel(model, **kwargs)
    if fp16_compression:
        from torch.distributed.algorithms.ddp_comm_hooks import default as comm_hooks

        ddp.register_comm_hook(state=None, hook=comm_hooks.fp16_compress_hook)
    return ddp
