"""``MapDataset``: apply a mapper to every record, skipping records that fail to map.

Exported as :class:`trainkit.data.common.MapDataset` (detectron2's import path).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from trainkit.config import ConfigError
from trainkit.data._sample_context import sample_context
from trainkit.utils.errors import UsageError
from trainkit.utils.serialize import PicklableWrapper

logger = logging.getLogger(__name__)

__all__ = ["MapDataset"]

_RETRY_SALT = 0x7E7A11  # keys the choice of replacement records


def _retry_index(seed: int, key: int, attempt: int, size: int) -> int:
    # A pure function of (seed, failing sample, attempt): the replacement is the same
    # whichever worker or restart hits the failure, so the stream stays reproducible.
    seq = np.random.SeedSequence([seed, key, attempt, _RETRY_SALT])
    return int(seq.generate_state(1, dtype=np.uint64)[0] % size)


def _short_repr(obj: Any, limit: int = 200) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failure_reason(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {error}" if error else "mapper returned None"


def _check_max_failures(max_consecutive_failures: int) -> None:
    if max_consecutive_failures < 1:
        raise ConfigError(
            f"DATALOADER.MAX_CONSECUTIVE_FAILURES must be >= 1, got {max_consecutive_failures}"
        )


def _too_many_failures(count: int, name: str, where: str, record: Any, reason: str) -> RuntimeError:
    return RuntimeError(
        f"{count} records of dataset {name!r} failed to load in a row; the last was {where}: "
        f"{_short_repr(record)} ({reason}). Check the files and the mapper, or raise "
        "DATALOADER.MAX_CONSECUTIVE_FAILURES."
    )


class MapDataset(Dataset):
    """Apply ``map_func`` to each record of a dataset, skipping records that fail.

    A record fails when ``map_func`` returns ``None`` or raises (e.g. ``OSError`` for an
    unreadable file), except with a :class:`~trainkit.utils.errors.UsageError`: that is a
    mistake in the config or the inputs that another record would hit as well (a setting out of
    range, a missing metadata file), so it is raised at once. The failure is logged with the
    index and a running count. For a map-style dataset a replacement index is tried, chosen
    deterministically from (seed, sample, attempt); after ``max_consecutive_failures`` failures
    in a row for one sample it raises ``RuntimeError`` naming the dataset and the last failing
    record.

    Given an ``IterableDataset``, the result is an iterable dataset too (an instance of a
    private subclass of ``IterableDataset``, not of this class, as in detectron2) that maps
    each element and skips the ones that fail.

    Every ``map_func`` call on a map-style dataset runs inside a sample context, so
    ``trainkit.data.sample_rng()`` works in the mapper: the train loader keys it by the
    global stream position; a plain ``dataset[i]`` keys it by ``i`` (seed 0). Iterable
    datasets have no stream position, so their mappers cannot call it.

    ``map_func`` is held in a :class:`~trainkit.utils.serialize.PicklableWrapper`: a lambda
    works with loader workers started by "spawn".
    """

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> Any:
        # Unpickling calls cls.__new__(cls) without arguments: dataset is None then.
        if isinstance(dataset, IterableDataset):
            return _MapIterableDataset(dataset, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        dataset: Dataset | Sequence[Any],
        map_func: Callable[[Any], Any],
        *,
        max_consecutive_failures: int = 20,
        name: str | None = None,
    ) -> None:
        """Wrap ``dataset``.

        Args:
            dataset: a map-style dataset (or list) of records, or an ``IterableDataset``.
            map_func: record -> mapped sample, or ``None`` to skip the record.
            max_consecutive_failures: failures in a row before giving up
                (``DATALOADER.MAX_CONSECUTIVE_FAILURES``).
            name: dataset name used in messages (default: the dataset's class name).

        Raises:
            ConfigError: A ``ValueError``: if ``max_consecutive_failures`` is not positive.
        """
        _check_max_failures(max_consecutive_failures)
        self.dataset = dataset
        self._map_func = PicklableWrapper(map_func)
        self._max_failures = max_consecutive_failures
        self._name = name or type(dataset).__name__
        self._num_failures_total = 0  # per process: each worker counts its own

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def num_failures(self) -> int:
        """Records that failed in this process so far (each loader worker counts its own)."""
        return self._num_failures_total

    def __getitem__(self, idx: int) -> Any:
        return self.map_at(idx, seed=0, position=idx)

    def map_at(self, idx: int, *, seed: int, position: int, batch: int | None = None) -> Any:
        """Map record ``idx`` for the sample at global stream ``position`` of stream ``seed``.

        ``batch`` identifies the sample's batch for ``trainkit.data.batch_rng()``.

        Raises:
            RuntimeError: After ``max_consecutive_failures`` failed records in a row.
            UsageError: As soon as reading or mapping a record raises one.
        """
        last_error: BaseException | None = None
        for attempt in range(self._max_failures):
            record = None
            try:
                record = self.dataset[idx]  # reading the record may fail too
                with sample_context(seed, position, batch):
                    result = self._map_func(record)
            except UsageError:
                raise  # the user's mistake: retrying other records would only hide it
            except Exception as e:  # any other mapper error counts as an unreadable record
                result, last_error = None, e
            if result is not None:
                return result
            self._num_failures_total += 1
            reason = _failure_reason(last_error)
            failed_idx = idx
            idx = _retry_index(seed, position, attempt, len(self.dataset))
            logger.warning(
                "Skipping record %d of %s %s (%s); trying record %d instead "
                "(%d consecutive failures, %d in this process)",
                failed_idx,
                self._name,
                _short_repr(record, 160),
                reason,
                idx,
                attempt + 1,
                self._num_failures_total,
            )
        raise _too_many_failures(
            self._max_failures, self._name, f"index {failed_idx}", record, reason
        ) from last_error


class _MapIterableDataset(IterableDataset):
    """An iterable dataset that maps each element and skips those that fail to map.

    Built by ``MapDataset(iterable_dataset, map_func)``. Like the map-style version it
    treats ``None`` and exceptions as failures, logs each one, and raises after
    ``max_consecutive_failures`` in a row; a ``UsageError`` is raised at once.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        map_func: Callable[[Any], Any],
        *,
        max_consecutive_failures: int = 20,
        name: str | None = None,
    ) -> None:
        _check_max_failures(max_consecutive_failures)
        self.dataset = dataset
        self._map_func = PicklableWrapper(map_func)
        self._max_failures = max_consecutive_failures
        self._name = name or type(dataset).__name__
        self._num_failures_total = 0

    def __len__(self) -> int:
        # An upper bound when elements fail, as in detectron2; TypeError if unsized.
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def num_failures(self) -> int:
        """Elements that failed in this process so far."""
        return self._num_failures_total

    def __iter__(self) -> Iterator[Any]:
        failures_in_a_row = 0
        for ordinal, element in enumerate(self.dataset):
            error: BaseException | None = None
            try:
                result = self._map_func(element)
            except UsageError:
                raise  # the user's mistake: skipping elements would only hide it
            except Exception as e:  # any other mapper error counts as an unreadable element
                result, error = None, e
            if result is not None:
                failures_in_a_row = 0
                yield result
                continue
            failures_in_a_row += 1
            self._num_failures_total += 1
            reason = _failure_reason(error)
            logger.warning(
                "Skipping element %d of %s %s (%s; %d consecutive failures, %d in this process)",
                ordinal,
                self._name,
                _short_repr(element, 160),
                reason,
                failures_in_a_row,
                self._num_failures_total,
            )
            if failures_in_a_row >= self._max_failures:
                raise _too_many_failures(
                    failures_in_a_row, self._name, f"element {ordinal}", element, reason
                ) from error
