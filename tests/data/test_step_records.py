import itertools

import numpy as np
import pytest

from trainkit.config import ConfigError, get_cfg
from trainkit.data import DatasetCatalog, MetadataCatalog
from trainkit.data.catalog import load_catalog_parts
from trainkit.data.plans.batch_plan import GlobalBatchPlan, RankBatchPlan
from trainkit.data.plans.grouping import aspect_ratio_bucket_ids
from trainkit.data.plans.step_records import steps_records
from trainkit.data.samplers import TrainingSampler
from trainkit.data.spec import TrainDataSpec

SIZE = 50
BATCH = 8
BUCKETS = aspect_ratio_bucket_ids(np.random.default_rng(0).uniform(0.4, 2.5, SIZE), [0.75, 1.5])


def _plan(rank, world_size, accumulate, bucket_ids):
    sampler = TrainingSampler(SIZE, seed=3, rank=rank, world_size=world_size)
    return GlobalBatchPlan(
        sampler,
        BATCH,
        rank=rank,
        world_size=world_size,
        accumulate_steps=accumulate,
        bucket_ids=bucket_ids,
    )


def _real(world_size, accumulate, bucket_ids, num_steps, state=None):
    """{(step, rank, micro-batch): pairs} that one real plan per rank yields."""
    seen = {}
    for rank in range(world_size):
        plan = _plan(rank, world_size, accumulate, bucket_ids)
        if state is not None:
            plan.load_state_dict(state)
        micro = 0 if state is None else state["micro"]
        for items, step, _ in itertools.islice(plan, num_steps * accumulate - micro):
            seen[step, rank, micro] = [tuple(pair) for pair in items]
            micro = (micro + 1) % accumulate
    return seen


def _listed(steps):
    return {(s.step, rank, micro): records for s in steps for rank, micro, records in s.slots()}


@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_listed_records_equal_what_each_ranks_plan_yields(world_size, accumulate, grouping):
    bucket_ids = BUCKETS if grouping else None
    listed = steps_records(_plan(0, world_size, accumulate, bucket_ids), 12)
    assert [s.step for s in listed] == list(range(12))
    assert _listed(listed) == _real(world_size, accumulate, bucket_ids, 12)


@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_listing_starts_from_a_saved_position_and_leaves_the_plan_where_it_was(grouping):
    bucket_ids = BUCKETS if grouping else None
    plan = _plan(1, 2, 2, bucket_ids)
    *_, (_, _, state) = itertools.islice(plan, 7)  # 3 steps and one micro-batch of step 3
    assert (state["steps"], state["micro"]) == (3, 1)
    listed = steps_records(_plan(0, 2, 2, bucket_ids), 4, state=state)
    assert [s.step for s in listed] == [3, 4, 5, 6]  # step 3 whole, though rank 1 is inside it
    real = _real(2, 2, bucket_ids, 7)
    assert _listed(listed) == {key: value for key, value in real.items() if key[0] >= 3}
    # The plan of a live loader can be asked: it does not move.
    assert steps_records(plan, 1)[0].step == 3
    assert plan.state_dict() == state
    items, step, _ = next(iter(plan))
    assert (step, [tuple(p) for p in items]) == (3, real[3, 1, 1])


def test_first_step_skips_ahead_and_cannot_go_back():
    plan = _plan(0, 2, 1, BUCKETS)
    assert steps_records(plan, 2, first_step=5) == steps_records(plan, 7)[5:]
    _, _, state = next(itertools.islice(plan, 3, None))  # after step 3
    with pytest.raises(ValueError, match="starts at step 4, after step 2"):
        steps_records(plan, 1, state=state, first_step=2)
    assert steps_records(plan, 0) == []


def test_a_step_is_composed_once_for_thousands_of_ranks():
    sampler = TrainingSampler(100_000, seed=1)
    plan = GlobalBatchPlan(sampler, 4096, rank=0, world_size=2048, accumulate_steps=2)
    (step,) = steps_records(plan, 1, first_step=3)
    assert step.records(2047, 1) == [tuple(p) for p in step.batch[4095::4096]]
    assert sorted(p for *_, records in step.slots() for _, p in records) == list(
        range(3 * 4096, 4 * 4096)
    )
    with pytest.raises(ValueError, match="not a slot"):
        step.records(2048, 0)


