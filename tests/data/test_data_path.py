"""One record's way from the config to a batch: the stages it passes, in a line, forward only.

The train loader's path (docs/architecture.md draws it):

1. build.py          build_train_loader(cfg): train_config.py reads the config into the
                     records, the mapper and the sampler, spec.py's TrainDataSpec holds
                     them (no MapDataset built and taken apart), the loader loads it
2. catalog.py        load_catalog_parts -> DatasetCatalog.get (utils/catalog.py, below
                     the data package): the records
3. loader.py         TrainLoader, each step: _PlannedBatches (the torch loader's batch
                     sampler), then _MappedRecords (a loader worker maps the whole batch)
4. batch_plan.py     GlobalBatchPlan: step s's records (grouped by grouping.py's Buckets;
                     each record's bucket is read once, when the plan first reaches it:
                     from its width/height, or from its image header), this rank's
                     micro-batch
5. global_stream.py  global_indices: the global stream
6. record_mapper.py  RecordMapper: the sample context, failures, the user's mapper
7. dataset_from_list.py  DatasetFromList: the machine's one copy of the records, read
8. loader_workers.py     the collated batch packed in one buffer per dtype, then unpacked

grouping.py and loader_state.py (the loader's position) are helpers of stages 3 and 4 that
call nothing back. These tests record the call stacks where each stage is entered and assert
exactly those trainkit frames: a new stage fails them, and so does a stage that calls back
into one earlier on the path.
"""

import traceback

import pytest

from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, build_train_loader
from trainkit.data.loading import loader_workers as loader_workers_module
from trainkit.data.records.dataset_from_list import DatasetFromList
from trainkit.data.samplers import TrainingSampler

PATH = [
    "build.py",
    "train_config.py",
    "catalog.py",
    "loader.py",
    "spec.py",
    "batch_plan.py",
    "grouping.py",  # a helper of batch_plan.py, and of build.py for the record sizes
    "global_stream.py",
    "record_mapper.py",
    "dataset_from_list.py",
    "loader_workers.py",
]
_STACKS = {}


def _module(filename):
    return filename.split("/trainkit/data/", 1)[1].split("/")[-1]


def _trainkit_frames(stack):
    """(module, function) of the frames inside trainkit/data, outermost first."""
    return [
        (_module(frame.filename), frame.name)
        for frame in stack
        if "/trainkit/data/" in frame.filename
    ]


def _record(stage):
    stack = _trainkit_frames(traceback.extract_stack()[:-2])
    if stage != "read":
        _STACKS.setdefault(stage, stack)
    elif stack not in _STACKS.setdefault(stage, []):  # each way a record is read
        _STACKS[stage].append(stack)


def _mapper(record):
    if record["id"] == 5:
        _record("map")
    return record["id"]


@pytest.fixture
def registered():
    records = [{"id": i, "width": 10 + i % 3, "height": 12} for i in range(24)]

    def load():
        _record("catalog")
        return records

    DatasetCatalog.register("_path_records", load)
    try:
        yield
    finally:
        DatasetCatalog.remove("_path_records")


def test_a_record_passes_each_stage_once_in_a_line(registered, monkeypatch):
    def wrap(owner, name, stage):
        original = getattr(owner, name)

        def recorded(*args, **kwargs):
            _record(stage)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)

    wrap(TrainingSampler, "global_indices", "stream")
    wrap(DatasetFromList, "__getitem__", "read")
    wrap(loader_workers_module, "pack_in_worker", "pack")
    _STACKS.clear()
    cfg = get_cfg()
    cfg.DATASETS.TRAIN = ("_path_records",)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    cfg.DATALOADER.ASPECT_RATIO_BINS = [1.0]
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 0
    loader = build_train_loader(cfg, mapper=_mapper)
    # While building, only the first record is read (a dataset without sizes or images
    # fails now); each other record's aspect ratio is read when the plan first reaches it.
    assert _STACKS.pop("read") == [
        [
            ("build.py", "build_detection_train_loader"),
            ("loader.py", "__init__"),
            ("spec.py", "plan"),
            ("spec.py", "bucket_ids"),
            ("grouping.py", "record_bucket_ids"),
        ]
    ]
    ids = {i for _, batch in zip(range(12), loader) for i in batch}
    assert 5 in ids
    # What the loader reads: one serialised copy of the unmapped records.
    assert type(loader.records).__name__ == "DatasetFromList"
    # The config form reads the catalog (no other stage between).
    assert _STACKS["catalog"] == [
        ("train_config.py", "train_loader_arguments"),
        ("catalog.py", "load_catalog_parts"),
        ("catalog.py", "_named_datasets"),
        ("catalog.py", "_catalog_part"),
    ]
    # Batch composition, in the training process: loader -> batch sampler -> plan.
    planned = [
        ("loader.py", "__iter__"),
        ("loader.py", "_iter_planned"),
        ("loader.py", "__iter__"),  # _PlannedBatches, driven by torch
        ("loader.py", "_from"),
    ]
    assert _STACKS["stream"] == [
        *planned,
        ("batch_plan.py", "__iter__"),
        ("batch_plan.py", "_compose"),  # the step's whole batch (step_records lists it too)
        ("batch_plan.py", "_read"),
    ]
    # Loading (a worker, here in-process): the mapped batch -> the record mapper -> user.
    mapped = [
        ("loader.py", "__iter__"),
        ("loader.py", "_iter_planned"),
        ("loader.py", "__getitems__"),  # _MappedRecords: the whole batch at once
        ("record_mapper.py", "map_replacing"),
    ]
    assert _STACKS["map"] == [*mapped, ("record_mapper.py", "_try")]
    # The record is read by the plan, for its aspect ratio (the first epoch only), and by the
    # mapper, from the machine's one copy.
    bucket = [*planned, ("batch_plan.py", "__iter__"), ("batch_plan.py", "_compose")]
    bucket += [("batch_plan.py", "_read"), ("grouping.py", "<genexpr>")]
    bucket += [("grouping.py", "__getitem__")]
    assert _STACKS["read"] == [bucket, mapped]
    # The batch, collated, is packed for its trip from a worker to this process.
    assert _STACKS["pack"] == [
        ("loader.py", "__iter__"),
        ("loader.py", "_iter_planned"),
        ("loader_workers.py", "__call__"),  # PackedCollate: the user's collate, then pack
    ]
    # Forward only: in every stack each frame's stage is at or after its caller's.
    stacks = [(stage, frames) for stage, frames in _STACKS.items() if stage != "read"]
    for stage, frames in stacks + [("read", frames) for frames in _STACKS["read"]]:
        order = [PATH.index(module) for module, _ in frames]
        assert order == sorted(order), (stage, frames)
    assembly = ("train_config.py", "spec.py", "grouping.py")  # build time, or a helper
    assert len([module for module in PATH if module not in assembly]) <= 8
