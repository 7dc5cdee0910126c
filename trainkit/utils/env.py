"""Seeding, and capture/restore of the torch, numpy and Python RNG states (exact resume)."""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["TORCH_VERSION", "get_rng_state", "seed_all_rng", "set_rng_state"]

TORCH_VERSION: tuple[int, ...] = tuple(int(x) for x in torch.__version__.split(".")[:2])
"""torch's (major, minor) version, e.g. ``(2, 4)``, for comparisons like ``>= (1, 8)``."""


def seed_all_rng(seed: int | None = None) -> int:
    """Seed Python's, numpy's and torch's global generators.

    Args:
        seed: the seed; ``None`` draws one from the OS (and logs it so the run can be repeated).

    Returns:
        The seed that was used.
    """
    if seed is None or seed < 0:
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        logger.info("Using a random seed: %d (set SEED to it to repeat this run)", seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    random.seed(seed)
    return seed


def get_rng_state() -> dict[str, Any]:
    """Capture every global RNG state as tensors and plain containers.

    The result loads with ``torch.load(weights_only=True)``: numpy's state tuple is split
    into plain fields because its key array would otherwise be pickled as an ndarray.
    """
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states captured by :func:`get_rng_state`."""
    torch.set_rng_state(state["torch"])
    npst = state["numpy"]
    keys = npst["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (npst["name"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
