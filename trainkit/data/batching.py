"""Deterministic per-rank batches of indices, optionally grouped by aspect ratio.

This runs in the training process, before any sample is loaded: batch composition is
decided from the sampler stream and (when grouping) the records' ``width``/``height``. Loader
workers then load whole batches, so grouping costs no throughput and the batch stream does
not depend on the number of workers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from trainkit.config import ConfigError
from trainkit.data.samplers._base import StreamSampler
from trainkit.data.samplers.positions import global_position
from trainkit.utils import comm

__all__ = ["BatchIndexStream", "aspect_ratio_bucket_ids", "record_aspect_ratios"]

STATE_VERSION = 1


def record_aspect_ratios(records: Iterable[dict[str, Any]]) -> np.ndarray:
    """Return ``width / height`` of every record.

    Raises:
        ConfigError: A ``ValueError``: if a record lacks a positive ``width`` or ``height``.
    """
    ratios = []
    for i, record in enumerate(records):
        try:
            width, height = float(record["width"]), float(record["height"])
        except (KeyError, TypeError) as e:
            raise ConfigError(
                f"record {i} has no 'width'/'height' ({type(e).__name__}: {e}); aspect-ratio "
                "grouping needs them in every record. Add them, or set "
                "DATALOADER.ASPECT_RATIO_GROUPING False."
            ) from None
        if width <= 0 or height <= 0:
            raise ConfigError(
                f"record {i} has a non-positive size {width}x{height}; fix its 'width'/'height', "
                "or set DATALOADER.ASPECT_RATIO_GROUPING False."
            )
        ratios.append(width / height)
    return np.asarray(ratios, dtype=np.float64)


def aspect_ratio_bucket_ids(aspect_ratios: np.ndarray, bins: Sequence[float]) -> np.ndarray:
    """Return the bucket of each aspect ratio: ``i`` such that ``bins[i-1] <= ratio < bins[i]``.

    ``len(bins)`` increasing boundaries give ``len(bins) + 1`` buckets; ``[1.0]`` separates
    tall from wide images (a square one counts as wide).

    Raises:
        ConfigError: A ``ValueError``: if ``bins`` is empty, not strictly increasing, or not
            positive.
    """
    edges = np.asarray(list(bins), dtype=np.float64)
    if edges.size == 0 or (edges <= 0).any() or (np.diff(edges) <= 0).any():
        raise ConfigError(
            "DATALOADER.ASPECT_RATIO_BINS must be positive and strictly increasing, got "
            f"{list(bins)}; (1.0,) splits tall from wide images."
        )
    return np.searchsorted(edges, np.asarray(aspect_ratios, dtype=np.float64), side="right").astype(
        np.int16
    )


class BatchIndexStream:
    """Cut a rank's sampler stream into batches of ``(index, global position)`` pairs.

    Without ``bucket_ids`` a batch is the next ``batch_size`` draws. With them, each draw
    goes to its bucket and a bucket that reaches ``batch_size`` becomes the next batch, so
    a batch never mixes buckets. The state (draws so far, bucket contents, batches emitted)
    is plain data; loading it makes the stream continue with exactly the next batch.

    Positions assume a rank-strided sampler (rank ``r`` of ``W`` draws global positions
    ``r, r + W, ...``), which every trainkit training sampler is. A sampler that is not a
    trainkit sampler is restarted and fast-forwarded by drawing, not jumped. A finite
    sampler is drawn in passes (:meth:`next_pass_state`); positions keep growing from one
    pass to the next, so no two returned samples share one.
    """

    def __init__(
        self,
        sampler: Iterable[int],
        batch_size: int,
        *,
        bucket_ids: np.ndarray | None = None,
        drop_last: bool = True,
    ) -> None:
        """Create the stream.

        Args:
            sampler: yields this rank's dataset indices.
            batch_size: indices per batch on this rank.
            bucket_ids: bucket of each dataset index (see :func:`aspect_ratio_bucket_ids`).
            drop_last: at the end of a finite sampler, drop incomplete batches.
        """
        if batch_size < 1:
            raise ConfigError(
                f"batch size per rank must be >= 1, got {batch_size}; raise SOLVER.IMS_PER_BATCH."
            )
        self._sampler = sampler
        self._batch_size = batch_size
        self._bucket_ids = bucket_ids
        self._drop_last = drop_last
        is_stream = isinstance(sampler, StreamSampler)
        self._rank = sampler.rank if is_stream else comm.get_rank()
        self._world_size = sampler.world_size if is_stream else comm.get_world_size()
        num_buckets = 1 if bucket_ids is None else int(bucket_ids.max(initial=0)) + 1
        self._state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": "rank",
            "num_batches": 0,
            # Where iter(sampler) would start: 0, or the position its load_state_dict set.
            "num_drawn": sampler.start_position if is_stream else 0,
            "pass_offset": 0,  # draws of the finished passes of a finite sampler
            "sampler": sampler.state_dict() if is_stream else None,
            "batch_size": batch_size,
            "rank": self._rank,
            "world_size": self._world_size,
            "buckets": [[] for _ in range(num_buckets)],  # [[index, position], ...] per bucket
            "last_batch": [],  # [[index, position], ...] of the batch most recently emitted
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the state after the batches emitted so far (a deep, plain-data copy)."""
        state = dict(self._state)
        state["buckets"] = [[list(item) for item in bucket] for bucket in self._state["buckets"]]
        state["last_batch"] = [list(item) for item in self._state["last_batch"]]
        state["sampler"] = None if state["sampler"] is None else dict(state["sampler"])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches recorded in ``state``.

        Raises:
            ConfigError: A ``ValueError``: if the state was saved with another per-rank batch
                size or other aspect-ratio buckets (the config changed between runs).
            ValueError: If it was saved by another rank, world size or state version.
        """
        expected = {
            "version": STATE_VERSION,
            "rank": self._rank,
            "world_size": self._world_size,
            "batch_size": self._batch_size,
            "num_buckets": len(self._state["buckets"]),
        }
        if state.get("kind", "rank") != "rank":
            raise ConfigError(
                "this data loader state was saved by a loader that composes batches from the "
                "global stream (a trainkit training sampler); resume with that sampler."
            )
        found = {key: state.get(key) for key in expected}
        found["num_buckets"] = len(state.get("buckets", []))
        if found != expected:
            mismatch = (
                f"data loader state does not match this loader: saved {found}, this "
                f"loader is {expected}."
            )
            if any(found[key] != expected[key] for key in ("version", "rank", "world_size")):
                # Another rank's state (or one of another world size): a bug of the caller.
                raise ValueError(f"{mismatch} Each rank must load the state its own loader saved.")
            raise ConfigError(
                f"{mismatch} Resume with the SOLVER.IMS_PER_BATCH, SOLVER.ACCUMULATE_STEPS and "
                "DATALOADER.ASPECT_RATIO_BINS of the saved run, or start in a new OUTPUT_DIR."
            )
        self._state = {
            **state,
            "pass_offset": int(state.get("pass_offset", 0)),  # absent from older states
            "buckets": [[list(item) for item in bucket] for bucket in state["buckets"]],
            "last_batch": [list(item) for item in state.get("last_batch", [])],
        }

    def at_pass_start(self, state: dict[str, Any]) -> bool:
        """Return whether ``state`` is at the start of a pass (nothing drawn or waiting)."""
        return state["num_drawn"] == 0 and not any(state["buckets"])

    def next_pass_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Return the state that starts a finite sampler's next pass after ``state``.

        Elements still waiting in buckets are dropped, like the tail of a pass with
        ``drop_last``; the batch count and the global positions carry on.
        """
        return {
            **state,
            "pass_offset": int(state.get("pass_offset", 0)) + state["num_drawn"],
            "num_drawn": 0,
            "buckets": [[] for _ in state["buckets"]],
            "last_batch": [list(item) for item in state.get("last_batch", [])],
        }

    def batches_per_pass(self) -> int:
        """Return the number of batches in one pass over a finite, ungrouped sampler.

        Raises:
            TypeError: If the sampler is infinite or has no ``len()``, or when grouping
                (the count then depends on the order of the indices).
        """
        if isinstance(self._sampler, StreamSampler):
            raise TypeError(
                f"an infinite loader ({type(self._sampler).__name__}) has no len(); use a "
                "finite sampler such as InferenceSampler for a loader with a length"
            )
        if self._bucket_ids is not None:
            raise TypeError("len() of an aspect-ratio-grouped loader depends on the order")
        num_indices = len(self._sampler)  # type: ignore[arg-type]  # TypeError if unsized
        if self._drop_last:
            return num_indices // self._batch_size
        return -(-num_indices // self._batch_size)

    def _draws(self) -> Iterator[int]:
        num_drawn = self._state["num_drawn"]
        if isinstance(self._sampler, StreamSampler):
            saved = self._state["sampler"] or self._sampler.state_dict()
            self._sampler.load_state_dict({**saved, "num_drawn": num_drawn})
            return iter(self._sampler)
        return itertools.islice(iter(self._sampler), num_drawn, None)

    def __iter__(self) -> Iterator[tuple[list[list[int]], int, dict[str, Any]]]:
        """Yield ``(batch, batch key, state_after_batch)``; a batch is ``[index, position]`` pairs.

        The key (for ``batch_rng()``) is the batch's smallest stream position: unique among
        batches, and the same for any number of workers and after a resume.
        """
        state = self.state_dict()  # work on a copy: yielded states must not change later
        buckets = state["buckets"]
        num_drawn = state["num_drawn"]
        pass_offset = state["pass_offset"]
        for index in self._draws():
            position = global_position(pass_offset + num_drawn, self._rank, self._world_size)
            num_drawn += 1
            bucket = buckets[0 if self._bucket_ids is None else int(self._bucket_ids[index])]
            bucket.append([int(index), position])
            if len(bucket) == self._batch_size:
                yield self._emit(state, bucket, num_drawn)
        if not self._drop_last:
            for bucket in buckets:
                if bucket:
                    yield self._emit(state, bucket, num_drawn)

    def _emit(
        self, state: dict[str, Any], bucket: list[list[int]], num_drawn: int
    ) -> tuple[list[list[int]], int, dict[str, Any]]:
        batch = bucket[:]
        bucket.clear()
        state["num_batches"] += 1
        state["num_drawn"] = num_drawn
        state["last_batch"] = batch
        if isinstance(self._sampler, StreamSampler):
            state["sampler"] = self._sampler.state_dict()
        self._state = state
        return batch, min(position for _, position in batch), self.state_dict()
