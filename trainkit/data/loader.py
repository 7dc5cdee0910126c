"""The resumable train loader: a main-process batch stream feeding a map-style DataLoader."""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import operator
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainkit.data._sample_context import sample_context
from trainkit.data.batching import BatchIndexStream
from trainkit.data.common import AspectRatioGroupedDataset, MapDataset
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError, user_message

logger = logging.getLogger(__name__)

__all__ = ["TrainLoader", "iterable_loader", "trivial_batch_collator", "worker_init_reset_seed"]


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


class _PositionedDataset(Dataset):
    """Map ``[index, position]`` items, setting the sample context around the mapper."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, item: list[int], batch: int | None = None) -> tuple[Any, int]:
        """Return the mapped element and how many records were skipped to produce it."""
        index, position = item
        if isinstance(self.dataset, MapDataset):
            failures_before = self.dataset.num_failures
            element = self.dataset.map_at(index, seed=self.seed, position=position, batch=batch)
            return element, self.dataset.num_failures - failures_before
        with sample_context(self.seed, position, batch):
            return self.dataset[index], 0

    def __getitems__(self, items: list[list[int]]) -> list[tuple[Any, int]]:
        """Map a whole batch (torch's fetcher calls this), keying ``batch_rng`` by the batch.

        The batch's key is its smallest stream position: unique among batches (positions
        are), and the same for any number of workers and after a resume.
        """
        batch = min(position for _, position in items)
        return [self.__getitem__(item, batch) for item in items]


class _CountingCollate:
    """Collate the elements and add up the records skipped for them (a picklable callable)."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[tuple[Any, int]]) -> tuple[Any, int]:
        return self.collate_fn([element for element, _ in items]), sum(n for _, n in items)


class _StreamBatchSampler:
    """DataLoader ``batch_sampler`` that (re)starts the loader's stream at its returned state."""

    def __init__(self, loader: TrainLoader) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[list[list[int]]]:
        return self._loader._generate_batches()


