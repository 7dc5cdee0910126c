"""What a training step records: losses summed, checked, gathered over ranks, filed in bulk.

The step trainers buffer each step's losses as floats (CPU) or detached device tensors and file them
here: one host copy for all device values, one ``all_gather``, one storage call per metric.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE
from trainkit.utils import comm
from trainkit.utils.events import EventStorage, get_event_storage

__all__ = [
    "MetricEntry",
    "checked_losses",
    "NonFiniteLossError",
    "gather_and_file",
    "host_values",
    "metric_names",
    "raise_non_finite",
    "sum_losses",
    "write_metrics",
]

MetricEntry = tuple[int, tuple[str, ...], list[Any], float]
"""(iteration, metric names, values as floats or detached scalar tensors, data time in s)."""


def sum_losses(loss_dict: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Return the sum of the losses; a ``total_loss`` among others is not counted twice.

    One loss (also a model's single tensor, ``{"total_loss": t}``) is its own sum.
    """
    if len(loss_dict) == 1:
        return next(iter(loss_dict.values()))
    return functools.reduce(operator.add, (v for k, v in loss_dict.items() if k != "total_loss"))


def checked_losses(output: Any) -> dict[str, torch.Tensor]:
    """Return a model's training output as a checked dict of losses (one tensor: ``total_loss``).

    Raises:
        TypeError: If ``output`` is neither a dict nor a tensor.
        ValueError: If the dict is empty or a loss is not a one-element tensor.
    """
    loss_dict = {"total_loss": output} if isinstance(output, torch.Tensor) else output
    if not isinstance(loss_dict, Mapping):
        raise TypeError(
            "In training mode the model must return a dict of scalar losses or one "
            f"scalar tensor, got {type(output).__name__}"
        )
    if not loss_dict:
        raise ValueError("The model returned an empty loss dict; there is nothing to train")
    for name, loss in loss_dict.items():
        # numel() reads shape metadata only, so this check does not sync the device.
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"Loss {name!r} must be a one-element tensor, got {loss!r}")
    return dict(loss_dict)


def metric_names(loss_names: tuple[str, ...], prefix: str = "") -> tuple[str, ...]:
    """Return the names a step records: its losses, then ``{prefix}total_loss`` (their sum)."""
    return tuple(k for k in loss_names if k != "total_loss") + (f"{prefix}total_loss",)


def host_values(
    loss_dict: Mapping[str, torch.Tensor], names: tuple[str, ...], total: float
) -> list[float]:
    """Read the losses named by ``names`` (all but the last) as floats, then ``total``."""
    if len(names) == 2 and len(loss_dict) == 1:
        return [total, total]  # one loss is its own total
    return [float(loss_dict[name].detach().float().item()) for name in names[:-1]] + [total]


def write_metrics(
    loss_dict: Mapping[str, torch.Tensor], data_time: float, cur_iter: int, prefix: str = ""
) -> None:
    """Gather one step's losses over ranks and put their averages into the current storage.

    ``SimpleTrainer.write_metrics`` (detectron2's static method). ``data_time`` is filed as
    in :func:`gather_and_file`.

    Raises:
        FloatingPointError: On every rank, if an averaged loss is infinite or NaN.

    Collective:
        ``all_gather`` over all ranks; every rank must call it for the same iterations.
    """
    names = metric_names(tuple(loss_dict), prefix)
    values = [loss_dict[name].detach() for name in names[:-1]] + [sum_losses(loss_dict).detach()]
    gather_and_file([(cur_iter, names, values, data_time)], get_event_storage(), always_check=True)


