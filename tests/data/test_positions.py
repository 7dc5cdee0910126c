import numpy as np
import pytest

from trainkit.data.plans.global_stream import (
    check_rank,
    global_positions,
    shard_range,
    split_positions,
    worker_local_positions,
)
from trainkit.data.samplers import TrainingSampler

WORLD_SIZES = [1, 2, 3, 4, 5, 7, 8, 16]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rank_positions_partition_the_global_stream(world_size):
    local = np.arange(50)
    all_positions = np.concatenate(
        [global_positions(local, r, world_size) for r in range(world_size)]
    )
    assert sorted(all_positions.tolist()) == list(range(50 * world_size))
    assert global_positions(local, world_size - 1, world_size)[:3].tolist() == [
        world_size - 1,
        2 * world_size - 1,
        3 * world_size - 1,
    ]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("total", [0, 1, 5, 13, 100])
def test_shard_range_is_exact_and_balanced(total, world_size):
    shards = [shard_range(total, r, world_size) for r in range(world_size)]
    assert [i for s in shards for i in s] == list(range(total))  # contiguous, in order, no padding
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("num_workers", [1, 2, 3, 4])
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_worker_shares_cover_each_local_position_once(num_workers, chunk_size):
    shares = [worker_local_positions(0, 10, w, num_workers, chunk_size) for w in range(num_workers)]
    merged = sorted(np.concatenate(shares).tolist())
    assert merged == list(range(10 * num_workers * chunk_size))
    # continuing at round 10 picks up exactly where round 9 ended
    nxt = worker_local_positions(10, 1, 0, num_workers, chunk_size)
    assert nxt[0] == 10 * num_workers * chunk_size


def test_split_positions():
    epochs, offsets = split_positions(np.array([0, 4, 5, 11]), 5)
    assert epochs.tolist() == [0, 0, 1, 2] and offsets.tolist() == [0, 4, 0, 1]


def test_check_rank_rejects_bad_values():
    with pytest.raises(ValueError, match="rank must be in"):
        check_rank(2, 2)
    with pytest.raises(ValueError, match="world_size"):
        check_rank(0, 0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 65, 1000, 4097])
def test_every_epoch_of_the_global_stream_is_a_permutation(n):
    # The keyed permutation is a bijection for any size (powers of two and just above).
    sampler = TrainingSampler(n, seed=11)
    for epoch in range(3):
        assert sorted(sampler.global_indices(epoch * n, n).tolist()) == list(range(n))


def test_a_read_across_epochs_equals_the_epochs_read_one_by_one():
    # Positions of several epochs in one read take one key per element; positions of one
    # epoch share one key: both give the same stream.
    n = 37
    sampler = TrainingSampler(n, seed=5)
    across = sampler.global_indices(5, 3 * n)  # starts mid-epoch 0, ends in epoch 3
    by_epoch = np.concatenate([sampler.global_indices(e * n, n) for e in range(4)])
    assert across.tolist() == by_epoch[5 : 5 + 3 * n].tolist()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_sampler_rank_streams_interleave_into_the_global_stream(world_size):
    n = 23
    global_stream = TrainingSampler(n, seed=4, rank=0, world_size=1).indices_at_local(
        np.arange(3 * n)
    )
    for r in range(world_size):
        k = np.arange(3 * n // world_size)
        local = TrainingSampler(n, seed=4, rank=r, world_size=world_size).indices_at_local(k)
        assert local.tolist() == global_stream[r::world_size][: len(k)].tolist()