def test_a_per_rank_plan_has_no_listing():
    plan = RankBatchPlan(list(range(10)), 2)
    with pytest.raises(TypeError, match="global stream"):
        steps_records(plan, 1)


@pytest.fixture
def two_datasets():
    saved_funcs, saved_meta = dict(DatasetCatalog._entries), dict(MetadataCatalog._entries)
    empty = {"annotations": [{"iscrowd": 1}]}
    DatasetCatalog.register(
        "steps_a",
        lambda: [{"image_id": f"a{i}", "width": 10 + i, "height": 20} for i in range(6)],
    )
    DatasetCatalog.register(
        "steps_b",
        lambda: [empty] + [{"file_name": f"b{i}.png", "width": 30, "height": 20} for i in range(4)],
    )
    yield ("steps_a", "steps_b")
    DatasetCatalog.clear()
    MetadataCatalog.clear()
    DatasetCatalog._entries.update(saved_funcs)
    MetadataCatalog._entries.update(saved_meta)


def test_record_ids_name_the_dataset_the_index_in_it_and_the_records_own_id(two_datasets):
    assert load_catalog_parts(two_datasets)[1] == {"steps_a": 6, "steps_b": 5}
    assert load_catalog_parts(two_datasets, filter_empty=True)[1] == {"steps_a": 6, "steps_b": 4}
    cfg = get_cfg()
    cfg.merge_from_list(["DATASETS.TRAIN", two_datasets, "SOLVER.IMS_PER_BATCH", 4, "SEED", 7])
    spec = TrainDataSpec.from_config(cfg, world_size=2)
    ids = spec.record_ids()
    assert len(spec.records) == 10  # FILTER_EMPTY_ANNOTATIONS drops the crowd-only record
    assert ids(0) == "steps_a[0] image_id=a0"
    assert ids(7) == "steps_b[1] file_name=b1.png"
    assert ids.info(9) == {"dataset": "steps_b", "index": 3, "file_name": "b3.png"}
    with pytest.raises(IndexError):
        ids(10)


@pytest.mark.parametrize("weights", [(), (3.0, 1.0)], ids=["concatenated", "mixed"])
def test_the_plan_from_a_config_is_the_loaders(two_datasets, weights):
    from trainkit.data import build_detection_train_loader

    cfg = get_cfg()
    cfg.merge_from_list(
        ["DATASETS.TRAIN", two_datasets, "SOLVER.IMS_PER_BATCH", 4, "SEED", 7]
        + ["DATALOADER.ASPECT_RATIO_GROUPING", True, "SOLVER.ACCUMULATE_STEPS", 2]
        + ["DATALOADER.NUM_WORKERS", 0, "DATASETS.TRAIN_WEIGHTS", weights]
    )
    spec = TrainDataSpec.from_config(cfg, world_size=1)
    loader = build_detection_train_loader(cfg, mapper=lambda r: r)
    seen = [tuple(loader.last_batch_indices) for _, _ in zip(range(10), loader)]
    listed = [tuple(i for i, _ in step.records(0, j)) for step in spec.steps_records(5)
              for j in range(2)]  # fmt: skip
    assert seen == listed
    assert [s.batch for s in loader.spec.steps_records(5)] == [
        s.batch for s in spec.steps_records(5)
    ]
    if weights:  # 3:1 of a batch of 4: three of steps_a (indices < 6), one of steps_b
        assert all(sum(i < 6 for i, _ in step.batch) == 3 for step in spec.steps_records(5))


def test_a_config_the_plan_cannot_list_is_one_line(two_datasets):
    cfg = get_cfg()
    cfg.merge_from_list(["DATASETS.TRAIN", two_datasets, "SOLVER.IMS_PER_BATCH", 6])
    with pytest.raises(ConfigError, match="multiple of 4"):
        TrainDataSpec.from_config(cfg, world_size=4)
    spec = TrainDataSpec.from_config(cfg, world_size=2, rank=1, seed=3)
    assert (spec.seed, spec.world_size, spec.rank, spec.sampler.world_size) == (3, 2, 1, 2)
