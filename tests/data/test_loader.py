import gc
import io
import itertools
import logging

import numpy as np
import pytest
import torch

from trainkit.config import get_cfg
from trainkit.data import (
    DatasetCatalog,
    MapDataset,
    ToIterableDataset,
    batch_rng,
    build_batch_data_loader,
    build_test_loader,
    build_train_loader,
    sample_rng,
    sample_seed,
)
from trainkit.data.plans.grouping import aspect_ratio_bucket_ids, record_aspect_ratio
from trainkit.data.samplers import TrainingSampler

BINS = [0.5, 0.75, 1.0, 1.333, 2.0]


def make_records(n=60):
    widths = [10, 30, 64, 100, 150, 220]
    return [{"id": i, "width": widths[i % 6] + i % 4, "height": 100} for i in range(n)]


def in_sample(fn, seed, position, batch=None):
    """Return ``fn()`` run as a mapper runs: in the sample context of (seed, position)."""
    dataset = MapDataset([None], lambda _: [fn()])
    return dataset.map_at(0, seed=seed, position=position, batch=batch)[0]


def identity_mapper(record):
    return record["id"]


def rng_mapper(record):
    return record["id"], int(sample_rng().integers(1 << 30)), sample_seed()


def flaky_mapper(record):
    if record["id"] % 7 == 3:
        raise OSError(f"unreadable file for record {record['id']}")
    return record["id"]


def make_cfg(**overrides):
    cfg = get_cfg()
    cfg.SEED = 42
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = getattr(node, p)
        setattr(node, leaf, value)
    return cfg


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_batch_stream_is_identical_for_any_num_workers(grouping):
    records = make_records()
    streams = {}
    for num_workers in (0, 1, 2, 4):
        cfg = make_cfg(
            **{"DATALOADER.NUM_WORKERS": num_workers, "DATALOADER.ASPECT_RATIO_GROUPING": grouping}
        )
        streams[num_workers] = take(build_train_loader(cfg, rng_mapper, dataset=records), 12)
    assert streams[0] == streams[1] == streams[2] == streams[4]
    assert all(len(batch) == 4 for batch in streams[0])


def batch_rng_mapper(record):
    return record["id"], float(batch_rng().random()), float(sample_rng().random())


@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_batch_rng_is_shared_within_a_batch_for_any_num_workers(grouping):
    records = make_records()
    streams = {}
    for num_workers in (0, 2):
        cfg = make_cfg(
            **{"DATALOADER.NUM_WORKERS": num_workers, "DATALOADER.ASPECT_RATIO_GROUPING": grouping}
        )
        streams[num_workers] = take(build_train_loader(cfg, batch_rng_mapper, dataset=records), 10)
    assert streams[0] == streams[2]
    batch_draws = [{draw for _, draw, _ in batch} for batch in streams[0]]
    assert all(len(draws) == 1 for draws in batch_draws)  # one value per batch
    assert len({draws.pop() for draws in batch_draws}) == len(streams[0])  # new per batch
    sample_draws = [draw for batch in streams[0] for _, _, draw in batch]
    assert len(set(sample_draws)) == len(sample_draws)  # sample_rng still per sample
    # Outside a loader a sample is a batch of its own.
    alone = in_sample(lambda: float(batch_rng().random()), 42, 7)
    assert in_sample(lambda: float(batch_rng().random()), 42, 7, batch=7) == alone


def test_plain_batches_follow_the_sampler_stream():
    records = make_records(30)
    loader = build_train_loader(make_cfg(), identity_mapper, dataset=records)
    batches = take(loader, 15)  # two epochs
    flat = [i for b in batches for i in b]
    expected = list(itertools.islice(iter(TrainingSampler(30, seed=42, rank=0, world_size=1)), 60))
    assert flat == expected
    assert loader.state_dict()["steps"] == 15
    assert loader.last_batch_positions == [56, 57, 58, 59]
    assert loader.last_batch_indices == batches[-1]


