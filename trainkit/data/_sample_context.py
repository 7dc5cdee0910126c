"""Per-sample randomness: a generator keyed by (seed, global stream position) of a sample.

The train loader wraps every mapper call in :func:`sample_context`; a mapper then calls
:func:`sample_rng` / :func:`sample_seed`. Because the key is the sample's place in the
global stream, not the worker or process that maps it, augmentation is the same for any
``NUM_WORKERS`` and after a resume.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = ["sample_context", "sample_rng", "sample_seed"]

# Keeps these generators apart from every other use of (seed, position) pairs.
_PERSONALIZATION = b"trainkit-sample"


@dataclass
class _SampleKey:
    seed: int
    position: int
    # Inside another sample's context (a mapper mapping more records): gets its own
    # generator, so that the outer sample's draws are not disturbed.
    nested: bool = False
    rng: np.random.Generator | None = field(default=None)

    def digest(self) -> bytes:
        """32 bytes that depend only on (seed, position): the sample's random material."""
        # BLAKE2 rather than numpy's SeedSequence: the same quality of mixing at a fraction
        # of the cost, which a loader pays for every sample (~10 us per sample saved).
        return hashlib.blake2b(
            f"{self.seed}:{self.position}".encode(), digest_size=32, person=_PERSONALIZATION
        ).digest()


# One generator object per thread, re-seeded for every sample: building a new numpy
# Generator costs several times more than setting the state of an existing one.
_THREAD_GENERATORS = threading.local()


def _seeded_generator(digest: bytes, *, shared: bool) -> np.random.Generator:
    generator = getattr(_THREAD_GENERATORS, "generator", None) if shared else None
    if generator is None:
        generator = np.random.Generator(np.random.PCG64())
        if shared:
            _THREAD_GENERATORS.generator = generator
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
def sample_context(seed: int, position: int) -> Iterator[None]:
    """Make :func:`sample_rng` / :func:`sample_seed` answer for ``(seed, position)`` inside.

    Args:
        seed: the loader's shared seed (>= 0).
        position: the sample's global stream position (>= 0).
    """
    if seed < 0 or position < 0:
        raise ValueError(
            f"sample seed and position must be >= 0, got seed={seed}, position={position}"
        )
    nested = _CURRENT.get() is not None
    token = _CURRENT.set(_SampleKey(int(seed), int(position), nested=nested))
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
        key.rng = _seeded_generator(key.digest(), shared=not key.nested)
    return key.rng


def sample_seed() -> int:
    """Return a 63-bit seed of the sample being mapped (e.g. for ``torch.Generator``).

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    # Hashed once more, so the seed is independent of the generator's starting state.
    digest = hashlib.blake2b(_current().digest(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
