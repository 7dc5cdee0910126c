"""A keyed pseudo-random permutation of ``range(n)`` that is computed, never stored.

:func:`permute` maps each offset through a Feistel network over the smallest power of two
>= n (a bijection whatever its round function), re-applying it to values outside
``range(n)`` ("cycle walking", fewer than two passes on average: the domain is < 2n). So
every epoch is an exact permutation, memory stays O(block) and any position is reached in
O(1). The round function is the splitmix64 finaliser, on numpy uint64 arrays (which wrap
on overflow without warnings, unlike numpy scalars: everything here stays an array).
"""

from __future__ import annotations

import numpy as np

NUM_ROUNDS = 6  # Luby-Rackoff needs >= 4 for a strong PRP; 2 more for the tiny unbalanced halves

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

# Purpose tags keep the keys of different uses of one seed independent.
PURPOSE_SHUFFLE = 1
PURPOSE_SUBSET = 2
PURPOSE_REPEAT = 3
PURPOSE_RANK_SHARES = 4
PURPOSE_MIX = 5  # the seed of each mixed training set's stream


def _mix64(values: np.ndarray) -> np.ndarray:
    z = values + _GOLDEN
    z = (z ^ (z >> _S30)) * _MUL1
    z = (z ^ (z >> _S27)) * _MUL2
    return z ^ (z >> _S31)


def round_keys(seed: int, purpose: int, epochs: np.ndarray) -> np.ndarray:
    """Return the Feistel round keys for each epoch, shape ``(NUM_ROUNDS, len(epochs))``.

    ``seed`` is any Python int (reduced to 64 bits), ``purpose`` a ``PURPOSE_*`` tag (so that,
    e.g., subset and shuffle keys differ), ``epochs`` int64 epoch numbers.
    """
    base = _mix64(np.array([(seed & _MASK64) ^ ((purpose << 56) & _MASK64)], dtype=np.uint64))
    k = _mix64(np.asarray(epochs, dtype=np.int64).astype(np.uint64) ^ base)
    keys = np.empty((NUM_ROUNDS, k.shape[0]), dtype=np.uint64)
    for i in range(NUM_ROUNDS):
        k = _mix64(k)
        keys[i] = k
    return keys


def _feistel(x: np.ndarray, left_bits: int, right_bits: int, keys: np.ndarray) -> np.ndarray:
    # Unbalanced Feistel: (L, R) -> (R, L ^ F(R)); the half widths swap every round, which
    # lets the domain be any power of two, not only even ones.
    for r in range(NUM_ROUNDS):
        left = x >> np.uint64(right_bits)
        right = x & np.uint64((1 << right_bits) - 1)
        mixed = _mix64(right ^ keys[r]) & np.uint64((1 << left_bits) - 1)
        x = (right << np.uint64(left_bits)) | (left ^ mixed)
        left_bits, right_bits = right_bits, left_bits
    return x


def permute(offsets: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Map int64 ``offsets`` (in ``range(n)``) through the permutation ``keys`` selects.

    ``keys`` is :func:`round_keys`' output with one column (shared) or one per offset. For a
    fixed key, ``permute(arange(n))`` is a permutation of ``range(n)``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(offsets)
    bits = max(2, (n - 1).bit_length())
    left_bits, right_bits = bits // 2, bits - bits // 2
    per_element = keys.shape[1] > 1
    y = _feistel(offsets.astype(np.uint64), left_bits, right_bits, keys)
    pending = np.flatnonzero(y >= np.uint64(n))
    while pending.size:
        sub_keys = keys[:, pending] if per_element else keys
        y[pending] = _feistel(y[pending], left_bits, right_bits, sub_keys)
        pending = pending[y[pending] >= np.uint64(n)]
    return y.astype(np.int64)
