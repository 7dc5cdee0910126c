"""Mistakes in data settings and inputs are UsageErrors whose message names the key or file."""

import json

import pytest
from PIL import Image

from tests.dist import run_on_ranks
from trainkit.config import ConfigError, get_cfg
from trainkit.data import (
    DatasetCatalog,
    MapDataset,
    MetadataCatalog,
    MetaFileDataset,
    RankDataset,
    build_test_loader,
    build_train_loader,
)
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.data.plans.batch_plan import RankBatchPlan
from trainkit.data.samplers import RandomSubsetTrainingSampler, TrainingSampler
from trainkit.data.train_config import check_train_loader_config
from trainkit.utils import UsageError
from trainkit.utils.errors import MissingFileError, UnknownNameError


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.SEED = 0
    cfg.SOLVER.IMS_PER_BATCH = 2
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.merge_from_list([x for kv in overrides.items() for x in kv])
    return cfg


def _records(n=8):
    return [{"id": i, "width": 10, "height": 10} for i in range(n)]


@pytest.fixture
def registered():
    """Register catalog entries for one test and remove them afterwards."""
    names = []

    def register(name, func, **metadata):
        DatasetCatalog.register(name, func)
        names.append(name)
        if metadata:
            MetadataCatalog.get(name).set(**metadata)

    yield register
    for name in names:
        DatasetCatalog.remove(name)
        if name in MetadataCatalog.list():  # loaders may have created an empty entry
            MetadataCatalog.remove(name)


def test_unknown_dataset_is_an_unknown_name_error_naming_it_and_the_key():
    with pytest.raises(UnknownNameError) as info:
        build_train_loader(_cfg(**{"DATASETS.TRAIN": ("no_such_set",)}))
    assert isinstance(info.value, KeyError)
    assert "'no_such_set' is not registered" in str(info.value)
    assert "DATASETS.TRAIN" in str(info.value)


def test_empty_dataset_is_a_config_error_naming_it(registered):
    registered("empty_set", lambda: [])
    with pytest.raises(ConfigError, match=r"dataset 'empty_set' is empty.*DATASETS\.TRAIN"):
        build_train_loader(_cfg(**{"DATASETS.TRAIN": ("empty_set",)}))


def test_no_dataset_named_is_a_config_error():
    with pytest.raises(ConfigError, match=r"DATASETS\.TRAIN"):
        build_train_loader(_cfg())


@pytest.mark.parametrize(
    "key, value",
    [
        ("DATALOADER.NUM_WORKERS", "-1"),
        ("DATALOADER.SAMPLER_TRAIN", "Shuffler"),
        ("DATALOADER.MAX_CONSECUTIVE_FAILURES", "0"),
        ("DATALOADER.ASPECT_RATIO_BINS", "(2.0, 1.0)"),
        ("SOLVER.IMS_PER_BATCH", "3"),
        ("SOLVER.ACCUMULATE_STEPS", "0"),
    ],
)
def test_loader_settings_out_of_range_are_config_errors_naming_the_key(key, value):
    cfg = _cfg(**{key: value, "DATALOADER.ASPECT_RATIO_GROUPING": "True"})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_train_loader_config(cfg, world_size=2)


@pytest.mark.parametrize(
    "sampler, key, value",
    [
        ("RandomSubsetTrainingSampler", "DATALOADER.RANDOM_SUBSET_RATIO", "0.0"),
        ("RepeatFactorTrainingSampler", "DATALOADER.REPEAT_THRESHOLD", "-0.5"),
    ],
)
def test_sampler_settings_are_checked_before_loading_data(sampler, key, value):
    cfg = _cfg(**{"DATALOADER.SAMPLER_TRAIN": sampler, key: value})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_train_loader_config(cfg, world_size=1)


def test_random_subset_sampler_ratio_is_a_config_error():
    with pytest.raises(ConfigError, match="RANDOM_SUBSET_RATIO"):
        RandomSubsetTrainingSampler(10, 1.5, seed_shuffle=0, seed_subset=0)


def test_grouping_without_record_sizes_is_a_config_error():
    cfg = _cfg(**{"DATALOADER.ASPECT_RATIO_GROUPING": "True"})
    with pytest.raises(ConfigError, match="ASPECT_RATIO_GROUPING"):
        build_train_loader(cfg, dataset=[{"id": 0}])


def test_test_batch_size_below_one_is_a_config_error(registered):
    registered("small_test", lambda: _records(3))
    with pytest.raises(ConfigError, match=r"TEST\.IMS_PER_BATCH"):
        build_test_loader(_cfg(**{"TEST.IMS_PER_BATCH": "0"}), "small_test")


def test_resuming_with_another_batch_size_is_a_config_error_but_another_rank_is_a_bug():
    sampler = TrainingSampler(8, seed=0, rank=0, world_size=1)
    saved = RankBatchPlan(sampler, 2).state_dict()
    with pytest.raises(ConfigError, match=r"SOLVER\.IMS_PER_BATCH"):
        RankBatchPlan(sampler, 4).load_state_dict(saved)
    other_rank = {**saved, "rank": 1}
    with pytest.raises(ValueError, match="its own loader") as info:
        RankBatchPlan(sampler, 2).load_state_dict(other_rank)
    assert not isinstance(info.value, UsageError)


def test_sampler_state_of_another_seed_is_a_config_error_naming_seed():
    saved = TrainingSampler(8, seed=0, rank=0, world_size=1).state_dict()
    with pytest.raises(ConfigError, match="SEED"):
        TrainingSampler(8, seed=1, rank=0, world_size=1).load_state_dict(saved)


