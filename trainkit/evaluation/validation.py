"""Validation losses: the model's training losses on a test set, without training on it.

The model runs its training-mode forward (which returns the loss dict) with normalisation
layers on their running statistics and dropout off, under ``no_grad``, and every global RNG
restored afterwards: the training run is the same bit for bit with or without validation
losses. Each batch's losses (means over the batch) are weighted by its size and the sums
and counts of every rank combined, so any number of ranks, uneven shards and a short last
batch give the one-process per-record average (up to float summation order).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainkit.utils import comm
from trainkit.utils.env import get_rng_state, set_rng_state

__all__ = ["loss_evaluation_context", "validation_losses"]

logger = logging.getLogger(__name__)

# Public dropout classes (their shared base class is private to torch).
_DROPOUT_TYPES = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout
)  # fmt: skip


@contextlib.contextmanager
def loss_evaluation_context(model: nn.Module) -> Iterator[None]:
    """Inside the block: ``model`` in training mode, but norm layers and dropout in eval mode.

    The model then returns its losses while normalisation layers use (and do not update)
    their running statistics and dropout passes inputs through. Every module's ``training``
    flag is restored afterwards, also when the block raises.
    """
    saved = [(module, module.training) for module in model.modules()]
    try:
        model.train()
        for module in model.modules():
            # BatchNorm (any dimension, SyncBatchNorm, subclasses) and InstanceNorm: the
            # layers with running statistics all have track_running_stats.
            has_running_stats = isinstance(getattr(module, "track_running_stats", None), bool)
            if isinstance(module, _DROPOUT_TYPES) or has_running_stats:
                module.training = False  # not .eval(): that would recurse into children
        yield
    finally:
        for module, training in saved:
            module.training = training


def validation_losses(model: nn.Module, data_loader: Iterable[Any]) -> dict[str, float]:
    """Return the model's losses on ``data_loader``, averaged per record over all ranks.

    Args:
        model: returns a dict of scalar losses (or one scalar tensor, named
            ``total_loss``) in training mode, as trainers expect; DDP-wrapped or not (the
            bare module runs, so no DDP collective is involved).
        data_loader: this rank's share of the test set, each record once (e.g.
            ``build_test_loader``: ``InferenceSampler`` shards, no padding). A batch is a
            list of records, a tensor, or a mapping of tensors (its size is the length of
            the list, or of the first dimension). Its records must hold what the loss needs.

    Returns:
        ``{loss name: mean over records}`` plus ``total_loss`` (their sum), identical on
        every rank; ``{}`` if the test set is empty.

    Raises:
        TypeError: If the model returns something other than a dict or a tensor.
        ValueError: If a loss is not a one-element tensor.

    Collective:
        One ``all_gather`` at the end; every rank calls it (a rank with no records too).
    """
    start_s = time.perf_counter()
    bare = model.module if isinstance(model, DistributedDataParallel) else model
    sums: dict[str, float] = {}
    count = 0
    # Iterating a DataLoader draws its workers' base seed from torch's global RNG, and a
    # model or mapper may draw too; the training stream must not notice any of it.
    rng_state = get_rng_state()
    try:
        with loss_evaluation_context(bare), torch.no_grad():
            for batch in data_loader:
                batch_size = len(batch)
                if isinstance(batch, Mapping):
                    first = next(iter(batch.values()), None)
                    batch_size = 0 if first is None else len(first)
                for name, value in _loss_dict(bare(batch)).items():
                    sums[name] = sums.get(name, 0.0) + float(value) * batch_size
                count += batch_size
    finally:
        set_rng_state(rng_state)
    # Summed in rank order, so every rank gets the same values.
    parts = comm.all_gather((sums, count))
    total = sum(rank_count for _, rank_count in parts)
    losses: dict[str, float] = {}
    if total:
        names = dict.fromkeys(name for rank_sums, _ in parts for name in rank_sums)
        losses = {name: sum(s.get(name, 0.0) for s, _ in parts) / total for name in names}
        losses.setdefault("total_loss", math.fsum(losses.values()))
    logger.info(
        "Validation losses over %d records (%d processes): %s; took %.2f s",
        total,
        comm.get_world_size(),
        ", ".join(f"{k}={v:.6g}" for k, v in losses.items()) or "none (no records)",
        time.perf_counter() - start_s,
    )
    return losses


def _loss_dict(output: Any) -> dict[str, torch.Tensor]:
    losses = {"total_loss": output} if isinstance(output, torch.Tensor) else output
    if not isinstance(losses, Mapping):
        raise TypeError(
            "validation_losses: in training mode the model must return a dict of scalar losses "
            f"or one scalar tensor, got {type(output).__name__}"
        )
    for name, value in losses.items():
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError(
                f"validation_losses: loss {name!r} must be a one-element tensor, got "
                f"{type(value).__name__}{tuple(getattr(value, 'shape', ()))}"
            )
    return dict(losses)
