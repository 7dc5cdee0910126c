import itertools
import logging

import pytest
import torch
from torch.utils.data import DataLoader

from trainkit.data import DatasetFromList, MapDataset, ToIterableDataset, sample_rng, sample_seed
from trainkit.data.common import AspectRatioGroupedDataset
from trainkit.data.samplers import InferenceSampler, TrainingSampler


def test_dataset_from_list_serialises_and_returns_fresh_copies():
    records = [{"i": i, "name": f"img{i}.jpg"} for i in range(10)]
    ds = DatasetFromList(records)
    assert len(ds) == 10 and ds[3] == records[3] and ds[-1] == records[-1]
    assert ds.segment_identity is not None  # serialised into one shared segment
    ds[3]["i"] = 99  # a fresh copy each time
    assert ds[3]["i"] == 3
    with pytest.raises(IndexError):
        ds[10]
    plain = DatasetFromList(records, serialize=False)
    assert plain[2] == records[2] and plain[2] is not records[2]
    assert plain.segment_identity is None


def _fail_on_odd(record):
    if record % 2:
        return None
    return record


def test_map_dataset_skips_failing_records_deterministically(caplog):
    ds = MapDataset(list(range(20)), _fail_on_odd)
    with caplog.at_level(logging.WARNING, logger="trainkit.data.common"):
        first = [ds[i] for i in range(20)]
    assert all(x % 2 == 0 for x in first)
    assert first == [ds[i] for i in range(20)]  # same replacements every time
    assert "Skipping record 1 of list" in caplog.text and "consecutive failures" in caplog.text


def _raise_oserror(record):
    if record["path"].startswith("bad"):
        raise OSError(f"cannot read {record['path']}")
    return record["path"]


def test_map_dataset_treats_exceptions_as_failures(caplog):
    records = [{"path": "bad0.jpg"}] + [{"path": f"ok{i}.jpg"} for i in range(9)]
    ds = MapDataset(records, _raise_oserror)
    with caplog.at_level(logging.WARNING, logger="trainkit.data.common"):
        assert ds[0].startswith("ok")
    assert "OSError: cannot read bad0.jpg" in caplog.text


def test_too_many_consecutive_failures_name_the_dataset_and_record():
    ds = MapDataset(
        [{"file": "x.png"}] * 5, lambda r: None, max_consecutive_failures=3, name="toy_train"
    )
    with pytest.raises(
        RuntimeError, match=r"3 records of dataset 'toy_train'.*'file': 'x.png'"
    ) as info:
        ds[0]
    assert "MAX_CONSECUTIVE_FAILURES" in str(info.value)


def _rng_mapper(record):
    return record, float(sample_rng().random()), sample_seed()


def test_sample_context_in_map_dataset_and_error_outside():
    ds = MapDataset(list(range(5)), _rng_mapper)
    assert ds[2] == ds[2] and ds[2][1] != ds[3][1]
    assert ds.map_at(2, seed=1, position=7) != ds.map_at(2, seed=1, position=8)
    with pytest.raises(RuntimeError, match="inside a mapper"):
        sample_rng()
    with pytest.raises(RuntimeError, match="inside a mapper"):
        sample_seed()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_to_iterable_dataset_workers_split_the_stream(num_workers):
    ds = ToIterableDataset(
        list(range(10)), InferenceSampler(10, rank=0, world_size=1), shard_chunk_size=2
    )
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    assert sorted(loader) == list(range(10))


class _NoFullIteration(TrainingSampler):
    """Fails if anything iterates the full stream instead of jumping to a worker's share."""

    def __iter__(self):
        raise AssertionError("ToIterableDataset iterated the whole stream")


def test_to_iterable_dataset_workers_jump_to_their_share_of_a_training_sampler():
    n, num_workers = 30, 2
    sampler = _NoFullIteration(n, seed=2, rank=0, world_size=1)
    ds = ToIterableDataset(list(range(n)), sampler, shard_chunk_size=2)
    loader = DataLoader(
        ds, batch_size=None, num_workers=num_workers, multiprocessing_context="fork"
    )
    batches = iter(loader)
    got = [x for x, _ in zip(batches, range(2 * n))]
    # Stop the workers and their queue threads now: later tests fork launchers from this
    # process, and a fork while a feeder thread holds a lock can hang the child.
    batches._shutdown_workers()
    expected = list(itertools.islice(iter(TrainingSampler(n, seed=2)), 2 * n))
    assert sorted(got) == sorted(expected)  # each worker its chunks, together each index once
    # torch interleaves the workers round-robin, one item at a time: chunks of 2 are
    # dealt to workers in turn, so the reordering is fixed and independent of timing.
    assert sorted(got[: 2 * num_workers]) == sorted(expected[: 2 * num_workers])


def test_aspect_ratio_grouped_dataset_groups_by_orientation():
    samples = [{"width": w, "height": 10} for w in (20, 5, 30, 6, 40, 7)]
    batches = list(AspectRatioGroupedDataset(samples, 3))
    assert [[s["width"] for s in b] for b in batches] == [[20, 30, 40], [5, 6, 7]]


def test_aspect_ratio_grouping_buckets_stay_below_the_batch_after_a_break():
    # detectron2 projects read dataset._buckets as a list of buckets.
    samples = [{"width": w, "height": h} for w, h in [(1, 0), (0, 1), (1, 0), (0, 1)]]
    dataset = AspectRatioGroupedDataset(samples, 2)
    for _ in range(3):
        next(iter(dataset))  # stop after the first batch
        assert len(dataset._buckets) == 2
        assert all(len(bucket) < 2 for bucket in dataset._buckets)


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


def test_iterable_map_dataset_skips_failures_and_gives_up_after_a_run(caplog):
    ds = MapDataset(_Stream([{"path": "ok1"}, {"path": "bad2"}, {"path": "ok3"}]), _raise_oserror)
    with caplog.at_level(logging.WARNING):
        assert list(ds) == ["ok1", "ok3"]
    assert "Skipping element 1 of _Stream" in caplog.text and "cannot read bad2" in caplog.text
    assert len(ds) == 3 and ds.num_failures == 1
    broken = MapDataset(
        _Stream(list(range(5))), lambda r: None, max_consecutive_failures=2, name="toy_stream"
    )
    with pytest.raises(RuntimeError, match=r"2 records of dataset 'toy_stream'.*element 1"):
        list(broken)
