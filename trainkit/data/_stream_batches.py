"""Batches of a stream (an ``IterableDataset``), formed and mapped inside the loader workers.

The rule for a stream read by ``n`` loader workers (``n = 1`` without workers):

* worker ``w`` reads the elements ``w, w + n, w + 2n, ...`` of the stream — or, for a stream
  that shards itself (``shards_across_workers = True``), whatever the stream gives that
  worker — so each element is read by one worker only;
* each worker forms whole batches from its own elements (by aspect-ratio bucket with
  grouping, read from the raw element's ``width``/``height``), maps a batch at once (one
  sample context per element, one ``batch_rng()`` key per batch) and collates it;
* the loader returns the workers' batches in turn: worker 0's first batch, worker 1's
  first, ..., worker 0's second, ... (after a resume it goes on with the worker whose turn
  it was, holding back the batches that arrive early; a worker whose stream ended loses its
  turns).

The batch stream therefore depends on ``NUM_WORKERS`` (the same elements, grouped
differently), unlike the map-style path. An element's ``sample_rng()`` position is
``c * n + w`` for the ``c``-th element worker ``w`` reads: unique, and the stream position
itself when the loader shards.

A worker's position is its count of elements read plus the elements waiting in its buckets;
the loader keeps the latest of each worker's (it comes back with every batch), so a stream
that can be read again from the start (or from a position: ``iter_from(position)``) resumes
exactly with the same ``NUM_WORKERS``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from trainkit.config import ConfigError
from trainkit.data._batch_transfer import pack_in_worker
from trainkit.data._map_dataset import RecordMapper
from trainkit.data._sample_context import sample_context

__all__ = ["StreamBatches", "empty_worker_state"]

logger = logging.getLogger(__name__)


def empty_worker_state() -> dict[str, Any]:
    """The position of a worker that has read nothing."""
    return {"read": 0, "pending": []}


class StreamBatches(IterableDataset):
    """The batches one loader worker (or the main process) forms from a stream.

    Args:
        stream: the user's ``IterableDataset`` of raw elements.
        mapper: maps one raw element (``None``: elements are used as they are).
        batch_size: elements per batch.
        bucket_of: raw element -> aspect-ratio bucket (grouping), or None.
        collate_fn: list of mapped elements -> batch.
        seed: keys ``sample_rng()`` / ``batch_rng()``.
        drop_last: at the end of a finite stream, drop what is left in a worker's buckets
            (else each bucket becomes one last, smaller batch).
        start: per-worker positions to resume from (``None``: the start).
    """

    def __init__(
        self,
        stream: IterableDataset,
        mapper: RecordMapper | None,
        batch_size: int,
        *,
        bucket_of: Callable[[Any], int] | None,
        collate_fn: Callable[[list[Any]], Any],
        seed: int,
        drop_last: bool = True,
        start: dict[str, Any] | None = None,
    ) -> None:
        self.stream = stream
        self.drop_last = drop_last
        self.mapper = mapper
        self.batch_size = batch_size
        self.bucket_of = bucket_of
        self.collate_fn = collate_fn
        self.seed = seed
        self.start = start

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        start = self.start
        if start is not None and start["num_workers"] != num_workers:
            raise ConfigError(
                f"the stream loader's state was saved with {start['num_workers']} loader workers, "
                f"this loader has {num_workers}; resume a stream with the same "
                "DATALOADER.NUM_WORKERS (its batches depend on it)."
            )
        state = start["workers"][worker] if start else empty_worker_state()
        yield from self._batches(worker, num_workers, state)
        # Tells the loader this worker has no more batches (a finite stream), so that it
        # stops waiting for this worker's turn.
        yield None, {"worker": worker, "end": True}

    def _worker_elements(self, worker: int, num_workers: int, first: int) -> Iterator[Any]:
        """This worker's elements, from its ``first``-th one."""
        self_sharding = getattr(self.stream, "shards_across_workers", False)
        if self_sharding or num_workers == 1:
            if hasattr(self.stream, "iter_from"):
                return self.stream.iter_from(first)
            return itertools.islice(iter(self.stream), first, None)
        if hasattr(self.stream, "iter_from"):
            elements = self.stream.iter_from(first * num_workers + worker)
            return itertools.islice(elements, 0, None, num_workers)
        start = first * num_workers + worker
        return itertools.islice(iter(self.stream), start, None, num_workers)

    def _batches(
        self, worker: int, num_workers: int, state: dict[str, Any]
    ) -> Iterator[tuple[Any, dict[str, Any]]]:
        pending = {int(c): int(b) for c, b in state["pending"]}  # read count -> bucket
        first = min(pending, default=int(state["read"]))
        buckets: dict[int, list[tuple[int, Any]]] = {}
        failures_in_a_row = 0
        read = first
        for element in self._worker_elements(worker, num_workers, first):
            count = read
            read += 1
            if count < state["read"] and count not in pending:
                continue  # returned in a batch before the resume
            bucket = pending.pop(count, None)
            if bucket is None:
                bucket = self.bucket_of(element) if self.bucket_of is not None else 0
            bucket_items = buckets.setdefault(bucket, [])
            bucket_items.append((count, element))
            if len(bucket_items) < self.batch_size:
                continue
            del buckets[bucket]
            batch, skipped, failures_in_a_row = self._map_batch(
                bucket_items, worker, num_workers, failures_in_a_row
            )
            waiting = [[c, b] for b, items in buckets.items() for c, _ in items]
            meta = {
                "worker": worker,
                "state": {"read": read, "pending": sorted(waiting)},
                "skipped": skipped,
                "size": len(batch),
            }
            if batch:
                yield pack_in_worker(self.collate_fn(batch)), meta
        if self.drop_last:
            return
        for bucket in sorted(buckets):
            items = buckets.pop(bucket)
            batch, skipped, failures_in_a_row = self._map_batch(
                items, worker, num_workers, failures_in_a_row
            )
            waiting = [[c, b] for b, rest in buckets.items() for c, _ in rest]
            meta = {"worker": worker, "state": {"read": read, "pending": sorted(waiting)},
                    "skipped": skipped, "size": len(batch)}  # fmt: skip
            if batch:
                yield pack_in_worker(self.collate_fn(batch)), meta

    def _map_batch(
        self,
        items: list[tuple[int, Any]],
        worker: int,
        num_workers: int,
        failures_in_a_row: int,
    ) -> tuple[list[Any], int, int]:
        positions = [count * num_workers + worker for count, _ in items]
        key = min(positions)
        mapped, skipped = [], 0
        for position, (_, element) in zip(positions, items):
            if self.mapper is None:
                mapped.append(element)
                continue
            with sample_context(self.seed, position, key):
                result = self.mapper.map_or_skip(element, f"element at position {position}")
            if result is None:
                skipped += 1
                failures_in_a_row += 1
                self.mapper.check_in_a_row(failures_in_a_row, f"position {position}", element)
            else:
                failures_in_a_row = 0
                mapped.append(result)
        return mapped, skipped, failures_in_a_row