def gather_and_file(
    buffered: list[MetricEntry],
    storage: EventStorage,
    *,
    always_check: bool = False,
    share: Callable[[], Any] | None = None,
) -> list[Any]:
    """Synchronise buffered metrics and put the rank average into ``storage``.

    ``data_time`` is the slowest rank's (the step waited for it), ``rank_data_time`` this rank's.

    Args:
        buffered: this rank's entries, oldest first.
        storage: where to file the averages.
        always_check: check for NaN/inf even values this rank checked (one process, CPU losses).
        share: called once the device values are on the host (so after the device reached
            this point); what it returns travels with the metrics to every rank.

    Returns:
        What ``share`` returned on each rank (index = rank); ``None`` entries without it.

    Raises:
        FloatingPointError: On every rank, after filing the steps before, if a value is not finite.

    Collective:
        ``all_gather`` over all ranks, at the same iterations. Every rank sees every value,
        so all raise together on a non-finite loss (none is left waiting in a collective).
    """
    device_values = [
        v.float().reshape(()) for entry in buffered for v in entry[2] if isinstance(v, torch.Tensor)
    ]
    if device_values:
        # One stacked device-to-host copy instead of one .item() sync per value.
        host = iter(torch.stack(device_values).cpu().tolist())
        buffered = [
            (i, names, [next(host) if isinstance(v, torch.Tensor) else v for v in values], d)
            for i, names, values, d in buffered
        ]
    shared = share() if share is not None else None
    # One all_gather per period: the figures ride along with the metrics.
    all_ranks, all_shared = zip(*comm.all_gather((buffered, shared)))
    # CPU losses of this process were checked at every step; averages and values read
    # from a device only now are checked here.
    check_finite = always_check or bool(device_values) or len(all_ranks) > 1
    # Columns of (value, iteration) points, filed with one storage call per metric.
    series: dict[str, list[tuple[float, int]]] = {"data_time": [], "rank_data_time": []}
    non_finite: tuple[int, tuple[str, ...], list[float]] | None = None
    for position, (cur_iter, names, values, data_time_s) in enumerate(buffered):
        slowest_data_time_s = data_time_s
        if len(all_ranks) > 1:
            per_rank = [rank_buffer[position] for rank_buffer in all_ranks]
            _check_same_loss_names(cur_iter, [entry[1] for entry in per_rank])
            values = [sum(column) / len(per_rank) for column in zip(*(e[2] for e in per_rank))]
            slowest_data_time_s = max(entry[3] for entry in per_rank)
        if check_finite and not all(math.isfinite(v) for v in values):
            non_finite = (cur_iter, names, values)
            break
        series["data_time"].append((slowest_data_time_s, cur_iter))
        series["rank_data_time"].append((data_time_s, cur_iter))
        for name, value in zip(names, values):
            series.setdefault(name, []).append((value, cur_iter))
    for name, points in series.items():
        if points:
            storage.put_scalar_series(name, points)
    if non_finite is not None:
        raise_non_finite(*non_finite)
    return list(all_shared)


class NonFiniteLossError(FloatingPointError):
    """A loss became infinite or NaN; the job ends with ``NON_FINITE_EXIT_CODE`` (65).

    detectron2 raises a ``FloatingPointError`` with the same message prefix, which this is.
    Restarts do not retry it (the run would fail the same way); ``docs/device.md`` shows how
    to go on past the records that caused it.

    Attributes:
        iteration: the first step whose loss was not finite (0-based, as in ``metrics.json``).
        losses: that step's loss terms and ``total_loss``, as floats.
        exit_code: :data:`trainkit.launcher.protocol.NON_FINITE_EXIT_CODE`.
    """

    def __init__(self, iteration: int, losses: dict[str, float], noticed_at: int | None = None):
        """Describe step ``iteration``'s losses (noticed at step ``noticed_at``, if later)."""
        noticed = ""
        if noticed_at is not None and noticed_at != iteration:
            noticed = f" (noticed at iteration {noticed_at}; no checkpoint holds the steps since)"
        super().__init__(
            f"Loss became infinite or NaN at iteration={iteration}! loss_dict = {losses}"
            f"{noticed}. Resume from the last checkpoint (--resume) after lowering "
            "SOLVER.BASE_LR or leaving out the records that cause it (docs/device.md)."
        )
        self.iteration = iteration
        self.losses = losses
        self.exit_code = NON_FINITE_EXIT_CODE


def raise_non_finite(
    cur_iter: int, names: tuple[str, ...], values: list[float], noticed_at: int | None = None
) -> None:
    """Raise :class:`NonFiniteLossError` (detectron2's message) for step ``cur_iter``'s losses."""
    raise NonFiniteLossError(cur_iter, dict(zip(names, values)), noticed_at)


def _check_same_loss_names(cur_iter: int, names_per_rank: list[tuple[str, ...]]) -> None:
    for rank, names in enumerate(names_per_rank):
        if names != names_per_rank[0]:
            raise RuntimeError(
                f"At iteration {cur_iter} rank 0 returned losses {list(names_per_rank[0])} but "
                f"rank {rank} returned {list(names)}; every rank must return the same loss "
                "names in the same order so that they can be averaged."
            )
