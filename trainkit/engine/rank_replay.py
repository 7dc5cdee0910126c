"""Every rank's part of one optimizer step, run in one process and combined as DDP does.

A job of ``W`` processes runs each step as ``W`` ranks that each accumulate the weighted
gradients of their ``k`` micro-batches, then DistributedDataParallel averages them: each
rank's gradient is multiplied by ``1/W`` as it is copied into its bucket, and the buckets are
summed over ranks. :func:`run_rank` runs one rank's micro-batches through the step trainer's
own seams (``forward_context``, ``compute_losses``, ``backward``, the accumulation weights of
``SimpleTrainer``), and :func:`ddp_average` combines the ranks' gradients the same way, in
rank order (bit-exact for two ranks, whose sum is the same in either order; with more, Gloo's
and NCCL's summation order may differ in the last bit).

Each rank keeps what is its own between steps (:class:`RankLocalState`): its RNG states
(dropout, noise) and its buffers (BatchNorm running statistics, which DDP with
``broadcast_buffers=False`` does not share); rank 0's are the ones a checkpoint saves.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainkit.engine.accumulation import micro_batch_weights
from trainkit.engine.step_metrics import sum_losses
from trainkit.utils.env import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from trainkit.engine.simple_trainer import SimpleTrainer

__all__ = [
    "RankLocalState",
    "RankResult",
    "copy_buffers",
    "ddp_average",
    "gradient_norm",
    "load_buffers",
    "losses_of_batches",
    "non_finite_terms",
    "run_rank",
]


@dataclass
class RankLocalState:
    """What one rank keeps to itself between steps: RNG states and module buffers.

    Attributes:
        rng: the rank's RNG states (:func:`~trainkit.utils.env.get_rng_state`), or ``None``
            when unknown (the process's own generators are used then).
        buffers: the rank's buffers by name (``None``: the model's current ones).
    """

    rng: dict[str, Any] | None = None
    buffers: dict[str, torch.Tensor] | None = None

    @contextlib.contextmanager
    def active(self, model: nn.Module) -> Iterator[None]:
        """Run the body as this rank: its RNG states and buffers in place, kept afterwards."""
        if self.rng is not None:
            set_rng_state(self.rng)
        if self.buffers is not None:
            load_buffers(model, self.buffers)
        try:
            yield
        finally:
            self.rng = get_rng_state()
            self.buffers = copy_buffers(model)


def copy_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return a copy of every buffer of ``model``, by name."""
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def load_buffers(model: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    """Copy ``buffers`` (from :func:`copy_buffers`) into ``model``'s buffers, in place."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


@dataclass
class RankResult:
    """One rank's part of a step.

    Attributes:
        losses: per micro-batch, its loss terms as floats (empty for one that raised).
        gradients: the rank's accumulated gradient of each parameter (``None``: none).
        error: ``(micro-batch, exception)`` if a micro-batch raised, else ``None``.
    """

    losses: list[dict[str, float]] = field(default_factory=list)
    gradients: list[torch.Tensor | None] = field(default_factory=list)
    error: tuple[int, BaseException] | None = None


def run_rank(
    step: SimpleTrainer,
    batches: Sequence[Any],
    params: Sequence[nn.Parameter],
    *,
    catch: bool = False,
) -> RankResult:
    """Run one rank's micro-batches of a step as the step trainer does; take its gradients.

    The gradients start from nothing; each micro-batch's summed loss is weighted by its
    share of the rank's samples (``SimpleTrainer``'s weights) and back-propagated through
    ``step.backward`` (an ``AMPTrainer`` scales it). The gradients are taken off ``params``.

    Args:
        step: the step trainer whose seams are used; its model in training mode.
        batches: the rank's micro-batches of the step, in order.
        params: the parameters whose gradients are taken (in a fixed order).
        catch: keep an exception of a micro-batch in the result instead of raising it.

    Raises:
        Exception: What a micro-batch raised, unless ``catch``.
    """
    result = RankResult()
    weights = micro_batch_weights(batches)
    step.optimizer.zero_grad(set_to_none=True)
    for j, batch in enumerate(batches):
        try:
            with step.forward_context():
                loss_dict = step.compute_losses(batch)
            total = sum_losses(loss_dict)
            step.backward(total if weights is None else total * weights[j])
        except Exception as e:
            if not catch:
                raise
            result.error = (j, e)
            break
        result.losses.append({name: float(v.detach().float()) for name, v in loss_dict.items()})
    result.gradients = [p.grad for p in params]
    for p in params:
        p.grad = None
    return result


def ddp_average(per_rank: Sequence[Sequence[torch.Tensor | None]]) -> list[torch.Tensor | None]:
    """Average the ranks' gradients of each parameter as DistributedDataParallel does.

    DDP multiplies each rank's gradient by ``1/W`` while copying it into its bucket, then
    all-reduces the buckets by summation; this sums ``g * (1/W)`` in rank order. A single
    rank's gradients are returned unchanged (no DDP wrapper with one process).

    Args:
        per_rank: for each rank, its gradient of each parameter (``None`` where it has none;
            a parameter without a gradient on every rank stays ``None``).

    Returns:
        The averaged gradient of each parameter.

    Raises:
        ValueError: If the ranks list different numbers of parameters.
    """
    if len({len(grads) for grads in per_rank}) > 1:
        raise ValueError("every rank must give one gradient per parameter")
    if len(per_rank) == 1:
        return list(per_rank[0])
    scale = 1.0 / len(per_rank)
    averaged: list[torch.Tensor | None] = []
    for grads in zip(*per_rank):
        present = [g for g in grads if g is not None]
        if not present:
            averaged.append(None)
            continue
        # A rank without a gradient for it contributes zeros (as DDP's bucket would).
        parts = [(g if g is not None else torch.zeros_like(present[0])) * scale for g in grads]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        averaged.append(total)
    return averaged


def gradient_norm(gradients: Sequence[torch.Tensor | None]) -> float:
    """Return the L2 norm of all gradients together (as ``clip_grad_norm_`` computes it)."""
    norms = [g.detach().float().norm(2) for g in gradients if g is not None]
    if not norms:
        return 0.0
    return float(torch.stack(norms).norm(2))


def losses_of_batches(
    step: SimpleTrainer, batches: Sequence[list[Any]]
) -> list[dict[str, float] | BaseException]:
    """Return the loss terms of each batch (a record alone, a batch without one), no gradients.

    The model's buffers (BatchNorm statistics) and the RNG states are restored afterwards,
    so the step is unchanged. A batch whose forward pass raises gets the exception.
    """
    model = step.model
    buffers = copy_buffers(model)
    found: list[dict[str, float] | BaseException] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for batch in batches:
            try:
                with step.forward_context():
                    loss_dict = step.compute_losses(batch)
                found.append({k: float(v.detach().float()) for k, v in loss_dict.items()})
            except Exception as e:
                found.append(e)
            finally:
                load_buffers(model, buffers)
    return found


def non_finite_terms(losses: dict[str, float]) -> list[str]:
    """Return the names of the terms of ``losses`` that are infinite or NaN."""
    return [name for name, value in losses.items() if not math.isfinite(value)]
