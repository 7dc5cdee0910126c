"""Mapping one record: its sample context (per-sample randomness) and what happens when it fails.

The loaders map every record inside :func:`sample_context`, keyed by (seed, global stream
position) of its sample, not by the worker or process that maps it, so what a mapper draws
from :func:`sample_rng` / :func:`sample_seed` is the same for any ``NUM_WORKERS`` and after a
resume; :func:`batch_rng` is keyed by the sample's batch (one scale per batch).
:class:`RecordMapper` is the one place a record is mapped (``MapDataset`` is a dataset view
over one). Entering a sample's context also seeds ``np.random`` and ``random`` from the same
key, so a project's own augmentations that draw from them are exactly resumable too; nothing
is restored on exit (a deterministic state either way).

Augmentations (:mod:`trainkit.data.transforms`) draw from :func:`augmentation_rng` (the
sample's generator in a loader, else one seeded from ``np.random``).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainkit.config import ConfigError
from trainkit.utils.errors import UsageError
from trainkit.utils.serialize import PicklableWrapper

logger = logging.getLogger(__name__)

__all__ = [
    "RecordMapper",
    "as_record_mapper",
    "augmentation_rng",
    "batch_rng",
    "check_max_failures",
    "sample_context",
    "sample_rng",
    "sample_seed",
    "seed_global_generators",
]

# Keep these generators apart from every other use of (seed, position) pairs.
_PERSONALIZATION = b"trainkit-sample"
_BATCH_PERSONALIZATION = b"trainkit-batch"
_GLOBAL_PERSONALIZATION = b"trainkit-global"


@dataclass
class _SampleKey:
    seed: int
    position: int
    # Inside another sample's context (a mapper mapping more records): its own generator,
    # so the outer sample's draws are not disturbed.
    nested: bool = False
    batch: int | None = None  # the sample's batch key (None: a batch of its own)
    generators: dict[str, np.random.Generator] = field(default_factory=dict)  # by kind

    def digest(self, batch: bool = False) -> bytes:
        """32 bytes of random material that depend only on (seed, position or batch)."""
        key = self.position if not batch or self.batch is None else self.batch
        # BLAKE2 rather than numpy's SeedSequence: the same quality of mixing at a fraction
        # of the cost, which a loader pays for every sample (~10 us per sample saved).
        person = _BATCH_PERSONALIZATION if batch else _PERSONALIZATION
        return hashlib.blake2b(
            f"{self.seed}:{key}".encode(), digest_size=32, person=person
        ).digest()


# One generator object per thread, re-seeded for every sample: building a new numpy
# Generator costs several times more than setting the state of an existing one.
_THREAD_GENERATORS = threading.local()


def _seeded_generator(digest: bytes, *, shared: str | None) -> np.random.Generator:
    """A generator in the state ``digest`` gives; ``shared`` names a reusable per-thread one."""
    generator = getattr(_THREAD_GENERATORS, shared, None) if shared else None
    if generator is None:
        generator = np.random.Generator(np.random.PCG64())
        if shared:
            setattr(_THREAD_GENERATORS, shared, generator)
    generator.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {
            "state": int.from_bytes(digest[:16], "little"),
            "inc": int.from_bytes(digest[16:], "little") | 1,  # PCG needs an odd increment
        },
        "has_uint32": 0,
        "uinteger": 0,
    }
    return generator


# A ContextVar rather than a plain global: correct under threads (pin-memory, user code).
_CURRENT: contextvars.ContextVar[_SampleKey | None] = contextvars.ContextVar(
    "trainkit_sample_key", default=None
)


class _SampleContext:
    """:func:`sample_context`'s: a class, as a ``contextlib`` generator costs µs per record."""

    __slots__ = ("_key", "_token")

    def __init__(self, key: _SampleKey) -> None:
        self._key = key
        self._token: contextvars.Token[_SampleKey | None] | None = None

    def __enter__(self) -> None:
        key = self._key
        key.nested = _CURRENT.get() is not None
        if not key.nested:  # a nested record continues the outer sample's global draws
            seed_global_generators(key.seed, key.position)
        self._token = _CURRENT.set(key)

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None


