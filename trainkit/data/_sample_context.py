"""Per-sample randomness: a generator keyed by (seed, global stream position) of a sample.

The train loader wraps every mapper call in :func:`sample_context`; a mapper then calls
:func:`sample_rng` / :func:`sample_seed`. Because the key is the sample's place in the
global stream, not the worker or process that maps it, augmentation is the same for any
``NUM_WORKERS`` and after a resume.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = ["sample_context", "sample_rng", "sample_seed"]

_STREAM_SAMPLE = 0x5A3D1E  # keeps these seed sequences apart from the samplers' own


@dataclass
class _SampleKey:
    seed: int
    position: int
    rng: np.random.Generator | None = field(default=None)

    def seed_sequence(self) -> np.random.SeedSequence:
        return np.random.SeedSequence([self.seed, self.position, _STREAM_SAMPLE])


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
    token = _CURRENT.set(_SampleKey(int(seed), int(position)))
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
    one another; every new mapper call (including a retry after a failed record) starts a
    fresh generator.

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    key = _current()
    if key.rng is None:
        key.rng = np.random.Generator(np.random.PCG64(key.seed_sequence()))
    return key.rng


def sample_seed() -> int:
    """Return a 63-bit seed of the sample being mapped (e.g. for ``torch.Generator``).

    Raises:
        RuntimeError: If called outside a mapper call.
    """
    words = _current().seed_sequence().generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)