# ---- mappers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value",
    [
        ("INPUT.RANDOM_FLIP_PROB", "1.5"),
        ("INPUT.RANDOM_SCALE", "(2.0, 1.0)"),
        ("INPUT.MAX_SIZE_TRAIN", "-1"),
        ("INPUT.MAX_SIZE_TEST", "-1"),
    ],
)
def test_mapper_settings_out_of_range_are_config_errors_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ClassificationDatasetMapper(_cfg(**{key: value}), is_train=True)


def test_mapper_refuses_a_dataset_with_more_classes_than_the_model(registered):
    registered("three_classes", _records, thing_classes=["a", "b", "c"])
    registered("no_class_list", _records)
    cfg = _cfg(**{"MODEL.NUM_CLASSES": "2"})
    with pytest.raises(
        ConfigError,
        match=r"MODEL\.NUM_CLASSES=2 but dataset 'three_classes' has 3 classes; "
        r"set MODEL\.NUM_CLASSES 3",
    ):
        ClassificationDatasetMapper(cfg, dataset_names=["no_class_list", "three_classes"])
    # Enough classes, or datasets without thing_classes, pass; without names nothing is read.
    ClassificationDatasetMapper(_cfg(**{"MODEL.NUM_CLASSES": "3"}), dataset_names=["three_classes"])
    ClassificationDatasetMapper(cfg, dataset_names=["no_class_list"])
    ClassificationDatasetMapper(cfg)
    with pytest.raises(TypeError, match="cfg"):
        ClassificationDatasetMapper(dataset_names=["three_classes"])


# ---- MapDataset never hides a user error -----------------------------------------------
class _CountingMapper:
    def __init__(self, error):
        self.calls = 0
        self.error = error

    def __call__(self, record):
        self.calls += 1
        raise self.error


def test_map_dataset_raises_a_mappers_usage_error_at_once_instead_of_retrying():
    mapper = _CountingMapper(ConfigError("INPUT.FOO is bad; fix INPUT.FOO"))
    dataset = MapDataset(list(range(10)), mapper, max_consecutive_failures=5)
    with pytest.raises(ConfigError, match="INPUT.FOO is bad"):
        dataset[3]
    assert mapper.calls == 1 and dataset.num_failures == 0


def test_map_dataset_still_retries_other_errors():
    mapper = _CountingMapper(OSError("unreadable"))
    dataset = MapDataset(list(range(10)), mapper, max_consecutive_failures=5)
    with pytest.raises(RuntimeError, match="5 records"):
        dataset[3]
    assert mapper.calls == 5


def test_iterable_map_dataset_raises_a_usage_error_at_once():
    import torch

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    mapper = _CountingMapper(MissingFileError("labels.json not found; check INPUT.LABELS"))
    with pytest.raises(MissingFileError, match="labels.json"):
        list(MapDataset(Stream(), mapper, max_consecutive_failures=5))
    assert mapper.calls == 1


def _mapper_with_bad_setting(record):
    raise ConfigError("INPUT.FOO=3 is out of range; set INPUT.FOO to 0 or 1")


@pytest.mark.slow
def test_usage_error_in_a_loader_worker_keeps_its_one_line_message():
    cfg = _cfg(**{"DATALOADER.NUM_WORKERS": "1"})
    loader = build_train_loader(cfg, _mapper_with_bad_setting, dataset=_records())
    with pytest.raises(ConfigError) as info:
        next(iter(loader))
    # torch re-raises it as "Caught ConfigError in DataLoader worker process 0. <traceback>".
    assert str(info.value) == "INPUT.FOO=3 is out of range; set INPUT.FOO to 0 or 1"


# ---- files -------------------------------------------------------------------------------
def test_missing_meta_file_is_a_missing_file_error_naming_it(tmp_path):
    missing = tmp_path / "train.jsonl"
    for open_it in (MetaFileDataset, RankDataset):
        with pytest.raises(MissingFileError, match=str(missing)) as info:
            open_it(missing) if open_it is MetaFileDataset else open_it(
                missing, world_size=1, rank=0
            )
        assert isinstance(info.value, FileNotFoundError)


def test_rank_dataset_with_too_few_records_is_a_config_error(tmp_path):
    meta = tmp_path / "train.jsonl"
    meta.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(3)))
    with pytest.raises(ConfigError, match=r"train\.jsonl has 3 records.*mini_epochs"):
        RankDataset(meta, mini_epochs=2, world_size=2, rank=0, index_dir=tmp_path)
    with pytest.raises(ConfigError, match="mini_epochs must be >= 1"):
        RankDataset(meta, mini_epochs=0, world_size=1, rank=0, index_dir=tmp_path)


def test_unreadable_image_is_still_a_skipped_record_not_a_usage_error(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (4, 4)).save(good)
    mapper = ClassificationDatasetMapper(is_train=False)
    assert mapper({"file_name": str(tmp_path / "missing.png"), "label": 0}) is None
    assert mapper({"file_name": str(good), "label": 0})["label"] == 0


# ---- every local rank reports local rank 0's user error ----------------------------------
def _load_empty_dataset():
    from trainkit.data import DatasetCatalog
    from trainkit.data.catalog import load_catalog_dataset

    DatasetCatalog.register("empty_everywhere", lambda: [])
    try:
        load_catalog_dataset("empty_everywhere")
    except Exception as e:  # returned, so that the test sees every rank's error
        from trainkit.utils import UsageError

        return type(e).__name__, isinstance(e, UsageError), str(e)
    return None


@pytest.mark.slow
@pytest.mark.distributed
def test_other_local_ranks_raise_the_same_user_error_as_local_rank_zero():
    results = run_on_ranks(_load_empty_dataset, 2, timeout_s=120.0)
    assert results[0] == results[1]
    name, is_usage_error, message = results[1]
    assert name == "ConfigError" and is_usage_error
    assert "dataset 'empty_everywhere' is empty" in message
