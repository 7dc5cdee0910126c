"""One record's way from the config to a batch: its stages in a line, forward only, and few.

The train loader's path (docs/architecture.md lists it as file:function), under
``trainkit/data/``:

built once
1. build.py, train_config.py  the config read into the records, the mapper and the sampler;
                              spec.py: the TrainDataSpec the loader loads
2. catalog.py                 DatasetCatalog.get (utils/catalog.py, below the data package);
                              records/dataset_from_list.py: the machine's one copy
each step, in the training process
3. loading/loader.py          TrainLoader and its batch sampler; the batch unpacked
4. plans/batch_plan.py        the step's records, grouped (plans/grouping.py: each record's
                              bucket, read when the plan first reaches the record)
5. plans/global_stream.py     the global stream's dataset indices
each step, in a loader worker
6. loading/loader.py          the whole batch read, mapped, collated and packed
7. mapping/record_mapper.py   the sample context and failures, around the user's mapper;
                              records/dataset_from_list.py: the record, read

The first test records the call stacks where stages are entered and checks that the modules
on them follow the path (a stage that calls back into an earlier one fails it); the second
counts the trainkit modules a step passes with sys.setprofile.
"""

import os
import sys
import traceback

import pytest

import trainkit
from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, MetadataCatalog, build_train_loader
from trainkit.data.datasets import register_shapes
from trainkit.data.loading import loader as loader_module
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.data.records.dataset_from_list import DatasetFromList
from trainkit.data.samplers import TrainingSampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(trainkit.__file__)))
CNN_SMALL = os.path.join(ROOT, "configs", "shapes", "cnn_small.yaml")

PATH = [
    "build.py",
    "train_config.py",
    "catalog.py",
    "loading/loader.py",
    "spec.py",
    "plans/batch_plan.py",
    "plans/grouping.py",
    "plans/global_stream.py",
    "mapping/record_mapper.py",
    "records/dataset_from_list.py",
]
# What a step may pass of trainkit, the training process and a loader worker together: 8,
# the step's own module (engine/) among them.
MAX_DATA_MODULES_PER_STEP = 7
_STACKS = {}


def _modules(stack):
    """The trainkit/data modules on ``stack``, outermost first, each once in a row."""
    found = []
    for frame in stack:
        if "/trainkit/data/" in frame.filename:
            module = frame.filename.split("/trainkit/data/", 1)[1]
            if not found or found[-1] != module:
                found.append(module)
    return found


def _record(stage):
    stack = _modules(traceback.extract_stack()[:-2])
    if stack not in _STACKS.setdefault(stage, []):  # each way the stage is reached
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
    wrap(loader_module, "pack_in_worker", "pack")
    _STACKS.clear()
    cfg = get_cfg()
    cfg.DATASETS.TRAIN = ("_path_records",)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    cfg.DATALOADER.ASPECT_RATIO_BINS = [1.0]
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.SEED = 0
    loader = build_train_loader(cfg, mapper=_mapper)
    # Built: the catalog read, and the first record only (a dataset without sizes or images
    # fails now); no other stage runs.
    assert _STACKS.pop("catalog") == [["train_config.py", "catalog.py"]]
    built = ["build.py", "loading/loader.py", "spec.py", "plans/grouping.py"]
    assert _STACKS.pop("read") == [built]
    assert not _STACKS
    ids = {i for _, batch in zip(range(12), loader) for i in batch}
    assert 5 in ids
    assert type(loader.records).__name__ == "DatasetFromList"  # the one copy, as it is
    # In the training process: the loader's batch sampler -> the plan -> the global stream
    # (and, the first time the plan reaches a record, its aspect ratio).
    assert _STACKS["stream"] == [["loading/loader.py", "plans/batch_plan.py"]]
    bucket = ["loading/loader.py", "plans/batch_plan.py", "plans/grouping.py"]
    # In a loader worker (here in-process): the whole batch -> the record mapper -> the
    # record and the user's mapper; then the batch is packed for its trip.
    mapped = ["loading/loader.py", "mapping/record_mapper.py"]
    assert _STACKS["read"] == [bucket, mapped]
    assert _STACKS["map"] == [mapped]
    assert _STACKS["pack"] == [["loading/loader.py"]]
    # Forward only: in every stack each module is at or after its caller's on the path.
    for stage, stacks in _STACKS.items():
        for stack in stacks:
            order = [PATH.index(module) for module in stack]
            assert order == sorted(order), (stage, stack)


def _trainkit_module(filename):
    """``data/plans/batch_plan.py`` for a file of trainkit/ or tools/; None for any other."""
    if filename.startswith(ROOT + os.sep):
        relative = os.path.relpath(filename, ROOT)
        for top in ("trainkit" + os.sep, "tools" + os.sep):
            if relative.startswith(top):
                return relative[len("trainkit" + os.sep) :] if top[0] == "t" else relative
    return None


def _profiler(found, started=True, on_new=None):
    """A sys.setprofile function adding the trainkit module of every call to ``found``.

    Not ``started``: it waits for the first batch a loader worker fetches (its start-up,
    worker_init_fn included, is not a step's).
    """
    state = {"started": started}

    def profile(frame, event, arg):
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not state["started"]:
            state["started"] = filename.endswith(os.path.join("_utils", "fetch.py"))
            return
        module = _trainkit_module(filename)
        if module is not None and module not in found:
            found.add(module)
            if on_new is not None:
                on_new(module)

    return profile


@pytest.fixture
def small_shapes(tmp_path):
    """96 images of the shapes dataset, registered as ``_step_modules_train``."""
    register_shapes(str(tmp_path), name_prefix="_step_modules", splits={"train": (96, 0)})
    try:
        yield "_step_modules_train"
    finally:
        DatasetCatalog.remove("_step_modules_train")
        MetadataCatalog.remove("_step_modules_train")


def test_a_step_passes_few_modules_in_the_training_process_and_a_worker(small_shapes, tmp_path):
    cfg = get_cfg()
    cfg.merge_from_file(CNN_SMALL)
    cfg.merge_from_list(["DATASETS.TRAIN", (small_shapes,), "DATALOADER.NUM_WORKERS", 2])
    assert cfg.DATALOADER.ASPECT_RATIO_GROUPING
    seen_by_workers = tmp_path / "worker_modules"

    def profile_worker(worker_id):  # forked: a closure is fine
        def write(module):
            with open(seen_by_workers, "a") as f:
                f.write(module + "\n")

        sys.setprofile(_profiler(set(), started=False, on_new=write))

    mapper = ClassificationDatasetMapper(cfg, is_train=True, dataset_names=cfg.DATASETS.TRAIN)
    loader = build_train_loader(cfg, mapper=mapper, worker_init_fn=profile_worker)
    batches = iter(loader)
    next(batches)  # the workers start
    in_process = set()
    sys.setprofile(_profiler(in_process))
    try:
        for _ in range(10):
            next(batches)
    finally:
        sys.setprofile(None)
    del batches  # the workers stop
    in_workers = set(seen_by_workers.read_text().split())
    assert "data/mapping/record_mapper.py" in in_workers  # the workers' steps were counted
    modules = sorted(in_process | in_workers)
    assert len(modules) <= MAX_DATA_MODULES_PER_STEP, modules
