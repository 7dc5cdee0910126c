"""The step's batches: the train loader's iterator, drawn ahead to a device, and its position.

:class:`DevicePrefetcher` starts the next batch's copy as it hands one out (on CUDA on a side
stream, one copy per dtype: :func:`copy_batch_to_device`), and keeps the loader's position
after the batches *consumed*, so a resumed run reads a batch drawn ahead again.
"""

from __future__ import annotations

import collections
import copy
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from trainkit.data.loading.loader import PackedBatch, map_leaves, unpack_batch

__all__ = [
    "BatchCopy",
    "CudaBatchCopy",
    "DevicePrefetcher",
    "ResumableLoader",
    "StepBatches",
    "copy_batch_to_device",
]

logger = logging.getLogger(__name__)


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
    and copied to that device while the current step runs (:class:`DevicePrefetcher`;
    ``"cpu"`` draws ahead without a copy, for the CPU tests of resuming).

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
        """Drop the iterator (its loader workers exit now), giving back the batches drawn ahead."""
        if isinstance(self._iterator, DevicePrefetcher):
            self._iterator.close()
        self._iterator = None

    def position(self) -> dict[str, Any] | None:
        """Return the loader's position after the batches consumed (``None``: it has none).

        Batches drawn ahead do not count: a checkpoint resumes with the first of them.
        """
        if isinstance(self._iterator, DevicePrefetcher):
            return self._iterator.state_dict()
        return self.loader.state_dict() if isinstance(self.loader, ResumableLoader) else None


def copy_batch_to_device(
    batch: Any, device: torch.device, *, pin_memory: bool = True
) -> tuple[Any, list[torch.Tensor]]:
    """Return ``batch`` with its CPU tensors copied to ``device``, and the copies made.

    ``batch`` is a :class:`~trainkit.data.loading.loader.PackedBatch` or lists, tuples and
    dicts (by exact type) of tensors and other values; only tensors move. The copies are
    ``non_blocking``, from pinned memory, on the current stream:

    * tensors that share one storage and together cover it (an unpacked ``PackedBatch``'s
      views of its per-dtype buffers): the storage, once, rebuilt as the same views;
    * other pinned tensors: each on its own (no host copy);
    * the rest: packed per dtype into one pinned buffer (the host copy pinning costs
      anyway), then one copy per dtype; they arrive contiguous (and apart, if they shared memory).

    Tensors already on ``device``, or that need gradients, are left to ``Tensor.to``.

    Args:
        batch, device: the batch (on the CPU) and where its tensors go.
        pin_memory: pin what is not pinned (``False`` only to check the grouping on a CPU).

    Returns:
        The batch on ``device``, and the device tensors of the copies (one per copy; on
        CUDA the consumer's stream must be recorded on them).
    """
    if type(batch) is PackedBatch:
        copies = [_to_device(buffer, device, pin_memory) for buffer in batch.buffers]
        return unpack_batch(PackedBatch(batch.structure, copies)), copies
    copies = []
    found: dict[int, torch.Tensor] = {}  # by id: a tensor twice in the batch moves once
    map_leaves(lambda leaf: found.setdefault(id(leaf), leaf) if _movable(leaf) else None, batch)
    leaves = list(found.values())
    moved: dict[int, torch.Tensor] = {}
    by_storage: dict[int, list[torch.Tensor]] = {}
    for leaf in leaves:
        if leaf.numel():
            by_storage.setdefault(leaf.untyped_storage().data_ptr(), []).append(leaf)
    loose: list[torch.Tensor] = [leaf for leaf in leaves if not leaf.numel()]
    for group in by_storage.values():
        storage = group[0].untyped_storage()
        covered = sum(leaf.numel() * leaf.element_size() for leaf in group) >= storage.nbytes()
        if len(group) > 1 and covered:
            flat = torch.empty(0, dtype=torch.uint8).set_(storage)
            device_storage = _to_device(flat, device, pin_memory)
            copies.append(device_storage)
            for leaf in group:
                moved[id(leaf)] = _view_like(leaf, device_storage)
        elif pin_memory and all(leaf.is_pinned() for leaf in group):
            for leaf in group:
                moved[id(leaf)] = leaf.to(device, non_blocking=True)
                copies.append(moved[id(leaf)])
        else:
            loose.extend(group)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for leaf in loose:
        by_dtype.setdefault(leaf.dtype, []).append(leaf)
    for dtype, group in by_dtype.items():
        buffer = torch.empty(
            sum(leaf.numel() for leaf in group), dtype=dtype, pin_memory=pin_memory
        )
        torch.cat([leaf.reshape(-1) for leaf in group], out=buffer)
        device_buffer = buffer.to(device, non_blocking=True)
        copies.append(device_buffer)
        offset = 0
        for leaf in group:
            moved[id(leaf)] = device_buffer[offset : offset + leaf.numel()].view(leaf.shape)
            offset += leaf.numel()

    def place(leaf: Any) -> Any:
        if id(leaf) in moved:
            return moved[id(leaf)]
        if isinstance(leaf, torch.Tensor) and leaf.device != device:
            return leaf.to(device, non_blocking=True)
        return leaf

    # The ids of the leaves are unique while `found` keeps them alive.
    return map_leaves(place, batch), copies


def _movable(leaf: Any) -> bool:
    return (
        isinstance(leaf, torch.Tensor)
        and leaf.device.type == "cpu"
        and leaf.layout == torch.strided
        and not leaf.requires_grad
    )


