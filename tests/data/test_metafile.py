"""MetaFileDataset: records of a JSON-lines file read on demand through a line index."""

import itertools
import os
import pickle
import time

import numpy as np
import pytest

from tests.data.metafiles import write_jsonl
from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, MetaFileDataset, TrainingSampler, build_train_loader
from trainkit.data.records import metafile as metafile_module


@pytest.mark.parametrize(
    "options", [{}, {"blank_every": 3}, {"crlf": True}, {"trailing_newline": False}]
)
def test_random_access_matches_the_lines(tmp_path, monkeypatch, options):
    # Private: a scan chunk of 64 bytes puts many chunk boundaries inside a small file.
    monkeypatch.setattr(metafile_module, "_SCAN_CHUNK", 64)
    meta = write_jsonl(tmp_path / "m.jsonl", 200, **options)
    ds = MetaFileDataset(meta)
    assert len(ds) == 200
    for i in np.random.default_rng(0).permutation(200)[:50].tolist() + [0, 199, -1]:
        assert ds[i]["id"] == range(200)[i]
    with pytest.raises(IndexError):
        ds[200]
    assert ds.index_path == tmp_path / "m.jsonl.idx"
    assert not list(tmp_path.glob("*.tmp.*"))  # written through a temporary + os.replace


def test_the_index_is_reused_and_rebuilt_when_the_file_changes(tmp_path):
    meta = write_jsonl(tmp_path / "m.jsonl", 10)
    index = tmp_path / "idx"
    first = MetaFileDataset(meta, index_dir=index)
    (index_file,) = index.glob("m.jsonl.*.idx")
    built = index_file.stat().st_mtime_ns
    MetaFileDataset(meta, index_dir=index)
    assert index_file.stat().st_mtime_ns == built  # reused
    assert len(first) == 10
    write_jsonl(meta, 12)
    os.utime(meta, ns=(time.time_ns(), time.time_ns() + 10**9))  # coarse mtime clocks
    again = MetaFileDataset(meta, index_dir=index)
    assert len(again) == 12 and again[11]["id"] == 11
    index_file.write_bytes(index_file.read_bytes()[:70])  # a truncated index is rebuilt
    assert len(MetaFileDataset(meta, index_dir=index)) == 12


def test_pickles_by_path_and_refuses_a_changed_file(tmp_path):
    meta = write_jsonl(tmp_path / "m.jsonl", 5)
    ds = MetaFileDataset(meta)
    payload = pickle.dumps(ds)
    assert len(payload) < 1000 and pickle.loads(payload)[4]["id"] == 4
    write_jsonl(meta, 6)
    os.utime(meta, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(RuntimeError, match="changed since"):
        pickle.loads(payload)


def test_registers_in_the_catalog_and_trains_with_a_global_shuffle(tmp_path):
    meta = write_jsonl(tmp_path / "m.jsonl", 24)
    DatasetCatalog.register("metafile_test", lambda: MetaFileDataset(meta))
    try:
        cfg = get_cfg()
        cfg.DATASETS.TRAIN = ("metafile_test",)
        cfg.SEED = 0
        cfg.SOLVER.IMS_PER_BATCH = 4
        cfg.DATALOADER.NUM_WORKERS = 0
        cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
        loader = build_train_loader(cfg, mapper=lambda record: record)  # records as they are
        ids = [r["id"] for b in itertools.islice(iter(loader), 6) for r in b]
    finally:
        DatasetCatalog.remove("metafile_test")
    assert ids == list(itertools.islice(iter(TrainingSampler(24, seed=0)), 24))
    assert sorted(ids) == list(range(24))
    assert MetaFileDataset(tmp_path / "m.jsonl")[3] == {"id": 3, "file": "img000003.jpg"}
