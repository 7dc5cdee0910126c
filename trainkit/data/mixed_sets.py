"""Mixing the ``DATASETS.TRAIN`` sets by ``DATASETS.TRAIN_WEIGHTS``: the checks and the sets.

What is mixed and how (each step's exact share of every set) is
:mod:`trainkit.data.samplers.mixed` and :mod:`trainkit.data.mixed_plan`; this module reads
the config: it checks the keys before any data is loaded, loads each set on its own (its
size must be known) and builds the sampler.

Supported: map-style sets (record lists, ``MetaFileDataset``, any sized ``Dataset``) with
``DATALOADER.SAMPLER_TRAIN "TrainingSampler"``. A stream dataset (an ``IterableDataset``, a
``RankDataset``) yields its own order, so no step can be given its share of it; the
repeat-factor and random-subset samplers reweight records inside one stream. Either is a
``ConfigError`` with weights, not a silently different mix.
"""

from __future__ import annotations

import logging

from torch.utils.data import ConcatDataset, IterableDataset

from trainkit.config import CfgNode, ConfigError
from trainkit.data.catalog import load_catalog_dataset
from trainkit.data.samplers.mixed import MixedTrainingSampler, mix_weights

logger = logging.getLogger(__name__)

__all__ = ["check_mix_config", "mixed_sets"]


def check_mix_config(cfg: CfgNode) -> None:
    """Check ``DATASETS.TRAIN_WEIGHTS`` against ``DATASETS.TRAIN`` and the sampler, without data.

    Raises:
        ConfigError: A ``ValueError``: for a wrong number of weights, a weight that is not
            positive, or a sampler other than ``TrainingSampler``.
    """
    mix_weights(cfg.DATASETS.TRAIN_WEIGHTS, _train_names(cfg))
    sampler = cfg.DATALOADER.SAMPLER_TRAIN
    if sampler != "TrainingSampler":
        raise ConfigError(
            f"DATASETS.TRAIN_WEIGHTS mixes the training sets with one TrainingSampler per set; "
            f"DATALOADER.SAMPLER_TRAIN {sampler!r} cannot be mixed: set it to "
            "'TrainingSampler', or DATASETS.TRAIN_WEIGHTS () to concatenate the sets."
        )


def mixed_sets(
    cfg: CfgNode, seed: int, *, rank: int | None = None, world_size: int | None = None
) -> tuple[ConcatDataset, MixedTrainingSampler]:
    """Return the ``DATASETS.TRAIN`` sets, concatenated, and the sampler that mixes them.

    Each set is loaded on its own (one shared copy per machine each), so its size is known.

    Args:
        cfg: the config (checked by :func:`check_mix_config`).
        seed: the run's data seed, shared by all ranks.
        rank, world_size: whose share the sampler yields (default: this process's).

    Returns:
        The sets as one dataset (set ``i``'s records after set ``i - 1``'s) and the
        :class:`~trainkit.data.samplers.mixed.MixedTrainingSampler` over them.

    Raises:
        ConfigError: A ``ValueError``: for a stream dataset, or as the catalog loading does.
    """
    names = _train_names(cfg)
    parts = []
    for name in names:
        part = load_catalog_dataset(name, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
        if isinstance(part, IterableDataset) or callable(getattr(part, "as_stream", None)):
            raise ConfigError(
                f"DATASETS.TRAIN_WEIGHTS mixes map-style datasets only; {name!r} is a stream "
                f"dataset ({type(part).__name__}): set DATASETS.TRAIN_WEIGHTS () to chain "
                "streams, or register the set as records."
            )
        parts.append(part)
    dataset = ConcatDataset(parts)
    sampler = mixed_sampler(cfg, dataset, seed, rank=rank, world_size=world_size)
    logger.info(
        "Mixing %s by weights %s (per step of %d records: %s, ...)",
        names,
        sampler.weights,
        cfg.SOLVER.IMS_PER_BATCH,
        sampler.counts(cfg.SOLVER.IMS_PER_BATCH, 0, [0] * len(parts)),
    )
    return dataset, sampler


def mixed_sampler(
    cfg: CfgNode,
    dataset: ConcatDataset,
    seed: int,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> MixedTrainingSampler:
    """Return the sampler that mixes the sets of ``dataset`` (what :func:`mixed_sets` loaded).

    Args:
        cfg: the config (checked by :func:`check_mix_config`).
        dataset: the ``DATASETS.TRAIN`` sets, in their order, concatenated.
        seed: the run's data seed, shared by all ranks.
        rank, world_size: whose share the sampler yields (default: this process's).
    """
    sizes = [len(part) for part in dataset.datasets]
    names = _train_names(cfg)
    return MixedTrainingSampler(
        sizes, cfg.DATASETS.TRAIN_WEIGHTS, seed, names=names, rank=rank, world_size=world_size
    )


def _train_names(cfg: CfgNode) -> list[str]:
    train = cfg.DATASETS.TRAIN
    return [train] if isinstance(train, str) else list(train)
