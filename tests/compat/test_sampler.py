"""A detectron2 user's sampler code behaves the same with trainkit's imports.

Mirrors the behaviours detectron2's tests/data/test_sampler.py checks (grouped batches,
sampler determinism through ToIterableDataset and loader workers, the seed of a sampler
built without one, repeat factors, inference shards), written against trainkit's names.
"""

import itertools
import math
import operator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from trainkit.data.build import worker_init_reset_seed
from trainkit.data.common import DatasetFromList, ToIterableDataset
from trainkit.data.samplers import (
    GroupedBatchSampler,
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.utils.env import seed_all_rng


def first(iterable, n):
    return list(itertools.islice(iterable, n))


# --------------------------------------------------------------------- GroupedBatchSampler


def test_one_group_gives_full_batches_in_sampler_order():
    batches = list(GroupedBatchSampler(SequentialSampler(range(10)), [7] * 10, 2))
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_batches_never_mix_groups():
    group_ids = [1, 0] * 50
    batches = list(GroupedBatchSampler(SequentialSampler(range(100)), group_ids, 2))
    assert len(batches) == 50
    for batch in batches:
        assert len({group_ids[i] for i in batch}) == 1
    assert batches[:2] == [[0, 2], [1, 3]]  # a batch leaves as soon as its group fills it


def test_leftovers_wait_for_the_next_pass_and_an_early_stop_leaks_nothing():
    sampler = GroupedBatchSampler(SequentialSampler(range(5)), [0, 1, 0, 1, 0], 2)
    assert list(sampler) == [[0, 2], [1, 3]]  # 4 waits in group 0
    assert next(iter(sampler)) == [4, 0]  # and leads group 0's first batch of the next pass
    for _ in range(3):  # stop right after a batch, again and again
        next(iter(sampler))
        assert all(len(buffer) < 2 for buffer in sampler.buffer_per_group.values())


def test_grouped_batch_sampler_is_a_batch_sampler_and_checks_its_arguments():
    sampler = GroupedBatchSampler(SequentialSampler(range(4)), [0, 0, 1, 1], 2)
    assert isinstance(sampler, torch.utils.data.BatchSampler)
    loader = DataLoader(list(range(10, 14)), batch_sampler=sampler)
    assert [b.tolist() for b in loader] == [[10, 11], [12, 13]]
    with pytest.raises(TypeError, match="undefined"):
        len(sampler)
    with pytest.raises(ValueError, match="Sampler"):
        GroupedBatchSampler(range(4), [0] * 4, 2)
    with pytest.raises(ValueError, match="one-dimensional"):
        GroupedBatchSampler(SequentialSampler(range(4)), [[0, 0], [1, 1]], 2)
    with pytest.raises(ValueError, match="batch_size"):
        GroupedBatchSampler(SequentialSampler(range(4)), [0] * 4, 0)


# ------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("num_workers", [0, 2])
def test_to_iterable_dataset_yields_the_sampler_stream_for_any_workers(num_workers):
    sampler = TrainingSampler(100, seed=10)
    expected = first(sampler, 100)  # iterating the sampler first changes nothing below
    assert sorted(expected) == list(range(100))
    dataset = ToIterableDataset(DatasetFromList(list(range(100))), sampler)
    loader = DataLoader(
        dataset,
        num_workers=num_workers,
        collate_fn=operator.itemgetter(0),
        # Re-seeding the global generators in workers must not change the stream.
        worker_init_fn=worker_init_reset_seed,
    )
    assert first(loader, 100) == expected


@pytest.mark.parametrize(
    "make",
    [
        lambda: TrainingSampler(30, seed=3),
        lambda: RandomSubsetTrainingSampler(30, 0.5, seed_shuffle=3, seed_subset=4),
        lambda: RepeatFactorTrainingSampler(torch.tensor([1.0, 2.5, 0.5] * 10), seed=3),
    ],
    ids=["training", "subset", "repeat"],
)
def test_every_iter_restarts_the_stream(make):
    sampler = make()
    head = first(sampler, 40)
    assert first(sampler, 40) == head
    assert first(iter(sampler), 10) == head[:10]


def test_sampler_without_seed_takes_it_from_the_global_numpy_generator():
    seed_all_rng(42)
    stream = first(TrainingSampler(30), 65)
    seed_all_rng(42)
    sampler = TrainingSampler(30)
    seed_all_rng(999)  # after construction: no effect on the stream
    assert first(sampler, 65) == stream
    seed_all_rng(7)
    assert first(TrainingSampler(30), 65) != stream


def test_training_sampler_checks_its_size_like_detectron2():
    with pytest.raises(TypeError, match="expects an int"):
        TrainingSampler(30.0, seed=0)
    with pytest.raises(ValueError, match="> 0"):
        TrainingSampler(0, seed=0)
    assert len(first(TrainingSampler(np.int64(5), seed=0), 5)) == 5


def test_random_subset_sampler_is_a_training_sampler():
    sampler = RandomSubsetTrainingSampler(20, 0.25, seed_shuffle=1, seed_subset=2)
    assert isinstance(sampler, TrainingSampler)
    assert len(set(first(sampler, 50))) == 5


# ----------------------------------------------------------------------- repeat factors


def test_repeat_factors_from_category_frequency():
    records = [
        {"annotations": [{"category_id": 0}, {"category_id": 1}]},
        {"annotations": [{"category_id": 0}]},
        {"annotations": []},
    ]
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, 0.5)
    assert factors.dtype == torch.float32
    assert torch.allclose(factors, torch.tensor([math.sqrt(3 / 2), 1.0, 1.0]))
    linear = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
        records, 0.5, sqrt=False
    )
    assert torch.allclose(linear, torch.tensor([3 / 2, 1.0, 1.0]))


# -------------------------------------------------------------------- inference shards


@pytest.mark.parametrize(
    ("size", "world_size", "expected"),
    [
        (0, 5, [range(0)] * 5),
        (16, 2, [range(8), range(8, 16)]),
        (2, 3, [range(1), range(1, 2), range(0)]),
        (42, 4, [range(11), range(11, 22), range(22, 32), range(32, 42)]),
    ],
)
def test_inference_sampler_local_indices(size, world_size, expected):
    shards = [InferenceSampler._get_local_indices(size, world_size, r) for r in range(world_size)]
    assert shards == expected
    assert [
        list(InferenceSampler(size, rank=r, world_size=world_size)) for r in range(world_size)
    ] == [list(s) for s in expected]
