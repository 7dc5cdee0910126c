"""Weighted mixing: each step's exact share of every set, on every topology and after a resume."""

import itertools
import math
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest

from trainkit.config import ConfigError, get_cfg
from trainkit.data import DatasetCatalog, ToIterableDataset, build_train_loader
from trainkit.data.plans.grouping import aspect_ratio_bucket_ids
from trainkit.data.plans.loader_state import mixed_set_metrics
from trainkit.data.plans.mixed_sampler import (
    MixedBatchPlan,
    MixedTrainingSampler,
    mix_counts,
    mix_weights,
)

SIZES = [40, 25, 7]  # set 2 is small: it repeats many times
WEIGHTS = [10, 5, 1]
OFFSETS = [0, 40, 65]
BUCKETS = aspect_ratio_bucket_ids(
    np.random.default_rng(0).uniform(0.4, 2.5, sum(SIZES)), [0.75, 1.0, 1.5]
)
TOPOLOGIES = [(1, 4), (2, 2), (4, 1)]


def _plans(world_size, accumulate, batch, bucket_ids, state=None):
    for rank in range(world_size):
        sampler = MixedTrainingSampler(SIZES, WEIGHTS, 3, rank=rank, world_size=world_size)
        plan = MixedBatchPlan(
            sampler,
            batch,
            rank=rank,
            world_size=world_size,
            accumulate_steps=accumulate,
            bucket_ids=bucket_ids,
        )
        if state is not None:
            plan.load_state_dict(state)
        yield plan


def _ledger(world_size, accumulate, num_steps, bucket_ids=None, batch=16, state=None):
    """({step: sorted (index, position) pairs of all ranks' micro-batches}, last rank-0 state)."""
    steps, last = {}, None
    for rank, plan in enumerate(_plans(world_size, accumulate, batch, bucket_ids, state)):
        for items, key, after in itertools.islice(plan, num_steps * accumulate):
            assert len(items) == batch // (world_size * accumulate)
            steps.setdefault(key, []).extend(tuple(i) for i in items)
            last = after if rank == 0 else last
    return {key: sorted(value) for key, value in steps.items()}, last


def _set_of(index):
    return int(np.searchsorted(OFFSETS, index, side="right")) - 1


def _counts(step_records):
    counts = [0, 0, 0]
    for index, _ in step_records:
        counts[_set_of(index)] += 1
    return counts


def _expected_counts(batch, num_steps):
    taken, out = [0, 0, 0], []
    for step in range(num_steps):
        counts = mix_counts(batch, WEIGHTS, step, taken)
        taken = [c + n for c, n in zip(taken, counts)]
        out.append(counts)
    return out


def test_the_documented_examples():
    assert _expected_counts(16, 3) == [[10, 5, 1]] * 3
    assert _expected_counts(8, 4) == [[5, 3, 0], [5, 2, 1], [5, 3, 0], [5, 2, 1]]
    assert mix_weights([0.7, 0.2, 0.1], "abc") == [7, 2, 1]
    assert mix_weights([2.5, 5.0], "ab") == [1, 2]


@pytest.mark.parametrize("batch", [1, 3, 8, 16, 24])
def test_every_step_is_full_and_the_long_run_share_is_exact(batch):
    rng = np.random.default_rng(batch)
    for weights in [WEIGHTS, [3, 3], [1, 1000, 7, 2], rng.integers(1, 40, 5).tolist()]:
        taken = [0] * len(weights)
        for step in range(300):
            counts = mix_counts(batch, weights, step, taken)
            assert sum(counts) == batch and min(counts) >= 0
            taken = [c + n for c, n in zip(taken, counts)]
            for w, c in zip(weights, taken):  # never a whole record off the exact share
                assert abs(Fraction((step + 1) * batch * w, sum(weights)) - c) < 1


@pytest.mark.parametrize(
    "weights", [WEIGHTS, [3, 3], [7, 2, 1], [1, 1000, 7, 2], [333, 334, 333], [4999, 1]]
)
def test_the_sampler_counts_are_the_rule_over_several_cycles(weights):
    # The sampler reads a cycle of counts computed once (period U / gcd(B, U), up to 4096
    # steps) and computes longer cycles step by step: both must be mix_counts' run.
    sampler = MixedTrainingSampler([10] * len(weights), weights, 0, rank=0, world_size=1)
    for batch in (1, 8, 16, 24, 64):
        taken = [0] * len(weights)
        period = sum(sampler.weights) // math.gcd(batch, sum(sampler.weights))
        for step in range(min(3 * period, 3000) + 1):
            expected = mix_counts(batch, sampler.weights, step, taken)
            assert list(sampler.counts(batch, step, taken)) == expected, (batch, step)
            taken = [c + n for c, n in zip(taken, expected)]


