"""How a step's micro-batches make its gradient: their weights and the gradient combiner.

``SimpleTrainer.accumulate`` runs a step's micro-batches and asks a :class:`GradientCombiner`
how: each micro-batch's weight (its share of the step's samples), the context its forward
and backward run in, and what follows the last backward. The failing-step replay emulates
several ranks in one process with :class:`EmulatedRanks`; a model sharded by
:func:`trainkit.modeling.shard_model` combines them with :class:`ShardedGradients`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from trainkit.checkpoint import is_sharded, unwrap_model
from trainkit.utils import comm
from trainkit.utils.env import get_rng_state, set_rng_state

__all__ = [
    "EmulatedRanks",
    "create_ddp_model",
    "GradientCombiner",
    "ShardedGradients",
    "StepResult",
    "add_weighted",
    "combiner_for",
    "copy_buffers",
    "gradient_norm",
    "load_buffers",
    "micro_batch_weights",
]


@dataclass
class StepResult:
    """What :meth:`SimpleTrainer.accumulate` did with one step's micro-batches.

    Attributes:
        batches: the micro-batches given (``run_step`` drops them once the step went through).
        losses: each micro-batch's loss terms (detached), up to the one that raised.
        step_losses: the step's loss terms: the micro-batches' weighted sum (detached).
        error: what a micro-batch raised (``None``: all ran); its index is ``len(losses)``.
    """

    batches: list[Any] = field(default_factory=list)
    losses: list[dict[str, torch.Tensor]] = field(default_factory=list)
    step_losses: dict[str, torch.Tensor] = field(default_factory=dict)
    error: Exception | None = None


def micro_batch_weights(batches: Sequence[Any]) -> list[float] | None:
    """Each micro-batch's share of the step's samples (``None`` for a single batch).

    A loss is a mean over its batch, so weights ``n_j / N`` make the accumulated gradient the
    mean over all ``N`` samples even when sizes differ (a finite loader's tail). Lists
    (trainkit's batches) and tensors are sized by ``len``; other batches count equally.
    """
    if len(batches) == 1:
        return None
    is_sized = all(isinstance(b, (list, torch.Tensor)) for b in batches)
    sizes = [len(b) for b in batches] if is_sized else []
    total = sum(sizes)
    return [size / total for size in sizes] if total else [1.0 / len(batches)] * len(batches)


def add_weighted(
    into: dict[str, torch.Tensor], loss_dict: Mapping[str, torch.Tensor], weight: float
) -> None:
    """Add ``loss_dict``'s losses times ``weight`` (detached) to the step's sums ``into``.

    Raises:
        RuntimeError: If the micro-batches of one step return different loss names.
    """
    if into and tuple(into) != tuple(loss_dict):
        raise RuntimeError(
            f"Micro-batches of one step returned different losses: {list(into)} and "
            f"{list(loss_dict)}; the model must return the same loss names for every batch."
        )
    for name, loss in loss_dict.items():
        weighted = loss.detach() * weight
        into[name] = into[name] + weighted if name in into else weighted


def gradient_norm(gradients: Sequence[torch.Tensor | None]) -> float:
    """Return the L2 norm of all gradients together (as ``clip_grad_norm_`` computes it)."""
    norms = [g.detach().float().norm(2) for g in gradients if g is not None]
    return float(torch.stack(norms).norm(2)) if norms else 0.0


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


class GradientCombiner:
    """Sum a step's weighted micro-batch gradients here; DDP all-reduces only the last one.

    Subclasses (sharded models, emulated ranks) override its methods to combine them otherwise;
    :func:`combiner_for` picks a model's.
    """

    def weights(self, batches: Sequence[Any]) -> list[float] | None:
        """Return each micro-batch's loss weight (``None``: one micro-batch, weight 1)."""
        return micro_batch_weights(batches)

    def micro_batch(
        self, model: nn.Module, index: int, count: int
    ) -> contextlib.AbstractContextManager[Any]:
        """Return the context micro-batch ``index`` of ``count`` runs its forward and backward in.

        DDP all-reduces on every backward unless told not to (``no_sync``): only the last
        micro-batch of a step needs the reduced gradients.
        """
        if index < count - 1 and isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def waits_in_backward(self, model: nn.Module) -> bool:
        """Whether the last backward waits for the other ranks (DDP's gradient all-reduce)."""
        return isinstance(model, DistributedDataParallel)

    def finish(self) -> None:
        """Run after the last micro-batch's backward (nothing here: the gradients are in place)."""


class ShardedGradients(GradientCombiner):
    """A sharded model's micro-batches: each one's gradients reduce-scattered into the shards.

    No process holds a full gradient. With hybrid sharding the all-reduce across replicas
    waits for the last micro-batch, as DDP's does.
    """

    @override
    def micro_batch(
        self, model: nn.Module, index: int, count: int
    ) -> contextlib.AbstractContextManager[Any]:
        model.set_requires_all_reduce(index == count - 1)  # type: ignore[operator]
        return contextlib.nullcontext()

    @staticmethod
    def announce_gathers(model: nn.Module, phase: Callable[[str], None]) -> None:
        """Announce the time each block waits for its parameters' all-gather as ``collective``.

        FSDP gathers a block's parameters right before its forward pass (and, resharded after
        it, before its backward pass): a fast rank waits there for a slow one. Marked around
        FSDP's own hooks (``prepend``), so that wait is not counted as the rank's own work by
        the slow-rank rule. Only with gradients enabled: an evaluation keeps its own phase.
        """
        from torch.distributed.fsdp import FSDPModule

        def mark(name: str) -> Callable[..., None]:
            def announce(*_: Any) -> None:
                if torch.is_grad_enabled():
                    phase(name)

            return announce

        def on_outputs(announce: Callable[..., None]) -> Callable[..., None]:
            def register(_module: nn.Module, _args: Any, output: Any) -> None:
                if torch.is_grad_enabled():
                    for tensor in _tensors(output):
                        if tensor.requires_grad:
                            tensor.register_hook(announce)

            return register

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.register_forward_pre_hook(mark("collective"), prepend=True)
                module.register_forward_pre_hook(mark("forward/backward"))
                # Backward: before and after the gather FSDP's hook on the outputs' gradients does.
                module.register_forward_hook(on_outputs(mark("collective")), prepend=True)
                module.register_forward_hook(on_outputs(mark("forward/backward")))


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []


def combiner_for(model: nn.Module) -> GradientCombiner:
    """Return the gradient combiner of a step training ``model`` (sharded or not)."""
    return ShardedGradients() if is_sharded(model) else GradientCombiner()


@dataclass
class _Rank:
    """What one emulated rank keeps to itself: RNG states, buffers, its gradients."""

    rng: dict[str, Any] | None  # None: the process's own generators
    buffers: dict[str, torch.Tensor] | None = None  # None: the model's current
    grads: list[torch.Tensor | None] = field(default_factory=list)


def copy_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return a copy of every buffer of ``model``, by name."""
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def load_buffers(model: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    """Copy ``buffers`` (from :func:`copy_buffers`) into ``model``'s buffers, in place."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


class EmulatedRanks(GradientCombiner):
    """The step's micro-batches as ``W`` ranks' in one process, combined as DDP does.

    Micro-batch ``q`` belongs to rank ``q % W``; it runs with that rank's RNG states and buffers,
    and its gradient adds to that rank's own. After the last, the ranks' gradients are averaged as
    DDP averages them (each times ``1/W``, summed in rank order: bit-exact for two ranks, whose sum
    is the same in either order; with more, Gloo's and NCCL's summation order may differ in the last
    bit) and the model keeps rank 0's buffers, the ones a checkpoint saves.

    Args:
        model: the model (wrapped or not).
        rngs: each rank's RNG states (from the checkpoint), or ``None`` per unknown rank.
    """

    def __init__(self, model: nn.Module, rngs: Sequence[dict[str, Any] | None]) -> None:
        self.model = unwrap_model(model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.ranks = [_Rank(rng) for rng in rngs]

    @override
    def weights(self, batches: Sequence[Any]) -> list[float] | None:
        w = len(self.ranks)
        per_rank = [micro_batch_weights(batches[rank::w]) for rank in range(w)]
        return [
            1.0 if per_rank[q % w] is None else per_rank[q % w][q // w] for q in range(len(batches))
        ]  # type: ignore[index]

    @override
    def micro_batch(
        self, model: nn.Module, index: int, count: int
    ) -> contextlib.AbstractContextManager[Any]:
        if index == 0:
            for rank in self.ranks:
                rank.grads = [None] * len(self.params)
        return self.active(self.ranks[index % len(self.ranks)], grads=True)

    @contextlib.contextmanager
    def active(self, rank: _Rank, *, grads: bool = False) -> Iterator[None]:
        """Run the body as ``rank``: its RNG, buffers (and gradients) in place, kept after."""
        if rank.rng is not None:
            set_rng_state(rank.rng)
        if rank.buffers is not None:
            load_buffers(self.model, rank.buffers)
        if grads:
            for param, grad in zip(self.params, rank.grads):
                param.grad = grad
        try:
            yield
        finally:
            rank.rng, rank.buffers = get_rng_state(), copy_buffers(self.model)
            if grads:
                rank.grads = [param.grad for param in self.params]

    @override
    def finish(self) -> None:
        for param, grad in zip(self.params, self.averaged()):
            param.grad = grad
        if self.ranks[0].buffers is not None:
            load_buffers(self.model, self.ranks[0].buffers)

    def averaged(self) -> list[torch.Tensor | None]:
        """Each parameter's gradient averaged over the ranks, as DDP averages it."""
        if len(self.ranks) == 1:
            return list(self.ranks[0].grads)
        scale, out = 1.0 / len(self.ranks), []
        for grads in zip(*(rank.grads for rank in self.ranks)):
            present = next((g for g in grads if g is not None), None)
            if present is None:
                out.append(None)
                continue
            # A rank without a gradient for it contributes zeros (as DDP's bucket would).
            terms = [(torch.zeros_like(present) if g is None else g) * scale for g in grads]
            out.append(sum(terms[1:], terms[0]))  # in rank order
        return out
