"""How a step's micro-batches make its gradient: their weights and the gradient combiner.

``SimpleTrainer.accumulate`` runs a step's micro-batches and asks a :class:`GradientCombiner`
how: each micro-batch's weight (its share of the step's samples), the context its forward
and backward run in, and what follows the last backward. The default one sums the weighted
gradients on this process and, under DistributedDataParallel, lets DDP all-reduce only the
last micro-batch (``no_sync`` before). The failing-step replay emulates several ranks in one
process with another combiner (:class:`~trainkit.engine.replay.EmulatedRanks`); sharded
models plug in here too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["GradientCombiner", "StepResult", "add_weighted", "micro_batch_weights"]


@dataclass
class StepResult:
    """What :meth:`SimpleTrainer.accumulate` did with one step's micro-batches.

    Attributes:
        losses: each micro-batch's loss terms (detached), up to the one that raised.
        step_losses: the step's loss terms: the micro-batches' weighted sum (detached with
            several micro-batches).
        error: what a micro-batch raised (``None``: all ran); its index is ``len(losses)``.
    """

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


class GradientCombiner:
    """Sum a step's weighted micro-batch gradients here; DDP all-reduces only the last one.

    Subclasses change how the gradients of the micro-batches combine (emulated ranks,
    sharded models) by overriding the three methods below.
    """

    def weights(self, batches: Sequence[Any]) -> list[float] | None:
        """Return each micro-batch's loss weight (``None``: one micro-batch, weight 1)."""
        return micro_batch_weights(batches)

    def micro_batch(
        self, model: nn.Module, index: int, count: int
    ) -> contextlib.AbstractContextManager[Any]:
        """Return the context micro-batch ``index`` of ``count`` runs its forward and backward in.

        DDP all-reduces on every backward unless told not to: only the last micro-batch of a
        step needs the reduced gradients.
        """
        if index < count - 1 and isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def waits_in_backward(self, model: nn.Module) -> bool:
        """Whether the last backward waits for the other ranks (DDP's gradient all-reduce)."""
        return isinstance(model, DistributedDataParallel)

    def finish(self) -> None:
        """Run after the last micro-batch's backward (nothing here: the gradients are in place)."""
