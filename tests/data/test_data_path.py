"""One record's way from the config to a batch: the stages it passes, in a line.

The train loader's path is: catalog -> DatasetFromList (one copy per machine) -> record
facts (aspect ratios, read once from the unmapped records) -> the sampler's global stream
-> StepBatchComposer (the step's batch, this rank's micro-batch) -> _PlannedBatches (the
torch loader's batch sampler) -> _MappedRecords (a worker reads and maps the whole batch)
-> RecordMapper (the sample context, failures) -> the user's mapper -> collate ->
TrainLoader. These tests record the call stack where a record is mapped and where the
global stream is read, and assert exactly those trainkit frames: a new stage, or a stage
that calls back up, makes them fail.
"""

import traceback

import pytest

from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, build_train_loader
from trainkit.data.samplers import TrainingSampler

_STACKS = {}


def _trainkit_frames(stack):
    """(module file name, function) of the frames inside trainkit/data, outermost first."""
    return [
        (frame.filename.rsplit("/", 1)[-1], frame.name)
        for frame in stack
        if "/trainkit/data/" in frame.filename
    ]


def _mapper(record):
    if record["id"] == 5:
        _STACKS["map"] = _trainkit_frames(traceback.extract_stack())
    return record["id"]


@pytest.fixture
def registered():
    records = [{"id": i, "width": 10 + i % 3, "height": 12} for i in range(24)]
    DatasetCatalog.register("_path_records", lambda: records)
    try:
        yield
    finally:
        DatasetCatalog.remove("_path_records")


def test_a_record_passes_each_stage_once_in_a_line(registered, monkeypatch):
    original = TrainingSampler.global_indices

    def global_indices(self, start, count):
        _STACKS.setdefault("stream", _trainkit_frames(traceback.extract_stack()))
        return original(self, start, count)

    monkeypatch.setattr(TrainingSampler, "global_indices", global_indices)
    cfg = get_cfg()
    cfg.DATASETS.TRAIN = ("_path_records",)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    cfg.DATALOADER.ASPECT_RATIO_BINS = [1.0]
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 0
    loader = build_train_loader(cfg, mapper=_mapper)
    ids = {i for _, batch in zip(range(12), loader) for i in batch}
    assert 5 in ids
    # What the loader reads: one serialised copy of the unmapped records.
    assert type(loader.records).__name__ == "DatasetFromList"
    # Batch composition, in the training process: loader -> batch sampler -> composer.
    assert _STACKS["stream"] == [
        ("loader.py", "__iter__"),
        ("loader.py", "_iter_planned"),
        ("loader.py", "__iter__"),  # _PlannedBatches, driven by torch
        ("loader.py", "_from"),
        ("batch_plan.py", "__iter__"),
        ("batch_plan.py", "_global_records"),
    ]
    # Loading (a worker, here in-process): the mapped batch -> the record mapper -> user.
    assert _STACKS["map"] == [
        ("loader.py", "__iter__"),
        ("loader.py", "_iter_planned"),
        ("loader.py", "__getitems__"),  # _MappedRecords: the whole batch at once
        ("mapping.py", "map_replacing"),
        ("mapping.py", "_try"),
    ]
