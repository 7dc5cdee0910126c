"""The test loader: every record counts once; a record that fails to map is skipped and reported."""

import logging

import pytest

from trainkit.data import build_test_loader
from trainkit.data.loading.inference_loader import InferenceLoader
from trainkit.data.samplers import InferenceSampler
from trainkit.evaluation import DatasetEvaluator, inference_on_dataset


def _mapper(record):
    if record % 5 == 3:
        return None  # e.g. an unreadable image
    if record == 7:
        raise OSError("cannot read record 7")
    return record


class _Seen(DatasetEvaluator):
    def reset(self):
        self.seen = []

    def process(self, inputs, outputs):
        self.seen.extend(inputs)

    def evaluate(self):
        return {"seen": sorted(self.seen)}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_failed_records_are_skipped_never_replaced(num_workers, caplog):
    loader = build_test_loader(
        list(range(20)), mapper=_mapper, batch_size=4, num_workers=num_workers
    )
    assert isinstance(loader, InferenceLoader)
    evaluator = _Seen()
    with caplog.at_level(logging.WARNING):
        results = inference_on_dataset(lambda batch: batch, loader, evaluator)
    expected = [r for r in range(20) if r % 5 != 3 and r != 7]
    assert results["seen"] == expected  # each once, none twice, the failed ones absent
    assert loader.num_skipped_records == 5
    assert "5 records of this rank's share could not be mapped" in caplog.text
    if num_workers == 0:  # workers log in their own processes
        assert "record 7" in caplog.text


def test_a_batch_whose_records_all_fail_is_left_out():
    loader = build_test_loader(list(range(8)), mapper=lambda r: None if r < 4 else r, batch_size=4)
    assert list(loader) == [[4, 5, 6, 7]]
    assert loader.num_skipped_records == 4


def test_shards_of_uneven_size_cover_every_record_once():
    shards = []
    for rank in range(3):
        sampler = InferenceSampler(10, rank=rank, world_size=3)
        loader = build_test_loader(list(range(10)), mapper=None, sampler=sampler, batch_size=3)
        shards.append([r for batch in loader for r in batch])
    assert sorted(r for shard in shards for r in shard) == list(range(10))


def test_training_replaces_while_evaluation_skips():
    from trainkit.data import build_batch_data_loader
    from trainkit.data.common import MapDataset

    train = build_batch_data_loader(MapDataset(list(range(20)), _mapper), InferenceSampler(20), 20)
    (batch,) = list(train)
    assert len(batch) == 20  # replacements keep the batch full
    test = build_test_loader(list(range(20)), mapper=_mapper, batch_size=20)
    assert len(next(iter(test))) == 15


def test_a_pass_over_the_test_loader_leaves_the_global_rng_alone():
    import torch

    loader = build_test_loader(list(range(8)), mapper=_mapper, batch_size=4, num_workers=2)
    before = torch.get_rng_state()
    list(loader)
    assert torch.equal(before, torch.get_rng_state())