class TrainLoader:
    """An infinite (or sampler-bounded) iterable of batches with an exact, resumable position.

    Batches are composed in the training process by a :class:`BatchIndexStream` (sampler plus
    optional aspect-ratio grouping) and loaded whole by a ``torch.utils.data.DataLoader``'s
    workers; torch returns them in order, so the stream is the same for any number of workers.

    :meth:`state_dict` describes the batches *returned* by this object, not those the workers
    prefetched; a loader built the same way that loads it continues with the next batch.
    Iterating again (a new ``iter()``) continues after the last returned batch, too, unlike
    a torch ``DataLoader``: a training loop that re-creates its iterator loses no data. Over
    a finite sampler, an iteration that would yield nothing from there starts the next pass,
    so a finished loader can be iterated again like a ``DataLoader``; ``len()`` is then the
    number of batches of one pass. Use one iterator at a time. This class does not collate
    tensors unless given a ``collate_fn``.
    """

    def __init__(
        self,
        dataset: Dataset,
        stream: BatchIndexStream,
        *,
        seed: int,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loader_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Create the loader.

        Args:
            dataset: map-style dataset; a :class:`MapDataset` gets stream positions for
                its retries and sample context.
            stream: the batch-index stream of this rank.
            seed: the shared seed that keys :func:`trainkit.data.sample_rng`.
            collate_fn: turns the list of mapped samples into a batch (default: keep the list).
            loader_kwargs: ``num_workers``, ``prefetch_factor``, ``persistent_workers``,
                ``pin_memory`` and friends for ``torch.utils.data.DataLoader``.
        """
        self._stream = stream
        self._state = stream.state_dict()
        self._in_flight: collections.deque[dict[str, Any]] = collections.deque()
        self._num_skipped = 0
        kwargs = dict(loader_kwargs or {})
        if kwargs.get("num_workers", 0) == 0:
            kwargs.pop("prefetch_factor", None)  # torch refuses it without workers
            kwargs["persistent_workers"] = False
        else:
            kwargs = {**worker_context_kwargs(), **kwargs}
        # A private generator: otherwise every new iterator draws its workers' base seed
        # from the global torch RNG, which would shift the training RNG stream on resume.
        kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
        kwargs.setdefault("worker_init_fn", worker_init_reset_seed)
        self._torch_loader = DataLoader(
            _PositionedDataset(dataset, seed),
            batch_sampler=_StreamBatchSampler(self),
            collate_fn=_CountingCollate(collate_fn or trivial_batch_collator),
            **kwargs,
        )

    def _generate_batches(self) -> Iterator[list[list[int]]]:
        # Runs in this process (torch draws the batch sampler here, not in workers). Batches
        # prefetched by a previous iterator were never returned: regenerate from the state
        # of the last returned batch.
        self._in_flight.clear()
        produced = yield from self._batches_from(self._state)
        if not produced and not self._stream.at_pass_start(self._state):
            # Only a finite sampler's stream ends: its pass is over, start the next one.
            yield from self._batches_from(self._stream.next_pass_state(self._state))

    def _batches_from(self, start: dict[str, Any]) -> Generator[list[list[int]], None, bool]:
        self._stream.load_state_dict(start)
        produced = False
        for batch, state in self._stream:
            produced = True
            self._in_flight.append(state)
            yield batch
        return produced

    def __len__(self) -> int:
        """Return the number of batches of one pass over a finite sampler.

        Raises:
            TypeError: For an infinite sampler, or when grouping by aspect ratio.
        """
        return self._stream.batches_per_pass()

    def __iter__(self) -> Iterator[Any]:
        try:
            for batch in self._torch_loader:
                # torch returns batches in batch-sampler order: the oldest state is this batch's.
                self._state = self._in_flight.popleft()
                batch, num_skipped = batch
                self._num_skipped += num_skipped
                yield batch
        except UsageError as e:
            raise _without_worker_traceback(e) from e

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last returned batch, as plain data.

        Returns:
            A dict with ``num_batches`` (batches returned since the start of the run),
            ``num_drawn`` (sampler draws consumed on this rank), ``sampler`` (the sampler's
            ``state_dict()`` or ``None``), ``buckets`` (``[index, position]`` pairs waiting in
            each aspect-ratio bucket), ``last_batch`` (``[index, position]`` pairs of the last
            returned batch) and the ``version``, ``batch_size``, ``rank``, ``world_size`` it
            belongs to. It loads with ``torch.load(weights_only=True)``.
        """
        return {
            **self._state,
            "buckets": [[list(i) for i in b] for b in self._state["buckets"]],
            "last_batch": [list(i) for i in self._state["last_batch"]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches recorded in ``state`` (call before iterating).

        Raises:
            ValueError: If the state was saved by another rank or a differently built loader.
        """
        self._stream.load_state_dict(state)  # validates
        self._state = self._stream.state_dict()

    @property
    def num_skipped_records(self) -> int:
        """Records that failed to load (and were replaced) in the batches returned so far."""
        return self._num_skipped

    @property
    def num_batches_returned(self) -> int:
        """Batches returned since the start of the run (resumed runs included)."""
        return int(self._state["num_batches"])

    @property
    def last_batch_positions(self) -> list[int]:
        """Global stream positions of the samples of the batch just returned."""
        return [position for _, position in self._state["last_batch"]]

    @property
    def last_batch_indices(self) -> list[int]:
        """Dataset indices of the samples of the batch just returned."""
        return [index for index, _ in self._state["last_batch"]]


def _without_worker_traceback(error: UsageError) -> UsageError:
    """Return the user error a loader worker raised, with its own one-line message."""
    message = user_message(error)
    if message == str(error):
        return error  # raised in this process: already the user's message
    try:
        return type(error)(message)
    except Exception:  # a subclass with another constructor: keep torch's message
        return error


class _CollatedBatches(IterableDataset):
    """Apply ``collate_fn`` to every batch of an iterable (re-iterable, unlike ``map``)."""

    def __init__(
        self, batches: Iterable[list[Any]], collate_fn: Callable[[list[Any]], Any]
    ) -> None:
        self.batches = batches
        self.collate_fn = collate_fn

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:
            yield self.collate_fn(batch)


def iterable_loader(
    dataset: IterableDataset,
    batch_size: int,
    *,
    aspect_ratio_grouping: bool,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    loader_kwargs: dict[str, Any],
) -> Iterable[Any]:
    """Batch an ``IterableDataset`` with a torch ``DataLoader`` (detectron2's path).

    The dataset shards itself across workers. With grouping, samples cross the worker
    queue one by one and :class:`AspectRatioGroupedDataset` groups them by orientation in
    this process. Nothing here can resume: an iterable dataset has no position to save.
    """
    loader_kwargs = {"worker_init_fn": worker_init_reset_seed, **loader_kwargs}
    if not aspect_ratio_grouping:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            drop_last=drop_last,
            collate_fn=collate_fn or trivial_batch_collator,
            **loader_kwargs,
        )
    samples = DataLoader(dataset, collate_fn=operator.itemgetter(0), **loader_kwargs)
    grouped = AspectRatioGroupedDataset(samples, batch_size)
    return grouped if collate_fn is None else _CollatedBatches(grouped, collate_fn)
