"""``TrainLoader``: the resumable train loader, and how a batch travels back from a worker.

A record's way through a map-style train loader, forward only: a **batch plan**
(:mod:`trainkit.data.plans.batch_plan`) decides in this process which ``(index, position)`` pairs
make each batch and the position after it; the torch ``DataLoader`` hands each batch to a loader
worker (:class:`_PlannedBatches` is its batch sampler), which maps each record in its sample context
(:class:`~trainkit.data.mapping.record_mapper.RecordMapper`), collates and packs the batch
(:class:`PackedCollate`); the loader unpacks the batches, returns them in plan order and keeps the
position after each (a :mod:`trainkit.data.plans.loader_state` state). So the batches are the same
for any number of loader workers and, over a trainkit sampler, any world size. A stream dataset
(:class:`RankDataLoader`'s too) goes through :mod:`trainkit.data.loading.stream_batches` instead.

Packing: torch sends each tensor of a worker's batch through a shared-memory segment of its
own (~270 µs of CPU per tensor here, more than reading and resizing a small image), and a
detectron2-style batch holds a tensor per record. So a worker copies the batch's plain CPU
tensors into one buffer per dtype (:func:`pack_batch`, a few µs) and the training process
rebuilds each as a view of it. It lives here, with the loader, so that a batch's way is one
module in the training process and one in a worker.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset

from trainkit.config import ConfigError
from trainkit.data.loading.loader_workers import loader_kwargs as worker_kwargs
from trainkit.data.loading.loader_workers import start_iterator
from trainkit.data.loading.stream_batches import StreamBatches, batches_in_turn
from trainkit.data.mapping.record_mapper import RecordMapper, sample_context
from trainkit.data.plans.batch_plan import BatchPlan
from trainkit.data.plans.loader_state import copy_state, load_state
from trainkit.data.records.rank_dataset import RankDataset, RankStream
from trainkit.data.spec import TrainDataSpec
from trainkit.utils.errors import UsageError, user_message

__all__ = [
    "PackedBatch",
    "PackedCollate",
    "RankDataLoader",
    "TrainLoader",
    "map_leaves",
    "pack_batch",
    "pack_in_worker",
    "trivial_batch_collator",
    "unpack_batch",
]

logger = logging.getLogger(__name__)


class _PlannedBatches:
    """The torch loader's batch sampler: the plan's batches from ``start``, tagged.

    Each yielded item is ``[index, position, batch key, batch number]``; the plan's position
    after batch number ``n`` waits in :attr:`states` until the loader returns that batch.
    """

    def __init__(self, plan: BatchPlan) -> None:
        self.plan = plan
        self.start: dict[str, Any] = plan.state_dict()
        self.states: dict[int, tuple[dict[str, Any], list[list[int]]]] = {}
        self._numbers = itertools.count()

    def __iter__(self) -> Iterator[list[list[int]]]:
        # Runs in the training process (torch draws the batch sampler here). Batches a
        # previous iterator prefetched were never returned: start again from `start`.
        self.states.clear()
        produced = yield from self._from(self.start)
        if not produced and not self.plan.at_pass_start(self.start):
            # Only a finite sampler's plan ends: its pass is over, start the next one.
            yield from self._from(self.plan.next_pass_state(self.start))

    def _from(self, start: dict[str, Any]) -> Iterator[list[list[int]]]:
        self.plan.load_state_dict(start)
        produced = False
        for items, key, state in self.plan:
            produced = True
            number = next(self._numbers)
            self.states[number] = (state, items)
            yield [[index, position, key, number] for index, position in items]
        return produced


class _MappedRecords(Dataset):
    """Read and map a whole batch of ``[index, position, key, number]`` items (in a worker)."""

    def __init__(self, records: Any, mapper: RecordMapper | None, seed: int) -> None:
        self.records, self.mapper, self.seed = records, mapper, seed

    def __len__(self) -> int:
        return len(self.records)

    def __getitems__(self, items: list[list[int]]) -> tuple[list[Any], int, int]:
        number = items[0][3]
        elements, skipped = [], 0
        for index, position, key, _ in items:
            if self.mapper is None:
                with sample_context(self.seed, position, key):
                    elements.append(self.records[index])
                continue
            element, failed = self.mapper.map_replacing(
                self.records, index, seed=self.seed, position=position, batch=key
            )
            elements.append(element)
            skipped += failed
        return elements, number, skipped


class TrainLoader:
    """An infinite (or sampler-bounded) iterable of batches with an exact, resumable position.

    Loads a :class:`~trainkit.data.spec.TrainDataSpec` (as the module docstring says).
    :meth:`state_dict` describes the batches *returned*, not those prefetched: a loader of the same
    spec that loads it continues with the next batch, and so does a new ``iter()`` (unlike a torch
    ``DataLoader``). Over a finite sampler, an iteration that would yield nothing from there starts
    the next pass, and ``len()`` is the batches of one pass. Use one iterator at a time.

    Attributes:
        spec: the training data it loads (which records each step holds: ``spec.plan()``).
        records: the unmapped records (or the stream) it reads: ``spec.records``.
        seed: the key of ``sample_rng()`` and of the workers' base seeds: ``spec.seed``; a
            resume continues the same stream only with the same seed.
        num_skipped_records: records that failed to map (replaced or skipped) in batches returned.
    """

    def __init__(self, spec: TrainDataSpec) -> None:
        """Load ``spec``'s records in the batches its plan (for a stream: its workers) form."""
        self.spec, self.records, self.seed = spec, spec.records, spec.seed
        self.num_skipped_records = 0
        self._last_items: list[list[int]] = []
        kwargs = worker_kwargs(spec.loader.torch_kwargs(), spec.seed)
        collate = spec.loader.collate_fn or trivial_batch_collator
        plan = spec.plan()
        if plan is None:
            source = StreamBatches(
                spec.records,
                spec.mapper,
                spec.micro_batch_size,
                bucket_of=spec.bucket_of,
                collate_fn=PackedCollate(collate).pack,
                seed=spec.seed,
                drop_last=spec.loader.drop_last,
            )
            logger.info(
                "Stream dataset: batches of %d formed in the loader workers", source.batch_size
            )
            self._stream, self._batches = source, None
            self._state = source.initial_state(max(1, int(kwargs.get("num_workers", 0))))
            # Workers that outlive an iterator would keep the position they started from.
            kwargs["persistent_workers"] = False
            self._loader = DataLoader(source, batch_size=None, **kwargs)
        else:
            self._stream, self._batches = None, _PlannedBatches(plan)
            self._state = plan.state_dict()
            self._loader = DataLoader(
                _MappedRecords(spec.records, spec.mapper, spec.seed),
                batch_sampler=self._batches,
                # With the batch number and skip count.
                collate_fn=PackedCollate(collate),
                **kwargs,
            )

    def __len__(self) -> int:
        """Return the batches of one pass over a finite sampler.

        Raises:
            TypeError: For an infinite sampler, a stream, or when grouping by aspect ratio.
        """
        if self._batches is None:
            raise TypeError("a stream loader has no len(): the stream decides when it ends")
        return self._batches.plan.batches_per_pass()

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._iter_planned() if self._stream is None else self._iter_stream()
        except UsageError as e:
            # torch re-raises a worker's error with its traceback in the message; a user
            # error keeps its one line.
            message = user_message(e)
            raise (type(e)(message) if message != str(e) else e) from e

    def _iter_planned(self) -> Iterator[Any]:
        batches: _PlannedBatches = self._batches  # type: ignore[assignment]
        batches.start = self._state
        for batch, number, skipped in start_iterator(self._loader):
            self._state, self._last_items = batches.states.pop(number)
            self.num_skipped_records += skipped
            yield unpack_batch(batch)

    def _iter_stream(self) -> Iterator[Any]:
        self._stream.start = self._state  # type: ignore[union-attr]
        for batch, state, skipped in batches_in_turn(start_iterator(self._loader), self._state):
            self._state = state
            self.num_skipped_records += skipped
            yield unpack_batch(batch)

    @property
    def last_batch_indices(self) -> list[int]:
        """Dataset indices the plan chose for the batch just returned (not replacements)."""
        return [index for index, _ in self._last_items]

    @property
    def last_batch_positions(self) -> list[int]:
        """Global stream positions of the samples of the batch just returned (map-style)."""
        return [position for _, position in self._last_items]

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last returned batch (plain ``loader_state`` data)."""
        return copy_state(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches recorded in ``state`` (call before iterating).

        ``state`` may come from any trainkit version; a global stream position from any rank
        of any world size (at a step boundary).

        Raises:
            ConfigError: If the state was saved by a differently configured loader.
            ValueError: For another rank's per-rank position.
        """
        self._state = load_state(state, self._state)


