"""Gradient accumulation's arithmetic: each micro-batch's weight, the step's loss sums."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["add_weighted", "micro_batch_weights"]


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