def test_grouping_never_mixes_buckets_and_uses_more_than_two():
    records = make_records()
    buckets = aspect_ratio_bucket_ids([record_aspect_ratio(r) for r in records], BINS)
    assert len(set(buckets.tolist())) > 2
    cfg = make_cfg(
        **{"DATALOADER.ASPECT_RATIO_GROUPING": True, "DATALOADER.ASPECT_RATIO_BINS": BINS}
    )
    batches = take(build_train_loader(cfg, identity_mapper, dataset=records), 30)
    for batch in batches:
        assert len({int(buckets[i]) for i in batch}) == 1
    assert len({int(buckets[b[0]]) for b in batches}) > 2


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_loader_state_round_trip_continues_with_the_next_batch(grouping, num_workers):
    records = make_records()
    cfg = make_cfg(
        **{"DATALOADER.ASPECT_RATIO_GROUPING": grouping, "DATALOADER.NUM_WORKERS": num_workers}
    )
    reference = take(build_train_loader(cfg, rng_mapper, dataset=records), 20)

    loader = build_train_loader(cfg, rng_mapper, dataset=records)
    assert take(loader, 7) == reference[:7]  # workers have prefetched beyond batch 7 by now
    state = roundtrip(loader.state_dict())
    assert state["steps"] == 7
    if grouping:
        assert any(state["buckets"]), "expected samples waiting in buckets mid-stream"

    resumed = build_train_loader(cfg, rng_mapper, dataset=records)
    resumed.load_state_dict(state)
    assert take(resumed, 13) == reference[7:]
    # iterating the same loader again also continues after the last returned batch
    assert take(loader, 3) == reference[7:10]


def test_state_of_another_rank_or_batch_size_is_refused():
    records = make_records()
    state = build_train_loader(make_cfg(), identity_mapper, dataset=records).state_dict()
    other = build_train_loader(
        make_cfg(**{"SOLVER.IMS_PER_BATCH": 8}), identity_mapper, dataset=records
    )
    with pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(state)


def test_sample_rng_depends_only_on_seed_and_position():
    records = make_records()
    batches = take(build_train_loader(make_cfg(), rng_mapper, dataset=records), 10)
    samples = [s for b in batches for s in b]
    for position, (_, draw, seed) in enumerate(samples):  # world size 1: position = order
        again = in_sample(lambda: rng_mapper({"id": None})[1:], 42, position)
        assert (draw, seed) == again
    assert len({draw for _, draw, _ in samples}) == len(samples)
    other_seed = take(build_train_loader(make_cfg(SEED=43), rng_mapper, dataset=records), 1)
    assert other_seed[0][0][1] != batches[0][0][1]


def test_sample_rng_continues_within_a_sample_and_survives_nested_samples():
    def draw(count):
        return lambda: sample_rng().random(count).tolist()

    def outer():
        first = sample_rng().random(2).tolist()
        inner = in_sample(draw(2), 7, 4)  # a mapper mapping another record inside its call
        return first, inner, sample_rng().random(2).tolist()

    expected = in_sample(draw(4), 7, 3)
    first, inner, rest = in_sample(outer, 7, 3)
    assert first + rest == expected
    assert in_sample(draw(2), 7, 4) == inner
    assert in_sample(draw(4), 7, 5) != expected


def test_failing_records_are_skipped_and_data_keeps_flowing(caplog):
    records = make_records()
    cfg = make_cfg(**{"DATALOADER.NUM_WORKERS": 0})
    with caplog.at_level(logging.WARNING, logger="trainkit.data.common"):
        batches = take(build_train_loader(cfg, flaky_mapper, dataset=records), 20)
    assert all(len(b) == 4 and all(i % 7 != 3 for i in b) for b in batches)
    assert "unreadable file for record" in caplog.text
    with_workers = take(
        build_train_loader(
            make_cfg(**{"DATALOADER.NUM_WORKERS": 2}), flaky_mapper, dataset=records
        ),
        20,
    )
    assert with_workers == batches  # replacements are deterministic


def _always_none(record):
    return None


def test_too_many_failures_raise_naming_dataset_and_record():
    DatasetCatalog.register(
        "toy_broken", lambda: [{"id": i, "file_name": f"f{i}.png"} for i in range(8)]
    )
    try:
        cfg = make_cfg(
            **{"DATASETS.TRAIN": ("toy_broken",), "DATALOADER.MAX_CONSECUTIVE_FAILURES": 3}
        )
        with pytest.raises(RuntimeError, match=r"dataset 'toy_broken'.*'file_name': 'f\d\.png'"):
            take(build_train_loader(cfg, _always_none), 1)
    finally:
        DatasetCatalog.remove("toy_broken")


