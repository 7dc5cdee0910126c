"""A model sharded over the processes with FSDP2 (``fully_shard``), block by block.

A model names its blocks with a class attribute ``block_modules``: submodule names, each
element of a ``ModuleList`` being a block (beside ``compiled_methods``, see
:mod:`trainkit.modeling.compile`). Without it every direct child with parameters is a block.
Each block is sharded, then the root, so a block's parameters are gathered just before it
runs and freed after it (``reshard_after_forward``).

``shard_size`` picks the layout: 0 or the world size shards over every process; a divisor
``N > 1`` of the processes per machine shards inside groups of ``N`` and replicates across
them (hybrid sharding, on a 2-D device mesh ``("replicate", "shard")``).

Activation checkpointing (:func:`checkpoint_activations`) recomputes each block's
activations in the backward pass instead of keeping them, with or without sharding.
Evaluation gathers the parameters once (:func:`gathered_parameters`), so ranks may then run
different numbers of batches.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainkit.config import CfgNode, ConfigError
from trainkit.modeling.build import model_device
from trainkit.modeling.compile import set_compile_cache_dir
from trainkit.utils import comm
from trainkit.utils.env import TORCH_VERSION
from trainkit.utils.errors import UsageError

__all__ = [
    "check_optimizer_of_sharded_model",
    "checkpoint_activations",
    "gathered_parameters",
    "hybrid_mesh_shape",
    "model_blocks",
    "shard_from_config",
    "shard_model",
    "state_bytes_per_process",
]

# Set on a model while gathered_parameters holds its parameters (so a nested one does nothing).
_GATHERED = "_trainkit_gathered"
# fully_shard left torch.distributed._composable.fsdp for torch.distributed.fsdp in 2.6.
MIN_TORCH_VERSION = (2, 6)


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """Return the blocks ``model`` is sharded and checkpointed by (see the module docstring).

    Raises:
        ValueError: If ``block_modules`` names something that is not a submodule.
    """
    names = getattr(type(model), "block_modules", None)
    if names is None:
        return [child for child in model.children() if next(child.parameters(), None) is not None]
    blocks: list[nn.Module] = []
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise ValueError(
                f"{type(model).__name__}.block_modules names {name!r}, which is not a "
                "submodule of the model; list the attribute names of its blocks."
            ) from None
        blocks.extend(module if isinstance(module, nn.ModuleList) else [module])
    return blocks


def checkpoint_activations(blocks: list[nn.Module]) -> None:
    """Make each block recompute its activations in the backward pass (in place).

    The block's ``forward`` is wrapped on the instance, so parameter names and the state
    dict stay those of the model; torch's non-reentrant checkpoint keeps the RNG state, so
    dropout draws the same masks when recomputed. A block already recomputed is left as it is.
    """
    for block in blocks:
        forward = block.forward
        if isinstance(forward, functools.partial) and forward.func is _recomputed:
            continue  # already recomputed: a model built and prepared twice
        block.forward = functools.partial(_recomputed, forward)  # type: ignore[method-assign]


def _recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def hybrid_mesh_shape(
    shard_size: int, world_size: int, local_size: int, *, key: str = "shard_size"
) -> tuple[int, ...]:
    """Return the device mesh's shape: ``(world,)``, or ``(replicas, shard_size)`` for hybrid.

    Its last dimension is the number of processes each parameter is split over.

    Args:
        shard_size: processes per shard group (see the module docstring).
        world_size: the job's processes.
        local_size: the processes per machine.
        key: what the error calls ``shard_size`` (a config key, as ``MODEL.FSDP.SHARD_SIZE``).

    Raises:
        ConfigError: If ``shard_size`` is 1, negative, or neither 0, the world size nor a
            divisor of the processes per machine (the message names ``key`` and the allowed
            values).
    """
    if shard_size in (0, world_size):
        return (world_size,)
    if shard_size > 1 and local_size % shard_size == 0 and world_size % shard_size == 0:
        return (world_size // shard_size, shard_size)
    raise ConfigError(
        f"{key} must be 0 or {world_size} (shard over all {world_size} processes) or a "
        f"divisor > 1 of the {local_size} processes per machine (hybrid sharding), got "
        f"{shard_size}; use one of those."
    )


def shard_model(
    model: nn.Module,
    *,
    shard_size: int = 0,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    activation_checkpointing: bool = False,
    device: torch.device | str | None = None,
    compile_options: dict[str, Any] | None = None,
    shard_size_name: str = "shard_size",
) -> nn.Module:
    """Shard ``model``'s parameters, gradients and optimizer state over the processes.

    Build the optimizer after this: ``fully_shard`` replaces the parameters by sharded ones.
    Every process starts from rank 0's initial parameters and buffers (broadcast first, as
    DDP does when it wraps a model).
    With one process and no process group, a one-process Gloo group is started (FSDP needs
    one); the shards go to the device ``model``'s parameters are on.

    Args:
        model: the model, on the CPU or its device.
        shard_size: processes per shard group (see the module docstring).
        reshard_after_forward: free a block's gathered parameters after its forward pass
            (gathered again in backward; ``False`` keeps them, more memory, less traffic);
            the root's are kept.
        param_dtype: the dtype parameters are gathered in for compute (mixed precision);
            gradients are reduced in float32.
        activation_checkpointing: recompute each block's activations in the backward pass.
        device: where the shards go (default: where ``model``'s parameters are); a model
            built on the CPU is moved shard by shard, never whole.
        compile_options: ``torch.compile`` arguments to compile each block with, before it
            is sharded (``None``: not compiled).
        shard_size_name: what an error calls ``shard_size`` (a config key).

    Returns:
        ``model`` itself, sharded in place.

    Raises:
        ConfigError: If torch is older than 2.6, or see :func:`hybrid_mesh_shape`.
    """
    if TORCH_VERSION < MIN_TORCH_VERSION:
        found = ".".join(map(str, TORCH_VERSION))
        raise ConfigError(
            f"Sharding a model needs torch >= 2.6 (fully_shard), found {found}; upgrade torch "
            "or train it unsharded."
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    device = torch.device(device)
    if not (dist.is_available() and dist.is_initialized()):
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world = comm.get_world_size()
    local = comm.get_local_size() if world > 1 else 1
    shape = hybrid_mesh_shape(shard_size, world, local, key=shard_size_name)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None
    )
    if world > 1:
        _broadcast_from_rank_0(model, device)
    blocks = model_blocks(model)
    if activation_checkpointing:
        checkpoint_activations(blocks)
    for block in blocks:
        if compile_options is not None:
            # Before fully_shard: the compiled graph is the block's own computation, and
            # FSDP's gathers stay hooks around it (torch's recommended order).
            block.compile(**compile_options)
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # Not the root: backward starts with it, so freeing its parameters after the forward
    # pass would only gather them again at once.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    return model


def _broadcast_from_rank_0(model: nn.Module, device: torch.device) -> None:
    """Give every process rank 0's initial parameters and buffers, as DDP does when it wraps.

    Processes seeded differently (``default_setup`` adds the rank) initialise differently;
    ``fully_shard`` keeps each process's own slice, which would make the model a patchwork.
    """
    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            # NCCL broadcasts device memory only: a model built on the CPU goes through it.
            on_device = tensor.detach().to(device)
            dist.broadcast(on_device, src=0)
            if on_device is not tensor:
                tensor.copy_(on_device)


def shard_from_config(
    model: nn.Module, cfg: CfgNode, *, param_dtype: torch.dtype | None = None
) -> nn.Module:
    """Shard ``model`` as ``MODEL.FSDP``, ``ACTIVATION_CHECKPOINTING`` and ``COMPILE`` say.

    The shards go to ``MODEL.DEVICE``; with ``MODEL.COMPILE.ENABLED`` each block is compiled
    before it is sharded (the model's ``compiled_methods`` then run eagerly).

    Args:
        model: the model :func:`~trainkit.modeling.build_model` built (on the CPU).
        cfg: the run's config.
        param_dtype: the mixed-precision compute dtype (``SOLVER.AMP``), or ``None``.

    Returns:
        ``model``, sharded in place.

    Raises:
        ConfigError: Naming ``MODEL.FSDP.SHARD_SIZE`` and the world size, or as
            :func:`shard_model`.
    """
    compile_options = None
    if cfg.MODEL.COMPILE.ENABLED:
        opts = cfg.MODEL.COMPILE
        set_compile_cache_dir(opts.CACHE_DIR or os.path.join(cfg.OUTPUT_DIR, "compile_cache"))
        compile_options = {"backend": opts.BACKEND, **({"mode": opts.MODE} if opts.MODE else {})}
    return shard_model(
        model,
        shard_size=cfg.MODEL.FSDP.SHARD_SIZE,
        reshard_after_forward=cfg.MODEL.FSDP.RESHARD_AFTER_FORWARD,
        param_dtype=param_dtype,
        activation_checkpointing=cfg.MODEL.ACTIVATION_CHECKPOINTING,
        device=model_device(cfg),
        compile_options=compile_options,
        shard_size_name="MODEL.FSDP.SHARD_SIZE",
    )


def check_optimizer_of_sharded_model(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """Refuse an optimizer that holds parameters the sharded ``model`` no longer has.

    ``fully_shard`` replaces a model's parameters: an optimizer built before it would step
    the old ones and train nothing, silently.

    Raises:
        UsageError: Saying how many parameters are not the model's and what to do.
    """
    own = {id(p) for p in model.parameters()}
    stale = sum(id(p) not in own for group in optimizer.param_groups for p in group["params"])
    if stale:
        raise UsageError(
            f"The optimizer holds {stale} parameters that are not the sharded model's: it was "
            "built before shard_model replaced them; build it after sharding (DefaultTrainer "
            "calls build_optimizer with the sharded model)."
        )


@contextlib.contextmanager
def gathered_parameters(
    model: nn.Module, *, reshard_after_forward: bool = True
) -> Iterator[nn.Module]:
    """Hold a sharded model's full parameters on every process for the body (evaluation).

    Gathered once on entry, with no collective in the forward passes inside, so each rank
    may run its own number of batches; freed on exit. Use it for forward passes only (no
    backward). A model that is not sharded, or is gathered already (nested), is yielded as
    it is.

    Args:
        model: the model :func:`shard_model` sharded.
        reshard_after_forward: what the blocks were sharded with, restored on exit.

    Collective:
        On entry and on exit (every rank enters together).
    """
    if "torch.distributed.fsdp" not in sys.modules:  # nothing can be sharded: no import
        yield model
        return
    from torch.distributed.fsdp import FSDPModule

    if getattr(model, _GATHERED, False):  # nested (an evaluation inside one): gathered already
        yield model
        return
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        yield model
        return
    setattr(model, _GATHERED, True)
    for module in sharded:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        setattr(model, _GATHERED, False)
        for module in sharded:
            module.reshard()
            if module is not model:  # the root keeps its parameters after forward (shard_model)
                module.set_reshard_after_forward(reshard_after_forward, recurse=False)


def state_bytes_per_process(
    model: nn.Module,
    build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    *,
    shard_group_size: int | None,
) -> dict[str, int]:
    """Return the bytes one process holds of ``model``'s parameters, gradients and optimizer state.

    Nothing is allocated: a copy of ``model`` on the meta device gets each parameter's shard
    shape (FSDP splits dimension 0 into ``shard_group_size`` equal parts, the last padded, so
    every process holds the largest), the optimizer is built on it and stepped once, and its
    state is counted as the optimizer holds it then (scalars such as Adam's ``step`` too).

    Args:
        model: the model (any device; it is not changed).
        build_optimizer: builds the run's optimizer for a model (e.g. the configured one).
        shard_group_size: processes a parameter is split over; ``None`` for DDP (whole).

    Returns:
        ``{"parameters": B, "gradients": B, "optimizer": B}``, integers in bytes.
    """
    shaped = copy.deepcopy(model).to("meta")
    for param in shaped.parameters():
        shape = tuple(param.shape)
        if shard_group_size is not None and shape:
            shape = (math.ceil(shape[0] / shard_group_size), *shape[1:])
        param.data = torch.empty(shape, dtype=param.dtype, device="meta")
        param.grad = torch.empty_like(param) if param.requires_grad else None
    optimizer = build_optimizer(shaped)
    optimizer.step()
    trained = [p for p in shaped.parameters() if p.requires_grad]

    def nbytes(tensors: Iterable[Any]) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))

    return {
        "parameters": nbytes(shaped.parameters()),
        "gradients": nbytes(p.grad for p in trained),
        "optimizer": nbytes(v for state in optimizer.state.values() for v in state.values()),
    }
