"""How a loader's workers start: forked, seeded, and with the training process's heap frozen.

:func:`loader_kwargs` gives every trainkit loader its workers' arguments, :func:`start_iterator`
starts them. How a batch travels back from a worker is :mod:`trainkit.data.loading.loader`'s.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from trainkit.utils.env import seed_all_rng

__all__ = ["loader_kwargs", "start_iterator", "worker_context_kwargs", "worker_init_reset_seed"]


def worker_context_kwargs() -> dict[str, Any]:
    """Return the DataLoader arguments that make loader workers fork where possible.

    Ranks started by ``launch()`` inherit the "spawn" start method; spawned workers would re-import
    torch (over a second each), need picklable mappers, and could not share ``DatasetFromList``'s
    buffers copy-on-write. Loader workers never touch CUDA: forking them is safe.
    """
    return {"multiprocessing_context": "fork"} if "fork" in mp.get_all_start_methods() else {}


def worker_init_reset_seed(worker_id: int) -> None:
    """Seed Python, numpy and torch in a loader worker from torch's per-worker seed.

    Mappers should prefer :func:`trainkit.data.sample_rng`, which does not depend on the
    worker; this only keeps code that uses the global generators from repeating itself.
    """
    seed_all_rng(torch.initial_seed() % 2**31 + worker_id)


def start_iterator(loader: DataLoader) -> Iterator[Any]:
    """Return ``iter(loader)``, with the objects alive now frozen while its workers fork.

    A forked worker shares this process's memory copy-on-write, but its first full garbage
    collection walks every object it inherited, copying the pages of nearly the whole heap
    into each worker (tens of MiB, ~0.2 s). The workers' collector skips frozen objects; this
    process unfreezes them as soon as the workers exist, so its own collections are
    unchanged. Objects the caller froze (``gc.get_freeze_count()``) stay as they are.
    """
    if gc.get_freeze_count():
        return iter(loader)
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def loader_kwargs(kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Return the ``DataLoader`` arguments of a trainkit loader, ``kwargs`` winning.

    Without workers, the arguments torch then refuses are dropped. The workers' base seed
    comes from a private generator seeded with ``seed``: otherwise every new iterator draws
    it from the global torch RNG, which would shift the training process's random numbers on
    resume (and evaluating during training would shift them too).
    """
    kwargs = dict(kwargs)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)  # torch refuses it without workers
        kwargs["persistent_workers"] = False
    else:
        kwargs = {**worker_context_kwargs(), **kwargs}
    kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
    kwargs.setdefault("worker_init_fn", worker_init_reset_seed)
    return kwargs
