"""Batches of a stream dataset (an ``IterableDataset``), formed and mapped in the loader workers.

Of ``n`` loader workers (``n = 1`` without), worker ``w`` reads elements ``w, w + n, ...``
of the stream (a stream with ``shards_across_workers = True`` gives each worker its own
share), forms whole batches of them (grouped by the raw element's ``width``/``height`` in
:class:`~trainkit.data.plans.grouping.Buckets`), maps a batch at once (one ``batch_rng()``
key per batch; its ``c``-th element's ``sample_rng()`` position is ``c * n + w``) and
collates it. The loader returns the workers' batches in turn (:func:`batches_in_turn`), so
unlike the map-style path the batches depend on ``NUM_WORKERS``. A worker's position is its
count of elements read plus those waiting in its buckets, so a stream that can be read again
(from the start, or ``iter_from(position)``) resumes exactly with the same ``NUM_WORKERS``,
checked against its ``position_key()`` (``RankStream``) where it has one.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from trainkit.data.mapping.record_mapper import RecordMapper, sample_context
from trainkit.data.plans.grouping import BucketOf, Buckets
from trainkit.data.plans.loader_state import check_stream_workers, new_state

__all__ = ["StreamBatches", "batches_in_turn"]


class StreamBatches(IterableDataset):
    """The batches one loader worker (or the training process) forms from a stream dataset.

    ``stream`` yields raw elements; ``mapper`` (``None``: none) maps one, ``bucket_of`` gives
    its aspect-ratio bucket (``None``: no grouping), ``collate_fn`` turns the mapped elements
    into a batch (the loader's packs it) and ``seed`` keys ``sample_rng()`` / ``batch_rng()``.
    With ``drop_last``, what waits in a worker's buckets when a finite stream ends is dropped
    (else each bucket is one last batch). ``start``: the loader's position (``None``: start).
    """

    def __init__(
        self,
        stream: IterableDataset,
        mapper: RecordMapper | None,
        batch_size: int,
        *,
        bucket_of: BucketOf | None,
        collate_fn: Callable[[list[Any]], Any],
        seed: int,
        drop_last: bool = True,
        start: dict[str, Any] | None = None,
    ) -> None:
        self.stream, self.mapper, self.batch_size = stream, mapper, batch_size
        self.bucket_of, self.collate_fn, self.seed = bucket_of, collate_fn, seed
        self.drop_last, self.start = drop_last, start
        self.num_buckets = 1 if bucket_of is None else bucket_of.num_buckets

    def initial_state(self, num_workers: int) -> dict[str, Any]:
        """The loader's position before any batch, read by ``num_workers`` loader workers."""
        key = getattr(self.stream, "position_key", None)
        return new_state(
            "stream",
            source=key() if callable(key) else None,
            batch_size=self.batch_size,
            num_buckets=self.num_buckets,
            num_workers=num_workers,
        )

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        start = self.start or self.initial_state(num_workers)
        check_stream_workers(start, num_workers)  # a guard: the loader checked it on loading
        yield from self._batches(worker, num_workers, start["workers"][worker])
        # Tells the loader this worker has no more batches (a finite stream), so that it
        # stops waiting for this worker's turn.
        yield None, {"worker": worker, "end": True}

    def _worker_elements(self, worker: int, num_workers: int, first: int) -> Iterator[Any]:
        """This worker's elements, from its ``first``-th one."""
        step = 1 if getattr(self.stream, "shards_across_workers", False) else num_workers
        start = first if step == 1 else first * num_workers + worker
        if hasattr(self.stream, "iter_from"):
            return itertools.islice(self.stream.iter_from(start), 0, None, step)
        return itertools.islice(iter(self.stream), start, None, step)

    def _batches(
        self, worker: int, num_workers: int, state: dict[str, Any]
    ) -> Iterator[tuple[Any, dict[str, Any]]]:
        # Elements waiting in a bucket at the saved position are read again: count -> bucket.
        pending = {c: b for b, waiting in enumerate(state["buckets"]) for c, _ in waiting}
        first = min(pending, default=state["read"])
        buckets = Buckets(self.batch_size)
        self._failures_in_a_row = 0
        read = first
        for count, element in enumerate(self._worker_elements(worker, num_workers, first), first):
            read = count + 1
            if count < state["read"] and count not in pending:
                continue  # returned in a batch before the resume
            bucket = pending.pop(count, None)
            if bucket is None:
                bucket = self.bucket_of(element) if self.bucket_of is not None else 0
            items = buckets.add(bucket, (count, element))
            if items is not None:
                yield from self._mapped(items, buckets, read, worker, num_workers)
        if not self.drop_last:
            for items in buckets.rest():
                yield from self._mapped(items, buckets, read, worker, num_workers)

    def _mapped(
        self,
        items: list[tuple[int, Any]],
        buckets: Buckets,
        read: int,
        worker: int,
        num_workers: int,
    ) -> Iterator[tuple[Any, dict[str, Any]]]:
        """Map and collate a batch (if an element survives); send it with the worker's position."""
        positions = [count * num_workers + worker for count, _ in items]
        batch = []
        for position, (_, element) in zip(positions, items):
            if self.mapper is None:
                batch.append(element)
                continue
            with sample_context(self.seed, position, min(positions)):
                result = self.mapper.map_or_skip(element, f"element at position {position}")
            self._failures_in_a_row = 0 if result is not None else self._failures_in_a_row + 1
            self.mapper.check_in_a_row(self._failures_in_a_row, f"position {position}", element)
            if result is not None:
                batch.append(result)
        waiting = [
            [[c, c * num_workers + worker] for c, _ in buckets.waiting.get(b, ())]
            for b in range(self.num_buckets)
        ]
        state = {"read": read, "buckets": waiting}
        meta = {"worker": worker, "state": state, "skipped": len(items) - len(batch)}
        if batch:
            yield self.collate_fn(batch), meta


def batches_in_turn(
    batches: Iterable[tuple[Any, dict[str, Any]]], state: dict[str, Any]
) -> Iterator[tuple[Any, dict[str, Any], int]]:
    """Yield ``(batch, position after it, records skipped in it)`` in the workers' turns.

    ``batches`` are what the torch loader over :class:`StreamBatches` yields, ``state`` the
    loader's position before them. The torch loader asks its workers in turn from worker 0;
    the batches go on from the worker whose turn ``state`` says, so batches that come early
    wait here, and a worker whose stream ended loses its turns.
    """
    num_workers = state["num_workers"]
    waiting: list[collections.deque[tuple[Any, dict[str, Any]]]] = [
        collections.deque() for _ in range(num_workers)
    ]
    ended: set[int] = set()
    for batch, meta in itertools.chain(batches, [(None, None)]):
        finished = meta is None  # the torch loader is done: the waiting workers send nothing
        if not finished:
            waiting[meta["worker"]].append((batch, meta))
        while len(ended) < num_workers:
            turn = state["next_worker"]
            if turn in ended:
                state = {**state, "next_worker": (turn + 1) % num_workers}
                continue
            if not waiting[turn]:
                if not finished:
                    break
                ended.add(turn)
                continue
            ready, meta = waiting[turn].popleft()
            if meta.get("end"):
                ended.add(turn)
                continue
            workers = list(state["workers"])
            workers[turn] = meta["state"]
            state = {**state, "workers": workers, "next_worker": (turn + 1) % num_workers}
            yield ready, state, meta["skipped"]