def sample_context(seed: int, position: int, batch: int | None = None) -> _SampleContext:
    """Make :func:`sample_rng` / :func:`sample_seed` answer for ``(seed, position)`` in ``with``.

    Args:
        seed: the loader's shared seed (>= 0).
        position: the sample's global stream position (>= 0).
        batch: a key the samples of one batch share (:func:`batch_rng`); ``None``: their own.

    Raises:
        ValueError: If ``seed`` or ``position`` is negative.
    """
    if seed < 0 or position < 0:
        raise ValueError(
            f"sample seed and position must be >= 0, got seed={seed}, position={position}"
        )
    batch = None if batch is None else int(batch)
    return _SampleContext(_SampleKey(int(seed), int(position), batch=batch))


def seed_global_generators(seed: int, position: int) -> None:
    """Seed ``np.random`` and ``random`` for the sample at ``(seed, position)``.

    :func:`sample_context` calls it for every record it maps (the cost per record is in
    the mapper benchmark, ``python -m benchmarks --task mapper``); other code need not.
    """
    digest = hashlib.blake2b(
        f"{seed}:{position}".encode(), digest_size=4, person=_GLOBAL_PERSONALIZATION
    ).digest()
    # 32-bit seeds: the cheapest for both (numpy's legacy seeding takes no more; Python's
    # seeding costs twice as much for 64 bits), and plenty to vary augmentations by record.
    value = int.from_bytes(digest[:4], "little")
    np.random.seed(value)
    random.seed(value)


def _current() -> _SampleKey:
    key = _CURRENT.get()
    if key is None:
        raise RuntimeError(
            "sample_rng()/sample_seed() can only be called inside a mapper run by a trainkit "
            "loader (or MapDataset); outside one there is no sample to key the randomness on. "
            "Use numpy.random.default_rng(seed) for randomness elsewhere."
        )
    return key


def sample_rng() -> np.random.Generator:
    """Return the generator of the sample being mapped, keyed by (seed, global position).

    Calls within one mapper call return the same generator, so successive draws continue one
    another; every new mapper call (a retry after a failed record too) starts afresh. The object
    is re-seeded for the thread's next sample: do not keep it beyond the mapper call.

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    return _generator("sample")


def batch_rng() -> np.random.Generator:
    """Return a generator that starts alike for every sample of the batch being mapped.

    Draws that must be equal across a batch come from it, e.g. one rescale factor per batch
    (grouped images then share their size: no padding). Like :func:`sample_rng` it continues
    within one mapper call and depends only on the seed and the batch; a sample mapped
    outside a batch (``MapDataset[i]``) is a batch of its own.

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    return _generator("batch")


def _generator(kind: str) -> np.random.Generator:
    key = _current()
    if kind not in key.generators:
        digest = key.digest(batch=kind == "batch")
        key.generators[kind] = _seeded_generator(digest, shared=None if key.nested else kind)
    return key.generators[kind]


def augmentation_rng() -> np.random.Generator:
    """Return the generator augmentations draw from: :func:`sample_rng` inside a loader.

    Outside a mapper call run by a loader (a predictor, a notebook, ``tools/visualize_data.py``)
    there is no sample to key on: each call then returns a new generator seeded from numpy's global
    one, so ``np.random.seed(s)`` beforehand makes the draws reproducible, and nothing raises.
    """
    if _CURRENT.get() is not None:
        return _generator("sample")
    return _seeded_generator(np.random.bytes(32), shared=None)


