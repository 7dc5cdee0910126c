"""The step's batches: the train loader's iterator, drawn ahead to a device, and its position."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from trainkit.data.loading.device_prefetch import DevicePrefetcher

__all__ = ["ResumableLoader", "StepBatches"]


@runtime_checkable
class ResumableLoader(Protocol):
    """A loader with a position to save and load back (``TrainLoader``, or a project's)."""

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the batches returned."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position :meth:`state_dict` returned."""
        ...


class StepBatches:
    """Draw a step's micro-batches from a train loader and know the position after them.

    The iterator is made on first use: a trainer built only to evaluate or to load a
    checkpoint never starts loader workers. With ``prefetch_device`` the next batch is drawn
    and copied to that device while the current step runs
    (:class:`~trainkit.data.loading.device_prefetch.DevicePrefetcher`; ``"cpu"`` draws ahead
    without a copy, for the CPU tests of resuming).

    Args:
        loader: the train loader, normally infinite.
    """

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.prefetch_device: torch.device | None = None
        self.num_read = 0
        self._iterator: Iterator[Any] | None = None

    @property
    def iterator(self) -> Iterator[Any]:
        """The loader's iterator (made, and wrapped in the prefetcher, on first use)."""
        if self._iterator is None:
            iterator = iter(self.loader)
            if self.prefetch_device is not None:
                iterator = DevicePrefetcher(iterator, self.prefetch_device, loader=self.loader)
            self._iterator = iterator
        return self._iterator

    def next(self, count: int, iteration: int) -> list[Any]:
        """Return the next ``count`` batches (the micro-batches of step ``iteration``).

        Raises:
            RuntimeError: If the loader runs out: a training loader must be infinite.
        """
        batches = []
        for _ in range(count):
            try:
                batches.append(next(self.iterator))
            except StopIteration:
                raise RuntimeError(
                    f"The data loader ran out after {self.num_read} batches at iteration "
                    f"{iteration}; a training loader must be infinite (use TrainingSampler)."
                ) from None
            self.num_read += 1
        return batches

    def replace(self, loader: Iterable[Any]) -> None:
        """Read from ``loader`` from now on (the old one's iterator is closed first)."""
        self.close()
        self.loader = loader

    def close(self) -> None:
        """Drop the iterator so its loader workers exit now; the loader keeps its position.

        Batches drawn ahead and not consumed are given back: the loader's next iterator
        starts with them.
        """
        if isinstance(self._iterator, DevicePrefetcher):
            self._iterator.close()
        self._iterator = None

    def position(self) -> dict[str, Any] | None:
        """Return the loader's position after the batches consumed (``None``: it has none).

        Batches drawn ahead and not consumed yet do not count, so a checkpoint resumes with
        the first of them.
        """
        if isinstance(self._iterator, DevicePrefetcher):
            return self._iterator.state_dict()
        return self.loader.state_dict() if isinstance(self.loader, ResumableLoader) else None
