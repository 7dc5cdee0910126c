"""Non-finite losses noticed on the losses' device and read only when the step trainer flushes.

Checking a CUDA loss with ``.item()`` makes the CPU wait for the GPU at every step. A
:class:`DeferredLossCheck` instead keeps, on the device, the first step whose total loss was
not finite and that step's loss terms (a few tiny kernels per step, no copy to the host); the
step trainer reads it (:meth:`DeferredLossCheck.check`) when a period's metrics are
synchronised and before every checkpoint, so that no checkpoint holds weights updated from a
non-finite loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainkit.engine.step_metrics import raise_non_finite
from trainkit.utils import comm

__all__ = ["DeferredLossCheck"]

_ALL_FINITE = -1  # the first bad step's value while every step so far was finite


class DeferredLossCheck:
    """Remember, on the device, the first non-finite step since the last :meth:`check`."""

    def __init__(self) -> None:
        """Start with nothing pending."""
        self._first_bad_iter: torch.Tensor | None = None  # int64 scalar, _ALL_FINITE if none
        self._bad_values: torch.Tensor | None = None  # float32 [len(names)]: that step's terms
        self._names: tuple[str, ...] = ()
        self._num_pending = 0
        self._last_iter = -1

    @property
    def num_pending(self) -> int:
        """Steps added since the last :meth:`check`."""
        return self._num_pending

    def add(self, cur_iter: int, names: tuple[str, ...], values: Sequence[torch.Tensor]) -> None:
        """Note step ``cur_iter``'s losses without reading them.

        Args:
            cur_iter: the step (0-based).
            names: the metric names of ``values``; the last is the total.
            values: one-element tensors on one device, the total last; a non-finite total
                marks the step (it is non-finite whenever a term is).

        Raises:
            NonFiniteLossError: Only when the loss names changed since the previous step and
                an earlier pending step was not finite (the change makes this one read).
        """
        stacked = torch.stack([value.detach().float().reshape(()) for value in values])
        if names != self._names:
            # A step's terms are kept in one tensor of the names' length: read what is
            # pending before the layout changes (rare: a model whose loss names vary).
            self.check(collective=False)
            self._names = names
            self._first_bad_iter = torch.full(
                (), _ALL_FINITE, dtype=torch.long, device=stacked.device
            )
            self._bad_values = torch.zeros_like(stacked)
        assert self._first_bad_iter is not None and self._bad_values is not None
        is_first_bad = (self._first_bad_iter == _ALL_FINITE) & ~torch.isfinite(stacked[-1])
        # torch.where with a Python number runs on the device: nothing is copied to the host.
        self._first_bad_iter = torch.where(is_first_bad, cur_iter, self._first_bad_iter)
        self._bad_values = torch.where(is_first_bad, stacked, self._bad_values)
        self._num_pending += 1
        self._last_iter = cur_iter

    def check(self, *, collective: bool) -> None:
        """Read what is pending (one copy to the host) and raise if a step was not finite.

        Args:
            collective: agree with every rank: all of them raise, naming the earliest bad
                step of any rank. Every rank must then call it at the same step.

        Raises:
            NonFiniteLossError: Naming the first bad step and its loss terms.

        Collective:
            ``all_gather`` over all ranks when ``collective`` and there are several.
        """
        found: tuple[int, list[float]] | None = None
        if self._num_pending:
            assert self._first_bad_iter is not None and self._bad_values is not None
            host = torch.cat([self._first_bad_iter.double().reshape(1), self._bad_values.double()])
            first_bad, *values = host.cpu().tolist()
            if first_bad != _ALL_FINITE:
                found = (int(first_bad), values)
                # Keeps the state: a later check raises the same error again.
            else:
                self._num_pending = 0
        names, noticed_at = self._names, self._last_iter
        if collective and comm.get_world_size() > 1:
            per_rank = comm.all_gather((found, names, noticed_at))
            bad = [(f, n, at) for f, n, at in per_rank if f is not None]
            if bad:
                found, names, noticed_at = min(bad, key=lambda entry: entry[0][0])
        if found is not None:
            raise_non_finite(found[0], names, found[1], noticed_at)
