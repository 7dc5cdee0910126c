"""A detectron2 user's DatasetFromList code behaves the same (detectron2's
tests/data/test_dataset.py, its DatasetFromList part, plus the documented arguments)."""

import os
import pickle
from functools import partial

import pytest
import torch
from iopath.common.file_io import LazyPath
from torch.utils.data import DataLoader

from trainkit.data import DatasetFromList
from trainkit.data.common import set_default_dataset_from_list_serialize_method


def _path_of(i):
    return f"images/{i:03d}.jpg"


def test_records_holding_lazy_paths_come_back_as_lazy_paths():
    ds = DatasetFromList([{"file_name": LazyPath(partial(_path_of, i))} for i in range(6)])
    for i in range(6):
        path = ds[i]["file_name"]
        assert isinstance(path, LazyPath)
        assert os.fspath(path) == _path_of(i)


def test_a_callable_serialize_is_applied_to_the_list():
    ds = DatasetFromList([4, 5, 6], serialize=torch.tensor)
    assert len(ds) == 3
    assert torch.equal(ds[1], torch.tensor(5))


def test_the_default_method_can_be_swapped_inside_a_with_block():
    with set_default_dataset_from_list_serialize_method(torch.tensor):
        inside = DatasetFromList([7, 8, 9], serialize=True)
        assert torch.equal(inside[2], torch.tensor(9))
    outside = DatasetFromList([7, 8, 9], serialize=True)
    assert outside[2] == 9 and not isinstance(outside[2], torch.Tensor)


def test_the_default_comes_back_when_the_block_raises():
    with pytest.raises(KeyError), set_default_dataset_from_list_serialize_method(tuple):
        raise KeyError("boom")
    assert DatasetFromList([[1, 2]])[0] == [1, 2]  # not the tuple method


def _reversed(records):
    return list(records)[::-1]  # a serialize method whose effect shows in the items


def test_nested_blocks_restore_in_order():
    with set_default_dataset_from_list_serialize_method(torch.tensor):
        with set_default_dataset_from_list_serialize_method(_reversed):
            assert DatasetFromList([1, 2])[0] == 2
        assert torch.equal(DatasetFromList([1, 2])[0], torch.tensor(1))
    assert DatasetFromList([1, 2])[0] == 1


def test_serialize_must_be_a_bool_or_callable():
    with pytest.raises(TypeError, match="serialize"):
        DatasetFromList([1, 2, 3], serialize="yes")
    with pytest.raises(TypeError, match="callable"):
        set_default_dataset_from_list_serialize_method(3)


def test_serialized_records_are_fresh_copies():
    records = [{"id": i, "boxes": [[0, 0, 1, 1]]} for i in range(5)]
    ds = DatasetFromList(records)
    ds[2]["boxes"].append([9, 9, 9, 9])
    assert ds[2] == records[2] and ds[-1] == records[-1]


def test_without_serialization_copy_decides_about_deep_copies():
    records = [{"id": i, "boxes": [[0, 0, 1, 1]]} for i in range(5)]
    copied = DatasetFromList(records, copy=True, serialize=False)
    assert copied[1] == records[1] and copied[1] is not records[1]
    shared = DatasetFromList(records, copy=False, serialize=False)
    assert shared[1] is records[1]
    assert len(shared) == 5


def test_pickles_and_reads_the_same_records():
    ds = pickle.loads(pickle.dumps(DatasetFromList([{"x": i} for i in range(4)])))
    assert [ds[i]["x"] for i in range(4)] == [0, 1, 2, 3]


def test_loader_workers_read_every_record():
    ds = DatasetFromList(list(range(40)))
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    seen = sorted(int(x) for batch in loader for x in batch)
    assert seen == list(range(40))
