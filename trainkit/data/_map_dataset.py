"""Mapping records, and what happens when one fails: ``RecordMapper`` and ``MapDataset``.

:class:`RecordMapper` is the one place a record is mapped: inside its sample context, with a
failed record (``None`` or an exception) logged, counted, and either replaced by another one
chosen from (seed, position, attempt) — training — or skipped — evaluation and streams.
:class:`MapDataset` (detectron2's name, exported as ``trainkit.data.common.MapDataset``) is a
dataset view over one. The loaders take a ``MapDataset`` apart into its records and its
``RecordMapper`` once, when they are built.
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

__all__ = ["MapDataset", "RecordMapper"]

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


class RecordMapper:
    """Map records with a user function, handling the records that fail to map.

    A record fails when ``map_func`` returns ``None`` or raises (e.g. ``OSError`` for an
    unreadable file), except with a :class:`~trainkit.utils.errors.UsageError`: that is a
    mistake in the config or the inputs that another record would hit as well, so it is
    raised at once. Each failure is logged with the record and a running count; after
    ``max_consecutive_failures`` in a row a ``RuntimeError`` names the dataset and the last
    failing record. Picklable (the function is held in a ``PicklableWrapper``), so it goes
    to spawned loader workers as it is.
    """

    def __init__(
        self,
        map_func: Callable[[Any], Any],
        *,
        max_consecutive_failures: int = 20,
        name: str = "dataset",
    ) -> None:
        """Hold ``map_func``.

        Args:
            map_func: record -> mapped element, or ``None`` to skip the record.
            max_consecutive_failures: failures in a row before giving up
                (``DATALOADER.MAX_CONSECUTIVE_FAILURES``).
            name: the dataset's name in messages.

        Raises:
            ConfigError: A ``ValueError``: if ``max_consecutive_failures`` is not positive.
        """
        _check_max_failures(max_consecutive_failures)
        self.map_func = PicklableWrapper(map_func)
        self.max_consecutive_failures = max_consecutive_failures
        self.name = name
        self.num_failures = 0  # in this process: each loader worker counts its own

    def _try(self, record: Any) -> tuple[Any, BaseException | None]:
        try:
            return self.map_func(record), None
        except UsageError:
            raise  # the user's mistake: retrying other records would only hide it
        except Exception as e:  # any other error counts as an unreadable record
            return None, e

    def map_replacing(
        self, records: Any, index: int, *, seed: int, position: int, batch: int | None = None
    ) -> tuple[Any, int]:
        """Map ``records[index]`` for the sample at ``position``; replace it if it fails.

        The replacement is ``records[j]`` for ``j`` drawn from (seed, position, attempt): the
        same whichever worker maps it, and after a resume.

        Args:
            records: a map-style dataset of unmapped records.
            index: the record to map.
            seed: the stream's seed (keys ``sample_rng()`` and the replacements).
            position: the sample's global stream position.
            batch: the sample's batch key for ``batch_rng()``.

        Returns:
            ``(element, number of records that failed before it)``.

        Raises:
            RuntimeError: After ``max_consecutive_failures`` failed records in a row.
            UsageError: As soon as reading or mapping a record raises one.
        """
        record: Any = None
        reason = ""
        error: BaseException | None = None
        for attempt in range(self.max_consecutive_failures):
            with sample_context(seed, position, batch):
                try:
                    record = records[index]  # reading the record may fail too
                except UsageError:
                    raise
                except Exception as e:
                    result, error = None, e
                else:
                    result, error = self._try(record)
            if result is not None:
                return result, attempt
            self.num_failures += 1
            reason = _failure_reason(error)
            failed = index
            index = _retry_index(seed, position, attempt, len(records))
            logger.warning(
                "Skipping record %d of %s %s (%s); trying record %d instead "
                "(%d consecutive failures, %d in this process)",
                failed,
                self.name,
                _short_repr(record, 160),
                reason,
                index,
                attempt + 1,
                self.num_failures,
            )
        raise _too_many_failures(
            self.max_consecutive_failures, self.name, f"index {failed}", record, reason
        ) from error

    def map_or_skip(self, record: Any, where: str) -> Any | None:
        """Map one record; return ``None`` (logged and counted) if it fails.

        The caller runs it inside the sample's context and tracks failures in a row with
        :meth:`check_in_a_row`.

        Raises:
            UsageError: As soon as mapping raises one.
        """
        result, error = self._try(record)
        if result is None:
            self.num_failures += 1
            logger.warning(
                "Skipping %s of %s %s (%s; %d in this process)",
                where,
                self.name,
                _short_repr(record, 160),
                _failure_reason(error),
                self.num_failures,
            )
        return result

    def check_in_a_row(self, failures_in_a_row: int, where: str, record: Any) -> None:
        """Raise once ``failures_in_a_row`` reaches the limit (streams skip, never retry).

        Raises:
            RuntimeError: Naming the dataset and the last failing record.
        """
        if failures_in_a_row >= self.max_consecutive_failures:
            raise _too_many_failures(failures_in_a_row, self.name, where, record, "see the log")


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
        self.dataset = dataset
        self.mapper = RecordMapper(
            map_func,
            max_consecutive_failures=max_consecutive_failures,
            name=name or type(dataset).__name__,
        )

    @property
    def _map_func(self) -> Callable[[Any], Any]:
        # detectron2's attribute name for the mapping function.
        return self.mapper.map_func

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def num_failures(self) -> int:
        """Records that failed in this process so far (each loader worker counts its own)."""
        return self.mapper.num_failures

    def __getitem__(self, idx: int) -> Any:
        return self.map_at(idx, seed=0, position=idx)

    def map_at(self, idx: int, *, seed: int, position: int, batch: int | None = None) -> Any:
        """Map record ``idx`` for the sample at global stream ``position`` of stream ``seed``.

        ``batch`` identifies the sample's batch for ``trainkit.data.batch_rng()``. A failed
        record is replaced (see :meth:`RecordMapper.map_replacing`).

        Raises:
            RuntimeError: After ``max_consecutive_failures`` failed records in a row.
            UsageError: As soon as reading or mapping a record raises one.
        """
        element, _ = self.mapper.map_replacing(
            self.dataset, idx, seed=seed, position=position, batch=batch
        )
        return element


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
        self.dataset = dataset
        self.mapper = RecordMapper(
            map_func,
            max_consecutive_failures=max_consecutive_failures,
            name=name or type(dataset).__name__,
        )

    def __len__(self) -> int:
        # An upper bound when elements fail, as in detectron2; TypeError if unsized.
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def num_failures(self) -> int:
        """Elements that failed in this process so far."""
        return self.mapper.num_failures

    def __iter__(self) -> Iterator[Any]:
        failures_in_a_row = 0
        for ordinal, element in enumerate(self.dataset):
            result = self.mapper.map_or_skip(element, f"element {ordinal}")
            if result is not None:
                failures_in_a_row = 0
                yield result
                continue
            failures_in_a_row += 1
            self.mapper.check_in_a_row(failures_in_a_row, f"element {ordinal}", element)
