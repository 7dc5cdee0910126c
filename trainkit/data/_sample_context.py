"""Per-sample randomness: a generator keyed by (seed, global stream position) of a sample.

The train loader wraps every mapper call in :func:`sample_context`; a mapper then calls
:func:`sample_rng` / :func:`sample_seed`. Because the key is the sample's place in the
global stream, not the worker or process that maps it, augmentation is the same for any
``NUM_WORKERS`` and after a resume. :func:`batch_rng` is keyed by the batch the sample
belongs to instead, for draws every sample of a batch must share (one scale per batch).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = ["batch_rng", "sample_context", "sample_rng", "sample_seed"]

# Keep these generators apart from every other use of (seed, position) pairs.
_PERSONALIZATION = b"trainkit-sample"
_BATCH_PERSONALIZATION = b"trainkit-batch"


@dataclass
class _SampleKey:
    seed: int
    position: int
    # Inside another sample's context (a mapper mapping more records): gets its own
    # generator, so that the outer sample's draws are not disturbed.
    nested: bool = False
    # Identifies the sample's batch (the loader uses its smallest stream position); None
    # outside a batch, where a sample is a batch of its own.
    batch: int | None = None
    rng: np.random.Generator | None = field(default=None)
    batch_rng: np.random.Generator | None = field(default=None)

    def digest(self) -> bytes:
        """32 bytes that depend only on (seed, position): the sample's random material."""
        return _digest(self.seed, self.position, _PERSONALIZATION)

    def batch_digest(self) -> bytes:
        """32 bytes that depend only on (seed, batch): the batch's random material."""
        batch = self.position if self.batch is None else self.batch
        return _digest(self.seed, batch, _BATCH_PERSONALIZATION)


def _digest(seed: int, key: int, person: bytes) -> bytes:
    # BLAKE2 rather than numpy's SeedSequence: the same quality of mixing at a fraction of
    # the cost, which a loader pays for every sample (~10 us per sample saved).
    return hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=32, person=person).digest()


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


@contextlib.contextmanager
def sample_context(seed: int, position: int, batch: int | None = None) -> Iterator[None]:
    """Make :func:`sample_rng` / :func:`sample_seed` answer for ``(seed, position)`` inside.

    Args:
        seed: the loader's shared seed (>= 0).
        position: the sample's global stream position (>= 0).
        batch: a key shared by the samples of one batch, for :func:`batch_rng`; ``None``
            makes the sample a batch of its own.
    """
    if seed < 0 or position < 0:
        raise ValueError(
            f"sample seed and position must be >= 0, got seed={seed}, position={position}"
        )
    nested = _CURRENT.get() is not None
    batch = None if batch is None else int(batch)
    token = _CURRENT.set(_SampleKey(int(seed), int(position), nested=nested, batch=batch))
    try:
        yield
    finally:
        _CURRENT.reset(token)


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
    """Return the generator of the sample being mapped, keyed by (seed, stream position).

    Calls within one mapper call return the same generator, so successive draws continue
    one another; every new mapper call (including a retry after a failed record) starts
    afresh. The generator object is reused (re-seeded) for the next sample of the thread,
    so do not keep it beyond the mapper call.

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    key = _current()
    if key.rng is None:
        key.rng = _seeded_generator(key.digest(), shared=None if key.nested else "sample")
    return key.rng


def batch_rng() -> np.random.Generator:
    """Return a generator that starts alike for every sample of the batch being mapped.

    Draws that must be equal across a batch come from it: e.g. one rescale factor per
    batch, so that images grouped by aspect ratio also share their size and need no
    padding. Like :func:`sample_rng`, successive calls within one mapper call continue one
    another, and it depends only on the seed and the batch, not on workers or resumes. A
    sample mapped outside a batch (``MapDataset[i]``) is a batch of its own.

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    key = _current()
    if key.batch_rng is None:
        key.batch_rng = _seeded_generator(
            key.batch_digest(), shared=None if key.nested else "batch"
        )
    return key.batch_rng


def sample_seed() -> int:
    """Return a 63-bit seed of the sample being mapped (e.g. for ``torch.Generator``).

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    # Hashed once more, so the seed is independent of the generator's starting state.
    digest = hashlib.blake2b(_current().digest(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