def _to_device(tensor: torch.Tensor, device: torch.device, pin_memory: bool) -> torch.Tensor:
    tensor = tensor.pin_memory() if pin_memory and not tensor.is_pinned() else tensor
    return tensor.to(device, non_blocking=True)


def _view_like(leaf: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``leaf``'s view (offset, shape, strides) of its storage, on ``flat``'s copy of it."""
    view = torch.empty(0, dtype=leaf.dtype, device=flat.device)
    return view.set_(flat.untyped_storage(), leaf.storage_offset(), leaf.shape, leaf.stride())


class BatchCopy(Protocol):
    """How a :class:`DevicePrefetcher` moves a batch: started ahead, finished on use."""

    def start(self, batch: Any) -> Any:
        """Start moving ``batch``; return what :meth:`finish` needs."""

    def finish(self, pending: Any) -> Any:
        """Return the moved batch, ready for the consumer's stream."""


class _NoCopy:
    """The CPU's copy: none (batches are used where the loader made them)."""

    def start(self, batch: Any) -> Any:
        return batch

    def finish(self, pending: Any) -> Any:
        return pending


class CudaBatchCopy:
    """Copy batches to a CUDA device on a side stream (:func:`copy_batch_to_device`)."""

    def __init__(self, device: torch.device) -> None:
        """Copy to ``device`` (``cuda`` without an index: the current device, now)."""
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.stream = device, torch.cuda.Stream(device)

    def start(self, batch: Any) -> tuple[Any, list[torch.Tensor]]:
        """Queue the batch's copies on the side stream; the CPU does not wait for them."""
        with torch.cuda.stream(self.stream):
            return copy_batch_to_device(batch, self.device)

    def finish(self, pending: tuple[Any, list[torch.Tensor]]) -> Any:
        """Make the current stream wait for the copies, and keep their memory until it is done."""
        batch, copies = pending
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        for tensor in copies:
            # Allocated on the side stream: without this, once the step drops the batch
            # the allocator could give its memory to the next copy while kernels still read it.
            tensor.record_stream(current)
        return batch


class DevicePrefetcher:
    """An iterator over ``iterator``'s batches, moved to the device ``depth`` batches ahead.

    ``next()`` returns the oldest batch drawn (ready for use on the current stream), then
    draws the next one and starts its copy, which overlaps with the work queued for the
    returned batch. The CPU never waits for the device here.

    Args:
        iterator: the loader's iterator.
        device: where batches go. ``cuda``: copied on a side stream (:class:`CudaBatchCopy`);
            ``cpu``: not copied, but drawn ahead (for the CPU tests of the bookkeeping).
        loader: the loader ``iterator`` came from, if it has a position (``state_dict``,
            ``load_state_dict``): see :meth:`state_dict` and :meth:`close`.
        depth: batches drawn ahead of the one handed out (>= 1).
        batch_copy: how a batch moves (default: by ``device``, as above).

    Raises:
        ValueError: If ``depth`` is below 1.
    """

    def __init__(
        self,
        iterator: Iterator[Any],
        device: torch.device | str,
        *,
        loader: Any = None,
        depth: int = 1,
        batch_copy: BatchCopy | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"a DevicePrefetcher draws at least 1 batch ahead, got depth={depth}")
        device = torch.device(device)
        self._iterator, self._depth = iterator, depth
        self._copy = batch_copy or (CudaBatchCopy(device) if device.type == "cuda" else _NoCopy())
        self._loader = loader if hasattr(loader, "state_dict") else None
        self._in_flight: collections.deque[tuple[Any, Any]] = collections.deque()
        self._ended = False
        self._error: Exception | None = None
        # The loader's position after the batches handed out (none yet: where it starts).
        self._consumed = self._loader.state_dict() if self._loader is not None else None

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> Any:
        self._fill()
        if not self._in_flight:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            raise StopIteration
        pending, self._consumed = self._in_flight.popleft()
        batch = self._copy.finish(pending)
        self._fill()
        return batch

    @property
    def num_in_flight(self) -> int:
        """Batches drawn from the loader and not handed out yet."""
        return len(self._in_flight)

    def _fill(self) -> None:
        while len(self._in_flight) < self._depth and not self._ended:
            try:
                batch = next(self._iterator)
            except Exception as e:
                # An error is raised when the consumer reaches the batch that failed, not
                # with the batch before it, which was drawn fine.
                self._ended, self._error = True, None if isinstance(e, StopIteration) else e
                return
            position = self._loader.state_dict() if self._loader is not None else None
            self._in_flight.append((self._copy.start(batch), position))

    def state_dict(self) -> dict[str, Any] | None:
        """Return the loader's position after the batches handed out (``None``: no position).

        A loader built the same way that loads it continues with the first batch drawn ahead.
        """
        return copy.deepcopy(self._consumed)

    def close(self) -> None:
        """Drop the batches drawn ahead and put the loader back after the ones handed out.

        A new iterator of the loader then starts with the first batch dropped. Without a
        loader position the dropped batches are lost, as with any closed iterator.
        """
        dropped = len(self._in_flight)
        self._in_flight.clear()
        self._ended = True
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()  # a generator: its loader workers exit now
        if dropped and self._loader is not None and hasattr(self._loader, "load_state_dict"):
            self._loader.load_state_dict(self._consumed)
            logger.debug("Put the loader back %d batch(es) drawn ahead", dropped)