@pytest.mark.parametrize("bucket_ids", [None, BUCKETS], ids=["plain", "grouped"])
def test_per_step_counts_are_exact_on_every_topology(bucket_ids):
    expected = _expected_counts(16, 30)
    reference, _ = _ledger(1, 1, 30, bucket_ids)
    assert [_counts(reference[s]) for s in range(30)] == expected
    for world_size, accumulate in TOPOLOGIES:
        ledger, _ = _ledger(world_size, accumulate, 30, bucket_ids)
        assert ledger == reference, (world_size, accumulate)
    for step in reference.values():  # no position twice in a step
        assert len({p for _, p in step}) == 16


@pytest.mark.parametrize("bucket_ids", [None, BUCKETS], ids=["plain", "grouped"])
def test_a_resume_from_two_ranks_on_one_continues_the_same_ledger(bucket_ids):
    reference, _ = _ledger(1, 1, 20, bucket_ids, batch=8)
    first, state = _ledger(2, 1, 7, bucket_ids, batch=8)
    assert state["steps"] == 7 and state["split"] == [2, 1]
    rest, _ = _ledger(1, 2, 13, bucket_ids, batch=8, state=state)
    assert {**first, **rest} == reference
    assert [_counts(reference[s]) for s in range(20)] == _expected_counts(8, 20)


def test_grouped_each_set_takes_its_share_from_one_of_its_buckets():
    reference, _ = _ledger(1, 1, 40, BUCKETS)
    for step in reference.values():
        for s in range(3):
            buckets = {int(BUCKETS[i]) for i, _ in step if _set_of(i) == s}
            assert len(buckets) <= 1


def test_each_set_keeps_its_own_epochs_and_positions():
    ledger, state = _ledger(1, 1, 14)
    records = [index for step in ledger.values() for index, _ in step]
    small = [i for i in records if _set_of(i) == 2]
    assert len(small) == 14 and set(small) == set(range(65, 72))  # 2 epochs of 7
    assert [part["taken"] for part in state["sets"]] == [140, 70, 14]
    positions = sorted(p for step in ledger.values() for _, p in step)
    assert len(set(positions)) == len(positions)  # unique: they key the augmentations
    metrics = mixed_set_metrics(
        {
            **state,
            "source": MixedTrainingSampler(
                SIZES, WEIGHTS, 3, names=["a", "b", "c"], rank=0, world_size=1
            ).global_stream_key(),
        }
    )
    assert metrics == {
        "data/a/epoch": 3.5, "data/a/records": 10.0,
        "data/b/epoch": 70 / 25, "data/b/records": 5.0,
        "data/c/epoch": 2.0, "data/c/records": 1.0,
    }  # fmt: skip


def test_sets_have_their_own_shuffles():
    sampler = MixedTrainingSampler([10, 10], [1, 1], 0, rank=0, world_size=1)
    assert (sampler.indices(0, 0, 10) + 10).tolist() != sampler.indices(1, 0, 10).tolist()
    assert sorted(sampler.indices(1, 10, 10).tolist()) == list(range(10, 20))


def test_a_state_of_another_mix_is_refused():
    _, state = _ledger(1, 1, 2)
    sampler = MixedTrainingSampler(SIZES, [10, 5, 2], 3, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="does not match"):
        MixedBatchPlan(sampler, 16, rank=0, world_size=1).load_state_dict(state)


def test_a_set_of_4e8_records_costs_constant_memory():
    n = 400_000_000
    tracemalloc.start()
    sampler = MixedTrainingSampler([n, 1000, 10], WEIGHTS, 0, rank=1, world_size=2)
    plan = MixedBatchPlan(sampler, 16, rank=1, world_size=2)
    first = [i for items, _, _ in itertools.islice(plan, 20) for i, _ in items]
    state = plan.state_dict()
    state["sets"][0]["position"] = state["sets"][0]["taken"] = 3 * n  # set 0's epoch 3
    plan.load_state_dict(state)
    jumped = [i for items, _, _ in itertools.islice(plan, 20) for i, _ in items]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 50 * 2**20  # one index array of the big set would be 3.2 GB
    assert all(0 <= i < n + 1010 for i in first + jumped)
    assert len(first) == len(jumped) == 160


