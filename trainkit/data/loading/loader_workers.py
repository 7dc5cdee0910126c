"""The loader workers' side of a loader: how they start, and how a batch travels back.

:func:`loader_kwargs` gives every trainkit loader its workers: forked where possible
(:func:`worker_context_kwargs`), seeded from torch's per-worker seed
(:func:`worker_init_reset_seed`), started with the training process's objects frozen
(:func:`start_iterator`).

torch sends each tensor of a worker's batch through a shared-memory segment of its own (with
Linux's default ``file_descriptor`` strategy a new segment, a descriptor passed over a socket
and an ``mmap``: ~270 µs of CPU per tensor on this project's machine, more than reading and
resizing a small image), and a detectron2-style batch holds a tensor per record. So a worker
copies the batch's tensors into one buffer per dtype (:func:`pack_batch`: one ``torch.cat``,
a few µs) and the training process rebuilds each as a view of it, same values, shapes,
dtypes and structure. Only plain contiguous CPU tensors without gradients that own their
whole storage, in lists, tuples and dicts, are packed; anything else travels the usual way.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader

from trainkit.utils.env import seed_all_rng

__all__ = [
    "PackedBatch",
    "PackedCollate",
    "loader_kwargs",
    "map_leaves",
    "pack_batch",
    "pack_in_worker",
    "start_iterator",
    "trivial_batch_collator",
    "unpack_batch",
    "worker_context_kwargs",
    "worker_init_reset_seed",
]


def worker_context_kwargs() -> dict[str, Any]:
    """Return the DataLoader arguments that make loader workers fork where possible.

    Ranks started by ``launch()`` inherit "spawn" as their default start method; spawned
    workers would re-import torch (over a second each), need picklable mappers, and could not
    share ``DatasetFromList``'s buffers copy-on-write. Loader workers never touch CUDA, so
    forking them is safe.
    """
    return {"multiprocessing_context": "fork"} if "fork" in mp.get_all_start_methods() else {}


def trivial_batch_collator(batch: list[Any]) -> list[Any]:
    """Return the batch unchanged: a list of mapped samples."""
    return batch


def worker_init_reset_seed(worker_id: int) -> None:
    """Seed Python, numpy and torch in a loader worker from torch's per-worker seed.

    Mappers should prefer :func:`trainkit.data.sample_rng`, which does not depend on the
    worker; this only keeps code that uses the global generators from repeating itself.
    """
    seed_all_rng(torch.initial_seed() % 2**31 + worker_id)


def start_iterator(loader: DataLoader) -> Iterator[Any]:
    """Return ``iter(loader)``, with the objects alive now frozen while its workers fork.

    A forked worker shares this process's memory copy-on-write, but its first full garbage
    collection walks every object it inherited, copying the pages of nearly the whole heap
    into each worker (tens of MiB, ~0.2 s). The workers' collector skips frozen objects; this
    process unfreezes them as soon as the workers exist, so its own collections are
    unchanged. Objects the caller froze (``gc.get_freeze_count()``) stay as they are.
    """
    if gc.get_freeze_count():
        return iter(loader)
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def loader_kwargs(kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Return the ``DataLoader`` arguments of a trainkit loader, ``kwargs`` winning.

    Without workers, the arguments torch then refuses are dropped. The workers' base seed
    comes from a private generator seeded with ``seed``: otherwise every new iterator draws
    it from the global torch RNG, which would shift the training process's random numbers on
    resume (and evaluating during training would shift them too).
    """
    kwargs = dict(kwargs)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)  # torch refuses it without workers
        kwargs["persistent_workers"] = False
    else:
        kwargs = {**worker_context_kwargs(), **kwargs}
    kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
    kwargs.setdefault("worker_init_fn", worker_init_reset_seed)
    return kwargs


class _Slot(NamedTuple):
    """Where a packed tensor lies: buffer ``index``, element ``offset``, ``shape``."""

    index: int
    offset: int
    shape: torch.Size