def sample_seed() -> int:
    """Return a 63-bit seed of the sample being mapped (e.g. for ``torch.Generator``).

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    # Hashed once more, so the seed is independent of the generator's starting state.
    digest = hashlib.blake2b(_current().digest(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


_RETRY_SALT = 0x7E7A11  # keys the choice of replacement records


def _retry_index(seed: int, key: int, attempt: int, size: int) -> int:
    # A pure function of (seed, failing sample, attempt): the replacement is the same
    # whichever loader worker or restart hits the failure, so the batches stay reproducible.
    seq = np.random.SeedSequence([seed, key, attempt, _RETRY_SALT])
    return int(seq.generate_state(1, dtype=np.uint64)[0] % size)


def _short_repr(obj: Any, limit: int = 200) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_max_failures(max_consecutive_failures: int) -> None:
    """Raise unless ``DATALOADER.MAX_CONSECUTIVE_FAILURES`` (or the argument) is positive.

    Raises:
        ConfigError: A ``ValueError`` naming the key.
    """
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
    unreadable file), except with a :class:`~trainkit.utils.errors.UsageError`: a mistake in
    the config or the inputs that other records would hit too, raised at once. Each failure
    is logged with the record and a running count; ``max_consecutive_failures`` in a row
    raise a ``RuntimeError`` naming the dataset and the last failing record. The function is
    pickled in a ``PicklableWrapper``, so spawned loader workers get it as it is.
    """

    def __init__(
        self,
        map_func: Callable[[Any], Any],
        *,
        max_consecutive_failures: int = 20,
        name: str = "dataset",
    ) -> None:
        """Hold ``map_func`` (record -> mapped element, or ``None`` to skip the record).

        ``max_consecutive_failures`` is ``DATALOADER.MAX_CONSECUTIVE_FAILURES`` (a
        ``ConfigError`` unless positive), ``name`` the dataset's name in messages.
        """
        check_max_failures(max_consecutive_failures)
        # Held bare and pickled wrapped (__getstate__): it is called for every record, and a
        # wrapper would add a call, in another module, to that path.
        self.map_func = map_func.wrapped if isinstance(map_func, PicklableWrapper) else map_func
        self.max_consecutive_failures, self.name = max_consecutive_failures, name
        self.num_failures = 0  # in this process: each loader worker counts its own

    def __getstate__(self) -> dict[str, Any]:
        # Spawned loader workers get the function by value (a lambda or a closure too).
        return {**self.__dict__, "map_func": PicklableWrapper(self.map_func)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.map_func = state["map_func"].wrapped

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
        """Map ``records[index]`` (unmapped) in the sample's context; replace it if it fails.

        The replacement is ``records[j]`` for ``j`` drawn from (seed, position, attempt): the
        same whichever worker maps it, and after a resume.

        Returns:
            ``(element, number of records that failed before it)``.

        Raises:
            RuntimeError: After ``max_consecutive_failures`` failed records in a row.
            UsageError: As soon as reading or mapping a record raises one.
        """
        record: Any = None
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
            failed, index = index, _retry_index(seed, position, attempt, len(records))
            then = f"; trying record {index} instead ({attempt + 1} consecutive failures)"
            reason = self._skipped(f"record {failed}", record, error, then)
        raise _too_many_failures(
            self.max_consecutive_failures, self.name, f"index {failed}", record, reason
        ) from error

    def _skipped(self, where: str, record: Any, error: BaseException | None, then: str) -> str:
        """Count and log a record that failed to map; return why it failed."""
        self.num_failures += 1
        reason = f"{type(error).__name__}: {error}" if error else "mapper returned None"
        logger.warning(
            "Skipping %s of %s %s (%s; %d in this process)%s",
            *(where, self.name, _short_repr(record, 160), reason, self.num_failures, then),
        )
        return reason

    def map_or_skip(self, record: Any, where: str) -> Any | None:
        """Map one record; return ``None`` (logged and counted) if it fails.

        The caller gives the sample's context and counts failures in a row
        (:meth:`check_in_a_row`). Raises a ``UsageError`` as soon as mapping raises one.
        """
        result, error = self._try(record)
        if result is None:
            self._skipped(where, record, error, "")
        return result

    def check_in_a_row(self, failures_in_a_row: int, where: str, record: Any) -> None:
        """Raise once ``failures_in_a_row`` reaches the limit (streams skip, never retry).

        Raises:
            RuntimeError: Naming the dataset and the last failing record.
        """
        if failures_in_a_row >= self.max_consecutive_failures:
            raise _too_many_failures(failures_in_a_row, self.name, where, record, "see the log")


def as_record_mapper(
    mapper: Callable[[Any], Any] | None,
    *,
    name: str = "dataset",
    max_consecutive_failures: int = 20,
) -> RecordMapper | None:
    """Return ``mapper`` as a :class:`RecordMapper` (one is used as it is; ``None`` stays).

    Raises:
        ConfigError: A ``ValueError``: if ``max_consecutive_failures`` is not positive.
    """
    if mapper is None or isinstance(mapper, RecordMapper):
        return mapper
    return RecordMapper(mapper, name=name, max_consecutive_failures=max_consecutive_failures)