def test_unknown_dataset_and_bad_batch_size_give_clear_errors():
    with pytest.raises(KeyError, match="'no_such_set' is not registered"):
        build_train_loader(make_cfg(**{"DATASETS.TRAIN": ("no_such_set",)}))
    with pytest.raises(ValueError, match=r"SOLVER.IMS_PER_BATCH=0 .*world size \(1\)"):
        build_train_loader(make_cfg(**{"SOLVER.IMS_PER_BATCH": 0}), dataset=make_records())
    with pytest.raises(ValueError, match=r"DATASETS\.TRAIN"):
        build_train_loader(make_cfg())
    with pytest.raises(ValueError, match="width"):
        build_train_loader(
            make_cfg(**{"DATALOADER.ASPECT_RATIO_GROUPING": True}), dataset=[{"id": 0}]
        )


def test_build_batch_data_loader_with_collate_and_iterable_dataset():
    sampler = TrainingSampler(10, seed=0, rank=0, world_size=1)
    loader = build_batch_data_loader(list(range(10)), sampler, 4, collate_fn=torch.tensor)
    batch = next(iter(loader))
    assert isinstance(batch, torch.Tensor) and batch.shape == (4,)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    assert list(build_batch_data_loader(Stream(), None, 4)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="sampler"):
        build_batch_data_loader(list(range(10)), None, 4)


def test_build_test_loader_covers_dataset_once():
    DatasetCatalog.register("toy_test", lambda: [{"id": i} for i in range(7)])
    try:
        cfg = make_cfg(**{"TEST.IMS_PER_BATCH": 3})
        batches = list(build_test_loader(cfg, "toy_test", identity_mapper))
        assert batches == [[0, 1, 2], [3, 4, 5], [6]]
    finally:
        DatasetCatalog.remove("toy_test")


@pytest.mark.parametrize(
    "sampler_name", ["RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler"]
)
def test_other_samplers_from_config(sampler_name):
    records = [dict(r, annotations=[{"category_id": r["id"] % 3}]) for r in make_records()]
    cfg = make_cfg(
        **{
            "DATALOADER.SAMPLER_TRAIN": sampler_name,
            "DATALOADER.REPEAT_THRESHOLD": 0.5,
            "DATALOADER.RANDOM_SUBSET_RATIO": 0.5,
        }
    )
    batches = take(build_train_loader(cfg, identity_mapper, dataset=records), 5)
    assert all(len(b) == 4 for b in batches)
    with pytest.raises(ValueError, match="TrainingSampler"):
        build_train_loader(make_cfg(**{"DATALOADER.SAMPLER_TRAIN": "Nope"}), dataset=records)


def test_grouping_bins_are_validated():
    with pytest.raises(ValueError, match="ASPECT_RATIO_BINS"):
        aspect_ratio_bucket_ids(np.array([1.0]), [2.0, 1.0])


def test_persistent_workers_continue_after_the_last_returned_batch():
    records = make_records()
    reference = take(build_train_loader(make_cfg(), identity_mapper, dataset=records), 9)
    cfg = make_cfg(**{"DATALOADER.NUM_WORKERS": 2, "DATALOADER.PERSISTENT_WORKERS": True})
    loader = build_train_loader(cfg, identity_mapper, dataset=records)
    assert take(loader, 4) + take(loader, 5) == reference


def test_finite_loader_passes_continue_the_stream_positions():
    from trainkit.data.samplers import InferenceSampler

    loader = build_batch_data_loader(
        list(range(6)), InferenceSampler(6, rank=0, world_size=1), 4, drop_last=False
    )
    assert take(loader, 10) == [[0, 1, 2, 3], [4, 5]]
    assert loader.last_batch_positions == [4, 5]
    assert take(loader, 10) == [[0, 1, 2, 3], [4, 5]]
    assert loader.last_batch_positions == [10, 11]  # no two returned samples share one
    state = roundtrip(loader.state_dict())
    assert state["pass_offset"] == 6 and state["num_batches"] == 4


