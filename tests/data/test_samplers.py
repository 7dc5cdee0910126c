import io
import itertools
import tracemalloc

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from trainkit.config import get_cfg
from trainkit.data.samplers import (
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.data.train_config import build_train_sampler


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 97, 1000])
def test_each_epoch_is_a_new_permutation(n):
    stream = take(TrainingSampler(n, seed=1, rank=0, world_size=1), 4 * n)
    epochs = [stream[e * n : (e + 1) * n] for e in range(4)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))
    if n >= 7:  # (too few orders of 1 or 2 indices to tell)
        assert len({tuple(e) for e in epochs}) == 4
        assert epochs[0] != list(range(n))


def test_seed_selects_the_stream_and_shuffle_false_is_ordered():
    assert take(TrainingSampler(50, seed=1), 50) == take(TrainingSampler(50, seed=1), 50)
    assert take(TrainingSampler(50, seed=1), 50) != take(TrainingSampler(50, seed=2), 50)
    assert take(TrainingSampler(5, shuffle=False, seed=0), 12) == [0, 1, 2, 3, 4] * 2 + [0, 1]


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_rank_streams_interleave_into_the_world_size_one_stream(world_size):
    # Rank r yields global positions r, r + W, ...: disjoint, and together each epoch once.
    n = 48
    per_rank = [
        take(TrainingSampler(n, seed=4, rank=r, world_size=world_size), 2 * n // world_size)
        for r in range(world_size)
    ]
    merged = [per_rank[p % world_size][p // world_size] for p in range(2 * n)]
    assert merged == take(TrainingSampler(n, seed=4, rank=0, world_size=1), 2 * n)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TrainingSampler(31, seed=5, rank=1, world_size=3),
        lambda: RandomSubsetTrainingSampler(
            40, 0.5, seed_shuffle=2, seed_subset=3, rank=0, world_size=2
        ),
        lambda: RepeatFactorTrainingSampler(torch.tensor([1.0, 2.5, 0.5, 1.0, 3.0]), seed=7),
    ],
    ids=["training", "subset", "repeat"],
)
@pytest.mark.parametrize("k", [0, 1, 17, 60])
def test_state_round_trip_continues_the_stream(make, k):
    reference = take(make(), k + 25)
    sampler = make()
    assert take(sampler, k) == reference[:k]
    state = roundtrip(sampler.state_dict())
    fresh = make()
    fresh.load_state_dict(state)
    assert take(fresh, 25) == reference[k:]


def test_load_state_of_another_stream_is_refused():
    state = TrainingSampler(10, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        TrainingSampler(10, seed=2).load_state_dict(state)


def test_huge_dataset_in_constant_memory():
    n = 400_000_000
    tracemalloc.start()
    sampler = TrainingSampler(n, seed=0, rank=1, world_size=8)
    first = take(sampler, 1000)
    sampler.load_state_dict({**sampler.state_dict(), "num_drawn": 3 * n})  # epoch 24 of rank 1
    jumped = take(sampler, 10)
    sampler.load_state_dict({**sampler.state_dict(), "num_drawn": n // 8 - 5})  # epoch 0's end
    tail = take(sampler, 10)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 50 * 2**20  # a materialised permutation would be 3.2 GB
    assert all(0 <= i < n for i in first + jumped + tail) and len(set(first)) == 1000


def test_random_subset_stays_in_a_fixed_subset():
    sampler = RandomSubsetTrainingSampler(100, 0.3, seed_shuffle=1, seed_subset=2)
    stream = take(sampler, 90)
    subset = set(stream[:30])
    assert len(subset) == 30 and set(stream) == subset
    assert stream[:30] != stream[30:60]  # reshuffled per epoch
    with pytest.raises(ValueError, match="RANDOM_SUBSET_RATIO"):
        RandomSubsetTrainingSampler(10, 1.5, seed_shuffle=0, seed_subset=0)


def test_records_without_annotations_repeat_once():
    # (The formula itself: tests/compat/test_sampler.py.) A record with no "annotations"
    # key, or none in it, has no category to be rare.
    records = [{"annotations": [{"category_id": 0}]}] * 9 + [{}, {"annotations": []}]
    factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(records, 0.5)
    assert factors[-2:].tolist() == [1.0, 1.0]


def test_repeat_factor_sampler_repeats_on_average():
    sampler = RepeatFactorTrainingSampler([1.0, 3.0, 0.5], seed=0)
    counts = np.bincount(take(sampler, 4500), minlength=3)
    assert counts[1] / counts[0] == pytest.approx(3.0, rel=0.1)
    assert counts[2] / counts[0] == pytest.approx(0.5, rel=0.15)


@pytest.mark.parametrize(("size", "world_size"), [(5, 2), (10, 3), (2, 4), (7, 7), (0, 2)])
def test_inference_sampler_covers_each_index_once(size, world_size):
    shards = [
        list(InferenceSampler(size, rank=r, world_size=world_size)) for r in range(world_size)
    ]
    assert [i for s in shards for i in s] == list(range(size))
    assert [
        len(InferenceSampler(size, rank=r, world_size=world_size)) for r in range(world_size)
    ] == [len(s) for s in shards]


def test_inference_sampler_vs_torch_distributed_sampler():
    """Compare InferenceSampler with torch's DistributedSampler on the finite case.

    torch's DistributedSampler gives every rank ceil(N / R) indices, padding the (shuffled)
    list with its own head until it divides evenly, and interleaves ranks (rank r takes
    positions r, r + R, ...). For N = 5, R = 2 one sample is therefore seen twice per epoch.
    InferenceSampler instead gives contiguous shards whose sizes differ by at most one and
    covers each index exactly once, which is what evaluation needs. The interleaving rule is
    the same one the training samplers use for their infinite streams.
    """
    n, world_size = 5, 2
    data = list(range(n))
    torch_shards = [
        list(DistributedSampler(data, num_replicas=world_size, rank=r, shuffle=False))
        for r in range(world_size)
    ]
    assert torch_shards == [[0, 2, 4], [1, 3, 0]]  # padded with the head: index 0 twice
    ours = [list(InferenceSampler(n, rank=r, world_size=world_size)) for r in range(world_size)]
    assert ours == [[0, 1, 2], [3, 4]]
    assert sorted(ours[0] + ours[1]) == data and sorted(torch_shards[0] + torch_shards[1]) != data
    # With shuffling, torch pads the permuted list the same way (seed + epoch keyed).
    shuffled = [
        list(DistributedSampler(data, num_replicas=world_size, rank=r, seed=0))
        for r in range(world_size)
    ]
    assert sum(map(len, shuffled)) == 6 and len(set(shuffled[0] + shuffled[1])) == 5


# A new iter() restarts the stream (detectron2), from the loaded position if any (resume).


@pytest.mark.parametrize(
    "make",
    [
        lambda: TrainingSampler(31, seed=5, rank=1, world_size=3),
        lambda: RandomSubsetTrainingSampler(40, 0.5, seed_shuffle=2, seed_subset=3),
        lambda: RepeatFactorTrainingSampler(torch.tensor([1.0, 2.5, 0.5, 1.0, 3.0]), seed=7),
    ],
    ids=["training", "subset", "repeat"],
)
def test_loaded_position_is_where_every_new_iterator_starts(make):
    reference = take(make(), 60)
    sampler = make()
    take(sampler, 17)
    take(sampler, 9)  # a second iterator restarted: its state says 9, not 26
    assert sampler.state_dict()["num_drawn"] == 9
    fresh = make()
    fresh.load_state_dict(roundtrip(sampler.state_dict()))
    assert take(fresh, 20) == reference[9:29]
    assert take(fresh, 20) == reference[9:29]  # again from the loaded position
    assert fresh.state_dict()["num_drawn"] == 29


def test_worker_shares_start_at_the_loaded_position():
    from torch.utils.data import DataLoader

    from trainkit.data import ToIterableDataset

    n = 20
    reference = take(TrainingSampler(n, seed=1), 3 * n)
    sampler = TrainingSampler(n, seed=1)
    sampler.load_state_dict({**sampler.state_dict(), "num_drawn": 7})
    dataset = ToIterableDataset(list(range(n)), sampler)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert list(itertools.islice(loader, 30)) == reference[7:37]


@pytest.mark.parametrize("sqrt, factor", [(True, 5.0**0.5), (False, 5.0)])
def test_repeat_sqrt_key_chooses_the_rule(sqrt, factor):
    # DATALOADER.REPEAT_SQRT (detectron2's key) reaches the repeat factors: the rare category
    # (1 record in 10, threshold 0.5) repeats sqrt(5) or 5 times as often as the others.
    cfg = get_cfg()
    cfg.merge_from_list(["DATALOADER.REPEAT_THRESHOLD", 0.5, "DATALOADER.REPEAT_SQRT", sqrt])
    cfg.DATALOADER.SAMPLER_TRAIN = "RepeatFactorTrainingSampler"
    records = [{"annotations": [{"category_id": 0}]}] * 9 + [{"annotations": [{"category_id": 1}]}]
    sampler = build_train_sampler(cfg, records, seed=0)
    counts = np.bincount(take(sampler, 20000), minlength=10)
    assert counts[9] / counts[:9].mean() == pytest.approx(factor, rel=0.1)
