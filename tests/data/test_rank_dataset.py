"""RankDataset and RankDataLoader: each rank reads only its share of a metadata file."""

import itertools
import pickle

import numpy as np
import pytest

from tests.data.metafiles import write_jsonl
from trainkit.data import RankDataLoader, RankDataset, sample_rng
from trainkit.data.rank_dataset import rank_share


@pytest.mark.parametrize(
    ("world_size", "mini_epochs", "num_records"), [(1, 1, 10), (3, 2, 101), (4, 3, 12)]
)
def test_rank_shares_partition_every_epoch(world_size, mini_epochs, num_records):
    for full_epoch in range(3):
        shares = [
            rank_share(
                num_records,
                seed=9,
                epoch=full_epoch * mini_epochs + part,
                mini_epochs=mini_epochs,
                rank=rank,
                world_size=world_size,
            )
            for part in range(mini_epochs)
            for rank in range(world_size)
        ]
        merged = np.concatenate(shares)
        assert sorted(merged.tolist()) == list(range(num_records))
        sizes = [s.size for s in shares]
        assert max(sizes) - min(sizes) <= 1 + (num_records % mini_epochs > 0)
    first = rank_share(101, seed=9, epoch=0, mini_epochs=1, rank=0, world_size=3)
    second = rank_share(101, seed=9, epoch=1, mini_epochs=1, rank=0, world_size=3)
    assert set(first.tolist()) != set(second.tolist())  # reshuffled every epoch


def test_a_rank_holds_only_its_share_and_rebuilds_it_every_epoch(tmp_path):
    meta = write_jsonl(tmp_path / "meta.jsonl", 60)
    datasets = [RankDataset(meta, seed=1, mini_epochs=2, world_size=3, rank=r) for r in range(3)]
    previous: list[int] = []  # the ids of the other mini-epoch of the same epoch
    for epoch in range(4):
        seen = []
        for ds in datasets:
            ds.set_epoch(epoch)
            assert len(ds) == 10  # 60 / (3 ranks * 2 mini-epochs)
            seen += [ds[i]["id"] for i in range(len(ds))]
        assert len(set(seen)) == 30
        if epoch % 2 == 1:
            assert sorted(previous + seen) == list(range(60))
        previous = seen
    clone = pickle.loads(pickle.dumps(datasets[0]))
    assert [clone[i] for i in range(3)] == [datasets[0][i] for i in range(3)]
    with pytest.raises(ValueError, match="fewer than world_size"):
        RankDataset(meta, mini_epochs=30, world_size=3, rank=0)


def _tag(record):
    return record["id"], int(sample_rng().integers(1000))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_streams_share_after_share_and_resumes(tmp_path, num_workers):
    meta = write_jsonl(tmp_path / "meta.jsonl", 41)

    def make():
        ds = RankDataset(meta, seed=2, mini_epochs=2, world_size=2, rank=1)
        return RankDataLoader(ds, 3, mapper=_tag, num_workers=num_workers)

    shares = []
    probe = RankDataset(meta, seed=2, mini_epochs=2, world_size=2, rank=1)
    for epoch in range(3):
        probe.set_epoch(epoch)
        shares.append(sorted(probe.share_indices().tolist()))
    straight = make()
    batches = list(itertools.islice(iter(straight), 9))
    ids = [sample[0] for batch in batches for sample in batch]
    if num_workers == 0:  # (workers interleave their parts of each share batch by batch)
        # Mini-epoch after mini-epoch, this rank's share of each, every record once.
        n0, n1 = len(shares[0]), len(shares[1])
        assert sorted(ids[:n0]) == shares[0] and sorted(ids[n0 : n0 + n1]) == shares[1]
        assert set(ids[n0 + n1 :]) <= set(shares[2])
    assert set(ids) <= set(shares[0]) | set(shares[1]) | set(shares[2])
    first = make()
    head = list(itertools.islice(iter(first), 4))
    resumed = make()
    resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
    assert head + list(itertools.islice(iter(resumed), 5)) == batches