class PackedBatch:
    """A batch whose tensors were moved into ``buffers``; :func:`unpack_batch` rebuilds it."""

    __slots__ = ("buffers", "structure")

    def __init__(self, structure: Any, buffers: list[torch.Tensor]) -> None:
        self.structure, self.buffers = structure, buffers

    def __reduce__(self) -> tuple[Any, ...]:
        return PackedBatch, (self.structure, self.buffers)

    def pin_memory(self) -> PackedBatch:
        """Pin the buffers (torch's pin-memory thread calls this): the views are pinned too."""
        return PackedBatch(self.structure, [buffer.pin_memory() for buffer in self.buffers])


def _packable(value: Any) -> bool:
    return (
        type(value) is torch.Tensor
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
        and value.is_contiguous()
        and value.storage_offset() == 0
        and value.untyped_storage().nbytes() == value.numel() * value.element_size()
    )


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Return ``tree`` (lists, tuples and dicts, by exact type) with ``fn`` applied to each leaf.

    Anything else is a leaf, subclasses of those containers included: they travel as they are.
    """
    if type(tree) in (list, tuple):
        return type(tree)(map_leaves(fn, item) for item in tree)
    if type(tree) is dict:
        return {key: map_leaves(fn, item) for key, item in tree.items()}
    return fn(tree)


def pack_batch(batch: Any) -> Any:
    """Return the collated ``batch`` as a :class:`PackedBatch` (one buffer per dtype).

    ``batch`` itself is returned when fewer than two tensors could be packed (nothing to
    gain), or when two of them share memory (packing would separate them).
    """
    leaves: list[torch.Tensor] = []
    map_leaves(lambda leaf: leaves.append(leaf) if _packable(leaf) else None, batch)
    if len(leaves) < 2:
        return batch
    pointers = [t.untyped_storage().data_ptr() for t in leaves if t.numel()]
    if len(set(pointers)) != len(pointers):
        return batch
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in leaves:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    slots: dict[int, _Slot] = {}
    buffers = []
    for index, tensors in enumerate(by_dtype.values()):
        offset = 0
        for tensor in tensors:
            slots[id(tensor)] = _Slot(index, offset, tensor.shape)
            offset += tensor.numel()
        buffers.append(torch.cat([t.reshape(-1) for t in tensors]))
    # Each packed tensor becomes its slot (the ids of live tensors are unique).
    return PackedBatch(map_leaves(lambda leaf: slots.get(id(leaf), leaf), batch), buffers)


def _rebuild(leaf: Any, buffers: list[torch.Tensor]) -> Any:
    if type(leaf) is not _Slot:
        return leaf
    index, offset, shape = leaf
    return buffers[index][offset : offset + shape.numel()].view(shape)


class PackedCollate:
    """Collate the samples a loader worker mapped, and pack them for the trip (picklable).

    ``(samples, *tags)`` -> ``(batch, *tags)``: the tags (the batch's number, the records
    skipped) travel beside the batch.
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        """Apply ``collate_fn`` (list of samples -> batch), then :func:`pack_in_worker`."""
        self.collate_fn = collate_fn

    def __call__(self, mapped: tuple[Any, ...]) -> tuple[Any, ...]:
        samples, *tags = mapped
        return (pack_in_worker(self.collate_fn(samples)), *tags)


def unpack_batch(batch: Any) -> Any:
    """Return the batch :func:`pack_batch` packed (views of its buffers), or ``batch`` as is."""
    if type(batch) is not PackedBatch:
        return batch
    return map_leaves(lambda leaf: _rebuild(leaf, batch.buffers), batch.structure)


def pack_in_worker(batch: Any) -> Any:
    """:func:`pack_batch` inside a loader worker; ``batch`` unchanged in the training process.

    Packing costs a copy and only pays when the batch crosses processes.
    """
    return batch if torch.utils.data.get_worker_info() is None else pack_batch(batch)