def test_weights_are_checked():
    with pytest.raises(ConfigError, match="3 weights for 2 datasets"):
        mix_weights([1, 2, 3], ["a", "b"])
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="dataset 'b' the weight"):
            mix_weights([1, bad], ["a", "b"])


NAMES = ("mix_a", "mix_b", "mix_c")


@pytest.fixture
def mixed_catalog():
    rng = np.random.default_rng(1)
    for name, size in zip(NAMES, SIZES):
        records = [
            {"set": name, "i": j, "width": int(w), "height": 100}
            for j, w in enumerate(rng.integers(50, 200, size))
        ]
        DatasetCatalog.register(name, lambda records=records: records)
    try:
        yield
    finally:
        for name in NAMES:
            DatasetCatalog.remove(name)


def _cfg(*options):
    cfg = get_cfg()
    cfg.merge_from_list(
        ["SEED", 5, "SOLVER.IMS_PER_BATCH", 16, "DATALOADER.NUM_WORKERS", 0]
        + ["DATASETS.TRAIN", NAMES, "DATASETS.TRAIN_WEIGHTS", (10, 5, 1), *options]
    )
    return cfg


@pytest.mark.parametrize("grouping", [False, True])
def test_the_config_mixes_the_registered_sets_and_resumes(mixed_catalog, grouping):
    cfg = _cfg("DATALOADER.ASPECT_RATIO_GROUPING", grouping)
    loader = build_train_loader(cfg, lambda record: record)
    batches = list(itertools.islice(iter(loader), 6))
    for batch in batches:
        assert [sum(r["set"] == name for r in batch) for name in NAMES] == WEIGHTS
    resumed = build_train_loader(cfg, lambda record: record)
    first = list(itertools.islice(iter(resumed), 2))
    state = resumed.state_dict()
    assert first == batches[:2]
    again = build_train_loader(cfg, lambda record: record)
    again.load_state_dict(state)
    assert list(itertools.islice(iter(again), 4)) == batches[2:]
    metrics = mixed_set_metrics(again.state_dict())
    assert metrics["data/mix_c/records"] == 1.0 and metrics["data/mix_c/epoch"] == 6 / 7


def test_mixing_options_a_mix_cannot_honour_are_refused(mixed_catalog):
    identity = lambda record: record  # noqa: E731
    with pytest.raises(ConfigError, match="2 weights for 3 datasets"):
        build_train_loader(_cfg("DATASETS.TRAIN_WEIGHTS", (1.0, 2.0)), identity)
    with pytest.raises(ConfigError, match="'mix_b' the weight 0"):
        build_train_loader(_cfg("DATASETS.TRAIN_WEIGHTS", (1.0, 0.0, 2.0)), identity)
    sampler = ("DATALOADER.SAMPLER_TRAIN", "RepeatFactorTrainingSampler")
    with pytest.raises(ConfigError, match="'RepeatFactorTrainingSampler' cannot be mixed"):
        build_train_loader(_cfg(*sampler), identity)
    with pytest.raises(ConfigError, match="pass no dataset= or sampler="):
        build_train_loader(_cfg(), identity, dataset=[{"set": "x"}])
    DatasetCatalog.register("mix_stream", lambda: ToIterableDataset([{"set": "s"}], None))
    try:
        cfg = _cfg("DATASETS.TRAIN", (*NAMES[:2], "mix_stream"))
        with pytest.raises(ConfigError, match="'mix_stream' is a stream dataset"):
            build_train_loader(cfg, identity)
    finally:
        DatasetCatalog.remove("mix_stream")


def test_without_weights_the_sets_are_concatenated_as_before(mixed_catalog):
    cfg = _cfg("DATASETS.TRAIN_WEIGHTS", (), "DATALOADER.ASPECT_RATIO_GROUPING", False)
    loader = build_train_loader(cfg, lambda record: record)
    assert len(loader.records) == sum(SIZES)
    assert mixed_set_metrics(loader.state_dict()) == {}
    assert loader.state_dict()["source"]["type"] == "TrainingSampler"


def test_grouped_sets_share_the_steps_bucket_when_their_aspect_ratios_look_alike():
    ledger, _ = _ledger(1, 1, 60, BUCKETS)
    one_bucket = [len({int(BUCKETS[i]) for i, _ in step}) == 1 for step in ledger.values()]
    # 47 of 60 here (set 2 holds 7 records); when the sets ignore the step's bucket: 8 of 60.
    assert sum(one_bucket) >= 40
