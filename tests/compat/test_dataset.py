"""A detectron2 user's dataset and loader code behaves the same with trainkit's imports.

Mirrors the MapDataset, aspect-ratio grouping and data-loader behaviours of detectron2's
tests/data/test_dataset.py (the DatasetFromList ones live with DatasetFromList), with both
call forms of the loader builders, written against trainkit's names.
"""

import itertools
import pickle

import pytest
import torch

from trainkit.config import get_cfg
from trainkit.data import (
    DatasetCatalog,
    DatasetFromList,
    MapDataset,
    MetadataCatalog,
    ToIterableDataset,
    build_batch_data_loader,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from trainkit.data.build import build_test_loader, build_train_loader
from trainkit.data.common import AspectRatioGroupedDataset
from trainkit.data.samplers import InferenceSampler, TrainingSampler


def double_unless_two(x):
    return None if x == 2 else x * 2


def records(n=24):
    return [{"id": i, "width": 30 if i % 3 else 10, "height": 20} for i in range(n)]


def record_id(record):
    return record["id"]


class Ones(torch.utils.data.IterableDataset):
    """An endless iterable dataset."""

    def __iter__(self):
        while True:
            yield 1


class OneTwoThree(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from [1, 2, 3]


@pytest.fixture
def registered():
    names = []

    def register(name, func):
        DatasetCatalog.register(name, func)
        names.append(name)

    yield register
    for name in names:
        DatasetCatalog.remove(name)
        if name in MetadataCatalog.list():
            MetadataCatalog.remove(name)


def small_cfg(**overrides):
    cfg = get_cfg()
    cfg.SEED = 5
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = 0
    for key, value in overrides.items():
        section, leaf = key.split(".")
        setattr(getattr(cfg, section), leaf, value)
    return cfg


# ----------------------------------------------------------------------------- MapDataset


def test_map_style_none_tries_another_record():
    ds = MapDataset(DatasetFromList([1, 2, 3]), double_unless_two)
    assert ds[0] == 2 and ds[2] == 6
    assert ds[1] in (2, 6)


def test_iterable_dataset_maps_to_an_iterable_that_skips_none():
    ds = MapDataset(OneTwoThree(), double_unless_two)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    assert list(iter(ds)) == [2, 6]
    assert list(ds) == [2, 6]  # iterable again


def test_map_dataset_with_a_lambda_pickles():
    ds = MapDataset(DatasetFromList([1, 2, 3]), lambda x: x * 2)
    ds = pickle.loads(pickle.dumps(ds))
    assert ds[0] == 2
    it = pickle.loads(pickle.dumps(MapDataset(OneTwoThree(), lambda x: x + 1)))
    assert list(it) == [2, 3, 4]


@pytest.mark.slow
def test_lambda_mapper_reaches_spawned_workers():
    ds = MapDataset(DatasetFromList(list(range(6))), lambda x: x * 10)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=1, multiprocessing_context="spawn"
    )
    assert [b.tolist() for b in loader] == [[0, 10, 20], [30, 40, 50]]


# ----------------------------------------------------------------- aspect-ratio grouping


def test_aspect_ratio_grouping_does_not_leak_when_iteration_stops_early():
    samples = [{"width": w, "height": h} for w, h in [(1, 0), (0, 1), (1, 0), (0, 1)]]
    dataset = AspectRatioGroupedDataset(samples, 2)
    for _ in range(5):
        for i, _batch in enumerate(dataset):
            if i == 1:
                break  # the generator is never resumed after this
        # Nothing was left behind: a full pass still gives one batch of each orientation
        # (a bucket kept full at the break would grow past the batch size and never yield).
        batches = list(dataset)
        assert [[s["width"] for s in b] for b in batches] == [[1, 1], [0, 0]]


# ------------------------------------------------------------------------ train loaders


def test_train_loader_from_explicit_arguments():
    loader = build_detection_train_loader(
        records(), mapper=record_id, total_batch_size=4, num_workers=0
    )
    batch = next(iter(loader))
    assert len(batch) == 4 and all(isinstance(i, int) for i in batch)
    # Grouping is on by default in this form: a batch holds one orientation.
    assert len({i % 3 == 0 for i in batch}) == 1


def test_train_loader_over_an_iterable_dataset():
    ds = ToIterableDataset(DatasetFromList(records()), TrainingSampler(24, seed=0))
    loader = build_detection_train_loader(dataset=ds, mapper=lambda r: r, total_batch_size=4)
    assert len(next(iter(loader))) == 4
    with pytest.raises(ValueError, match="sampler=None"):
        build_detection_train_loader(
            ds, mapper=None, sampler=TrainingSampler(24, seed=0), total_batch_size=4
        )


def test_train_loader_from_config_over_a_registered_iterable_dataset(registered):
    registered("compat_iter_data", Ones)
    cfg = small_cfg(**{"DATASETS.TRAIN": ("compat_iter_data",)})
    loader = build_detection_train_loader(cfg, mapper=lambda x: x, aspect_ratio_grouping=False)
    assert next(iter(loader)) == [1, 1, 1, 1]
    test_loader = build_detection_test_loader(cfg, "compat_iter_data", mapper=lambda x: x)
    assert next(iter(test_loader)) == [1]


def test_both_call_forms_give_the_same_resumable_batches():
    cfg = small_cfg(**{"DATALOADER.ASPECT_RATIO_GROUPING": False})
    from_cfg = build_train_loader(cfg, mapper=record_id, dataset=records())
    explicit = build_detection_train_loader(
        records(),
        mapper=record_id,
        total_batch_size=4,
        aspect_ratio_grouping=False,
        seed=5,
    )
    assert build_train_loader is build_detection_train_loader
    expected = list(itertools.islice(from_cfg, 6))
    assert list(itertools.islice(explicit, 6)) == expected
    resumed = build_detection_train_loader(
        records(), mapper=record_id, total_batch_size=4, aspect_ratio_grouping=False, seed=5
    )
    state = explicit.state_dict()
    resumed.load_state_dict(state)
    assert next(iter(resumed)) == next(iter(from_cfg))


def test_config_form_keyword_arguments_override_the_config():
    cfg = small_cfg()  # ASPECT_RATIO_GROUPING is on: the records below lack sizes
    unsized = [{"id": i} for i in range(8)]
    with pytest.raises(ValueError, match="width"):
        build_train_loader(cfg, mapper=record_id, dataset=unsized)
    loader = build_train_loader(cfg, mapper=record_id, dataset=unsized, aspect_ratio_grouping=False)
    assert len(next(iter(loader))) == 4


# ------------------------------------------------------------------ inference loaders


def flatten(loader):
    return [x for batch in loader for x in batch]


def test_batch_data_loader_over_inference_sampler_covers_the_range_each_pass():
    n = 96
    loader = build_batch_data_loader(
        DatasetFromList(list(range(n))), InferenceSampler(n), 8, num_workers=2
    )
    assert len(loader) == 12
    for _ in range(2):  # a finished finite loader can be iterated again
        data = flatten(loader)
        assert len(data) == n and set(data) == set(range(n))


def test_batch_data_loader_with_an_unfinished_last_batch():
    loader = build_batch_data_loader(list(range(10)), InferenceSampler(10), 4, drop_last=False)
    assert len(loader) == 3 and flatten(loader) == list(range(10))
    dropping = build_batch_data_loader(list(range(10)), InferenceSampler(10), 4)
    assert len(dropping) == 2 and flatten(dropping) == list(range(8))


@pytest.mark.parametrize(("batch_size", "num_workers"), [(1, 2), (4, 0)])
def test_test_loader_from_explicit_arguments(batch_size, num_workers):
    n = 50
    ds = DatasetFromList(list(range(n)))
    loader = build_detection_test_loader(
        dataset=ds,
        sampler=InferenceSampler(n),
        mapper=lambda x: x,
        batch_size=batch_size,
        num_workers=num_workers,
    )
    assert len(loader) == -(-n // batch_size)
    data = flatten(loader)
    assert len(data) == n and set(data) == set(range(n))


def test_test_loader_over_an_iterable_dataset():
    n = 50
    ds = ToIterableDataset(DatasetFromList(list(range(n))), InferenceSampler(n))
    loader = build_detection_test_loader(dataset=ds, mapper=lambda x: x, num_workers=2)
    data = flatten(loader)
    assert len(data) == n and set(data) == set(range(n))


def test_test_loader_from_config_and_its_alias(registered):
    registered("compat_test", lambda: [{"id": i} for i in range(7)])
    cfg = small_cfg(**{"TEST.IMS_PER_BATCH": 3})
    assert build_test_loader is build_detection_test_loader
    loader = build_test_loader(cfg, "compat_test", mapper=record_id)
    assert len(loader) == 3 and list(loader) == [[0, 1, 2], [3, 4, 5], [6]]
    same = build_detection_test_loader(cfg, "compat_test", mapper=lambda record: record)
    assert flatten(same) == [{"id": i} for i in range(7)]
    assert flatten(build_test_loader(cfg, "compat_test", batch_size=7, mapper=record_id)) == list(
        range(7)
    )


def test_infinite_train_loader_has_no_len():
    loader = build_detection_train_loader(
        list(range(8)), mapper=None, total_batch_size=2, aspect_ratio_grouping=False, seed=0
    )
    with pytest.raises(TypeError, match="infinite"):
        len(loader)


# ---------------------------------------------------------- get_detection_dataset_dicts


def test_dataset_dicts_filter_crowd_only_and_empty_records(registered):
    dicts = [
        {"id": 0, "annotations": [{"iscrowd": 0, "category_id": 1}]},
        {"id": 1, "annotations": [{"iscrowd": 1, "category_id": 1}]},
        {"id": 2, "annotations": []},
        {"id": 3, "annotations": [{"category_id": 2, "keypoints": [1, 1, 2, 5, 5, 0]}]},
    ]
    registered("compat_dicts", lambda: dicts)
    assert [r["id"] for r in get_detection_dataset_dicts("compat_dicts")] == [0, 3]
    kept = get_detection_dataset_dicts(["compat_dicts"], filter_empty=False)
    assert [r["id"] for r in kept] == [0, 1, 2, 3]
    assert [r["id"] for r in get_detection_dataset_dicts("compat_dicts", min_keypoints=1)] == [3]
    with pytest.raises(NotImplementedError, match="proposal"):
        get_detection_dataset_dicts("compat_dicts", proposal_files=["p.pkl"])


def test_dataset_dicts_returns_dataset_objects_as_they_are(registered):
    registered("compat_iterable", Ones)
    assert isinstance(get_detection_dataset_dicts("compat_iterable"), Ones)
    registered("compat_map_a", lambda: DatasetFromList([1, 2]))
    registered("compat_map_b", lambda: DatasetFromList([3]))
    joined = get_detection_dataset_dicts(["compat_map_a", "compat_map_b"])
    assert [joined[i] for i in range(len(joined))] == [1, 2, 3]


def test_dataset_dicts_refuse_datasets_with_different_classes(registered):
    for name, classes in [("compat_a", ["cat"]), ("compat_b", ["dog"])]:
        registered(name, lambda: [{"annotations": [{"category_id": 0}]}])
        MetadataCatalog.get(name).thing_classes = classes
    with pytest.raises(ValueError, match="thing_classes"):
        get_detection_dataset_dicts(["compat_a", "compat_b"])
    assert len(get_detection_dataset_dicts(["compat_a", "compat_b"], check_consistency=False)) == 2