class RankDataLoader(TrainLoader):
    """The infinite, resumable train loader over a :class:`RankDataset`'s :class:`RankStream`.

    Loading its state, a loader over the same file with the same ``num_workers`` continues
    with the next batch; a state of another seed, rank, world size or ``mini_epochs`` is
    refused. ``build_train_loader(cfg)`` builds it for a catalog entry giving a ``RankDataset``.
    """

    def __init__(
        self,
        dataset: RankDataset,
        batch_size: int,
        *,
        mapper: Callable[[Any], Any] | None = None,
        start_epoch: int = 0,
        **loader_kwargs: Any,
    ) -> None:
        """Load batches of ``batch_size`` samples of ``dataset`` from ``start_epoch`` on.

        Args:
            dataset, batch_size: this rank's :class:`RankDataset` and its samples per batch.
            mapper: record -> sample (may use ``trainkit.data.sample_rng()``).
            start_epoch: the first (mini-)epoch.
            loader_kwargs: as for :func:`~trainkit.data.build.build_batch_data_loader`.

        Raises:
            ConfigError: A ``ValueError``: if ``batch_size`` is not positive.
        """
        if batch_size < 1:
            raise ConfigError(f"batch size per rank must be >= 1, got {batch_size}")
        self.dataset = dataset
        mapper = None if mapper is None else RecordMapper(mapper, name=dataset.meta_file)
        super().__init__(
            TrainDataSpec.from_arguments(
                RankStream(dataset, start_epoch),
                None,
                None,
                mapper=mapper,
                single_gpu_batch_size=batch_size,
                seed=dataset.seed,
                **loader_kwargs,
            )
        )


