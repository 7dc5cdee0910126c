"""Streams (IterableDataset) through the train loader: sharded over workers, mapped in batches."""

import itertools

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from trainkit.config import ConfigError
from trainkit.data import batch_rng, build_batch_data_loader, sample_rng
from trainkit.data.common import MapDataset


class Numbers(IterableDataset):
    """0, 1, 2, ... ``length - 1``; with ``iter_from`` it can start anywhere."""

    def __init__(self, length=40, resumable=True):
        self.length = length
        self.resumable = resumable
        self.reads = torch.zeros(length, dtype=torch.int32).share_memory_()

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, position):
        for i in range(position, self.length):
            self.reads[i] += 1
            yield {"id": i, "width": 10 + (i % 3) * 10, "height": 20}


class SelfSharded(Numbers):
    shards_across_workers = True

    def iter_from(self, position):
        info = get_worker_info()
        worker, count = (info.id, info.num_workers) if info else (0, 1)
        mine = range(worker, self.length, count)
        for i in list(mine)[position:]:
            yield {"id": i, "width": 10, "height": 20}


def _ids(record):
    return record["id"]


def _loader(stream, num_workers, batch_size=4, **kwargs):
    return build_batch_data_loader(
        MapDataset(stream, _ids), None, batch_size, num_workers=num_workers, **kwargs
    )


def _expected_batches(length, num_workers, batch_size):
    """The documented rule: worker w reads w, w + n, ...; batches come in turn."""
    per_worker = [list(range(w, length, num_workers)) for w in range(num_workers)]
    batches = [
        [b[i : i + batch_size] for i in range(0, len(b) - batch_size + 1, batch_size)]
        for b in per_worker
    ]
    ordered = []
    for round_ in itertools.zip_longest(*batches):
        ordered += [b for b in round_ if b is not None]
    return ordered


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_every_element_is_read_once_and_batches_follow_the_rule(num_workers):
    stream = Numbers(48)
    batches = list(_loader(stream, num_workers))
    assert batches == _expected_batches(48, max(1, num_workers), 4)
    assert sorted(i for b in batches for i in b) == list(range(48))
    if num_workers > 0:
        # the loader shards before mapping: the workers read the stream (each from its own
        # first element), and each maps only its share
        assert all(1 <= int(r) <= num_workers for r in stream.reads)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_a_stream_that_shards_itself_is_left_alone(num_workers):
    # drop_last=False: each worker's tail becomes a smaller last batch, so all 36 come back
    batches = list(_loader(SelfSharded(36), num_workers, drop_last=False))
    assert sorted(i for b in batches for i in b) == list(range(36))
    full = list(_loader(SelfSharded(36), num_workers))
    assert all(len(b) == 4 for b in full)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("resumable", [True, False], ids=["iter_from", "reread"])
def test_resume_continues_with_the_next_batch(num_workers, resumable):
    reference = list(_loader(Numbers(60), num_workers, aspect_ratio_grouping=True))
    stream = Numbers(60, resumable)
    if not resumable:
        stream.iter_from = None
        del stream.iter_from
    loader = _loader(stream, num_workers, aspect_ratio_grouping=True)
    first = list(itertools.islice(iter(loader), 5))
    assert first == reference[:5]
    state = loader.state_dict()
    resumed = _loader(Numbers(60), num_workers, aspect_ratio_grouping=True)
    resumed.load_state_dict(state)
    assert list(resumed) == reference[5:]


def test_grouping_forms_batches_of_one_bucket_per_worker():
    batches = list(_loader(Numbers(60), 2, aspect_ratio_grouping=True))
    widths = {i: 10 + (i % 3) * 10 for i in range(60)}
    for batch in batches:
        assert len({widths[i] >= 20 for i in batch}) == 1  # tall vs wide (bins 1.0)
        assert len({i % 2 for i in batch}) == 1  # one worker's share


def test_batch_level_mapping_and_per_sample_randomness():
    def mapper(record):
        return (record["id"], float(sample_rng().random()), float(batch_rng().random()))

    loader = build_batch_data_loader(MapDataset(Numbers(24), mapper), None, 4, num_workers=2)
    batches = list(loader)
    again = list(build_batch_data_loader(MapDataset(Numbers(24), mapper), None, 4, num_workers=2))
    assert batches == again
    for batch in batches:
        assert len({b for _, _, b in batch}) == 1  # one batch_rng draw per batch
    assert len({s for batch in batches for _, s, _ in batch}) == 24


def test_resume_with_another_number_of_workers_is_refused():
    loader = _loader(Numbers(40), 2)
    list(itertools.islice(iter(loader), 3))
    other = _loader(Numbers(40), 3)
    # Refused when loaded, before any worker starts.
    with pytest.raises(ConfigError, match="saved with 2 loader workers, this loader has 3"):
        other.load_state_dict(loader.state_dict())


def test_failed_elements_are_skipped_and_counted():
    def mapper(record):
        return None if record["id"] % 7 == 0 else record["id"]

    loader = build_batch_data_loader(MapDataset(Numbers(28), mapper), None, 4, num_workers=0)
    seen = [i for b in loader for i in b]
    assert sorted(seen) == [i for i in range(28) if i % 7]
    assert loader.num_skipped_records == 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_to_iterable_dataset_is_sharded_once(num_workers):
    from trainkit.data import TrainingSampler
    from trainkit.data.common import DatasetFromList, ToIterableDataset
    from trainkit.data.samplers import InferenceSampler

    records = DatasetFromList(list(range(24)), copy=False)
    stream = ToIterableDataset(records, InferenceSampler(24, rank=0, world_size=1))
    batches = list(build_batch_data_loader(stream, None, 4, num_workers=num_workers))
    assert sorted(i for b in batches for i in b) == list(range(24))  # no element lost
    infinite = ToIterableDataset(records, TrainingSampler(24, seed=0, rank=0, world_size=1))
    loader = build_batch_data_loader(infinite, None, 4, num_workers=num_workers)
    first_epoch = [i for b in itertools.islice(iter(loader), 6) for i in b]
    assert sorted(first_epoch) == list(range(24))
