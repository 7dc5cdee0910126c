"""Step batches from the global stream: the same records per step for every topology."""

import itertools

import numpy as np
import pytest

from trainkit.config import ConfigError
from trainkit.data.plans.batch_plan import GlobalBatchPlan
from trainkit.data.plans.grouping import aspect_ratio_bucket_ids
from trainkit.data.samplers import TrainingSampler

SIZE = 50
BUCKETS = aspect_ratio_bucket_ids(
    np.random.default_rng(0).uniform(0.4, 2.5, SIZE), [0.75, 1.0, 1.5]
)


def _steps(world_size, accumulate, num_steps, bucket_ids=None, batch=8, state=None):
    """{step: sorted (index, position) pairs} over all ranks and micro-batches of each step."""
    steps = {}
    for rank in range(world_size):
        sampler = TrainingSampler(SIZE, seed=3, rank=rank, world_size=world_size)
        composer = GlobalBatchPlan(
            sampler,
            batch,
            rank=rank,
            world_size=world_size,
            accumulate_steps=accumulate,
            bucket_ids=bucket_ids,
        )
        if state is not None:
            composer.load_state_dict(state)
        for items, key, _ in itertools.islice(composer, num_steps * accumulate):
            assert len(items) == batch // (world_size * accumulate)
            steps.setdefault(key, []).extend(tuple(i) for i in items)
    return {key: sorted(value) for key, value in steps.items()}


@pytest.mark.parametrize("bucket_ids", [None, BUCKETS], ids=["plain", "grouped"])
def test_records_of_each_step_do_not_depend_on_world_size_or_accumulation(bucket_ids):
    reference = _steps(1, 1, 12, bucket_ids)
    for world_size, accumulate in [(1, 4), (2, 2), (4, 1), (2, 1), (8, 1), (1, 8)]:
        assert _steps(world_size, accumulate, 12, bucket_ids) == reference, (world_size, accumulate)
    for step in reference.values():  # no record twice in a step, every step full
        assert len(step) == 8 and len({p for _, p in step}) == 8


def test_without_grouping_one_micro_batch_per_rank_is_the_rank_strided_stream():
    # k = 1 keeps detectron2's split: rank r gets global positions r, r + W, r + 2W, ...
    for rank in range(2):
        sampler = TrainingSampler(SIZE, seed=3, rank=rank, world_size=2)
        composer = GlobalBatchPlan(sampler, 8, rank=rank, world_size=2)
        drawn = [i for items, _, _ in itertools.islice(composer, 5) for i, _ in items]
        assert drawn == list(itertools.islice(iter(sampler), 20))


def test_grouped_steps_hold_one_bucket_and_leftovers_wait():
    steps = _steps(1, 1, 20, BUCKETS)
    for items in steps.values():
        assert len({int(BUCKETS[i]) for i, _ in items}) == 1
    positions = sorted(p for items in steps.values() for _, p in items)
    assert positions != list(range(len(positions)))  # some records wait for a later step


@pytest.mark.parametrize("bucket_ids", [None, BUCKETS], ids=["plain", "grouped"])
def test_a_state_at_a_step_boundary_resumes_on_another_topology(bucket_ids):
    reference = _steps(1, 1, 10, bucket_ids)
    sampler = TrainingSampler(SIZE, seed=3, rank=0, world_size=2)
    composer = GlobalBatchPlan(
        sampler, 8, rank=0, world_size=2, accumulate_steps=2, bucket_ids=bucket_ids
    )
    *_, (_, _, state) = itertools.islice(composer, 4 * 2)  # 4 steps of 2 micro-batches
    assert state["steps"] == 4 and state["micro"] == 0
    resumed = _steps(4, 1, 6, bucket_ids, state=state)
    assert resumed == {k: v for k, v in reference.items() if k >= 4}


def test_a_mid_step_state_resumes_only_on_the_same_split():
    sampler = TrainingSampler(SIZE, seed=3, rank=0, world_size=1)
    composer = GlobalBatchPlan(sampler, 8, rank=0, world_size=1, accumulate_steps=2)
    _, _, state = next(iter(composer))
    assert state["micro"] == 1
    other = GlobalBatchPlan(
        TrainingSampler(SIZE, seed=3, rank=0, world_size=2),
        8,
        rank=0,
        world_size=2,
        accumulate_steps=1,
    )
    with pytest.raises(ConfigError, match="middle of an optimizer step"):
        other.load_state_dict(state)
    same = GlobalBatchPlan(sampler, 8, rank=0, world_size=1, accumulate_steps=2)
    same.load_state_dict(state)
    assert next(iter(same))[1] == 0  # the second micro-batch of step 0


def test_a_state_of_another_stream_or_batch_is_refused():
    sampler = TrainingSampler(SIZE, seed=3, rank=0, world_size=1)
    state = GlobalBatchPlan(sampler, 8, rank=0, world_size=1).state_dict()
    for other in (
        GlobalBatchPlan(TrainingSampler(SIZE, seed=4), 8, rank=0, world_size=1),
        GlobalBatchPlan(sampler, 16, rank=0, world_size=1),
        GlobalBatchPlan(sampler, 8, rank=0, world_size=1, bucket_ids=BUCKETS),
    ):
        with pytest.raises(ConfigError, match="does not match"):
            other.load_state_dict(state)


def test_a_batch_that_does_not_split_over_ranks_and_micro_batches_is_refused():
    with pytest.raises(ConfigError, match="world size x SOLVER.ACCUMULATE_STEPS"):
        GlobalBatchPlan(TrainingSampler(SIZE, seed=0), 6, rank=0, world_size=2, accumulate_steps=2)