def test_finite_loader_stopped_after_its_last_batch_starts_the_next_pass_in_full():
    from trainkit.data.samplers import InferenceSampler

    loader = build_batch_data_loader(list(range(8)), InferenceSampler(8), 4)
    assert take(loader, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # never asked for a third
    assert take(loader, 5) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    mid = build_batch_data_loader(list(range(8)), InferenceSampler(8), 4)
    take(mid, 1)
    resumed = build_batch_data_loader(list(range(8)), InferenceSampler(8), 4)
    resumed.load_state_dict(mid.state_dict())
    assert take(resumed, 5) == [[4, 5, 6, 7]]  # the rest of the pass, then it ends


def test_grouped_finite_loader_has_no_len():
    from trainkit.data.samplers import InferenceSampler

    loader = build_batch_data_loader(
        make_records(12), InferenceSampler(12), 4, aspect_ratio_grouping=True
    )
    with pytest.raises(TypeError, match="grouped"):
        len(loader)


def test_loader_position_is_its_own_not_the_samplers():
    # The loader reads the sampler's global stream from its own state: drawing from the
    # sampler directly, or positioning it, does not move the loader (its state does).
    sampler = TrainingSampler(30, seed=4, rank=0, world_size=1)
    expected = list(itertools.islice(iter(sampler), 8))
    take(sampler, 5)
    loader = build_batch_data_loader(list(range(30)), sampler, 4)
    assert take(loader, 2) == [expected[:4], expected[4:]]
    resumed = build_batch_data_loader(list(range(30)), sampler, 4)
    resumed.load_state_dict(_after_batches(sampler, 1))
    assert take(resumed, 1) == [expected[4:]]


def _after_batches(sampler, num_batches):
    loader = build_batch_data_loader(list(range(30)), sampler, 4)
    take(loader, num_batches)
    return loader.state_dict()


def test_catalog_train_records_without_usable_annotations_are_filtered():
    dicts = [
        {"id": 0, "annotations": [{"category_id": 0}]},
        {"id": 1, "annotations": []},
        {"id": 2, "annotations": [{"category_id": 1, "iscrowd": 1}]},
        {"id": 3},  # no annotations key: not an instance dataset, kept
    ]
    DatasetCatalog.register("toy_annotated", lambda: dicts)
    try:
        cfg = make_cfg(**{"DATASETS.TRAIN": ("toy_annotated",), "SOLVER.IMS_PER_BATCH": 2})
        ids = {i for b in take(build_train_loader(cfg, identity_mapper), 6) for i in b}
        assert ids == {0, 3}
        cfg = make_cfg(
            **{
                "DATASETS.TRAIN": ("toy_annotated",),
                "SOLVER.IMS_PER_BATCH": 2,
                "DATALOADER.FILTER_EMPTY_ANNOTATIONS": False,
            }
        )
        ids = {i for b in take(build_train_loader(cfg, identity_mapper), 6) for i in b}
        assert ids == {0, 1, 2, 3}
    finally:
        DatasetCatalog.remove("toy_annotated")


def test_explicit_loader_passes_dataloader_arguments_through():
    sampler = TrainingSampler(10, seed=0, rank=0, world_size=1)
    loader = build_batch_data_loader(list(range(10)), sampler, 2, num_workers=1, timeout=30)
    assert take(loader, 1) == [take(TrainingSampler(10, seed=0), 2)]
    with pytest.raises(ValueError, match="timeout"):  # torch's own check sees the argument
        build_batch_data_loader(list(range(10)), sampler, 2, num_workers=1, timeout=-1)


def _freeze_count(record):
    return gc.get_freeze_count()


@pytest.mark.parametrize("stream", [False, True], ids=["map-style", "stream"])
def test_forked_workers_leave_the_objects_they_inherit_to_the_training_process(stream):
    # A worker's garbage collector skips what this process held when the worker forked
    # (walking it would copy the whole heap into the worker); this process is unchanged.
    records = list(range(8))
    if stream:
        dataset = MapDataset(ToIterableDataset(records, TrainingSampler(8, seed=0)), _freeze_count)
        sampler = None
    else:
        dataset, sampler = MapDataset(records, _freeze_count), TrainingSampler(8, seed=0)
    assert gc.get_freeze_count() == 0
    batch = next(iter(build_batch_data_loader(dataset, sampler, 2, num_workers=1)))
    assert len(batch) == 2 and all(count > 0 for count in batch)
    assert gc.get_freeze_count() == 0
    gc.freeze()  # what a user froze stays frozen
    try:
        frozen = gc.get_freeze_count()
        next(iter(build_batch_data_loader(dataset, sampler, 2, num_workers=1)))
        # Not unfrozen (that would empty the permanent generation); frozen objects that
        # lost their last reference meanwhile (the first loader's) are freed as usual.
        assert gc.get_freeze_count() > 0.9 * frozen
    finally:
        gc.unfreeze()