# ---- a batch's trip from a worker ----------------------------------------------------------


def trivial_batch_collator(batch: list[Any]) -> list[Any]:
    """Return the batch unchanged: a list of mapped samples."""
    return batch


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

    Packed are contiguous CPU tensors without gradients that own their storage, in lists,
    tuples and dicts; ``batch`` itself is returned when fewer than two tensors could be packed
    (nothing to gain), or when two of them share memory (packing would separate them).
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
    skipped) travel beside the batch; :meth:`pack` takes the samples alone (a stream's).
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        """Apply ``collate_fn`` (list of samples -> batch), then :func:`pack_in_worker`."""
        self.collate_fn = collate_fn

    def __call__(self, mapped: tuple[Any, ...]) -> tuple[Any, ...]:
        samples, *tags = mapped
        return (self.pack(samples), *tags)

    def pack(self, samples: list[Any]) -> Any:
        """Return the samples collated and packed."""
        return pack_in_worker(self.collate_fn(samples))


def unpack_batch(batch: Any) -> Any:
    """Return the batch :func:`pack_batch` packed (views of its buffers), or ``batch`` as is."""
    if type(batch) is not PackedBatch:
        return batch
    return map_leaves(lambda leaf: _rebuild(leaf, batch.buffers), batch.structure)


def pack_in_worker(batch: Any) -> Any:
    """:func:`pack_batch` in a loader worker; unchanged in the training process (no trip to pay)."""
    return batch if torch.utils.data.get_worker_info() is None else pack_batch(batch)
