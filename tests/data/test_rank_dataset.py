"""RankDataset, RankStream and RankDataLoader: each rank reads only its share of a metadata file.

One loader serves every epoch; the shares are read by disjoint loader workers.
"""

import itertools
import json
import pickle

import numpy as np
import pytest

from tests.data.metafiles import write_jsonl
from trainkit.data import RankDataLoader, RankDataset, sample_rng
from trainkit.data.records.rank_dataset import RankStream, rank_share


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


def test_a_catalog_entry_returning_a_rank_dataset_trains_on_its_shares(tmp_path):
    from trainkit.config import get_cfg
    from trainkit.data import DatasetCatalog, build_train_loader

    meta = write_jsonl(tmp_path / "meta.jsonl", 40)
    DatasetCatalog.register(
        "rank_dataset_test", lambda: RankDataset(meta, seed=2, world_size=2, rank=1)
    )
    cfg = get_cfg()
    cfg.merge_from_list(["DATASETS.TRAIN", "('rank_dataset_test',)", "SOLVER.IMS_PER_BATCH", "4"])
    cfg.merge_from_list(["DATALOADER.NUM_WORKERS", 0, "DATALOADER.ASPECT_RATIO_GROUPING", False])
    try:
        # Records without file_name: the default DatasetMapper would refuse them.
        loader = build_train_loader(cfg, mapper=lambda record: record)
        ids = [r["id"] for b in itertools.islice(iter(loader), 10) for r in b]
    finally:
        DatasetCatalog.remove("rank_dataset_test")
    probe = RankDataset(meta, seed=2, world_size=2, rank=1)
    for epoch in range(2):  # this rank's share of each epoch in turn, shuffled within it
        probe.set_epoch(epoch)
        assert sorted(ids[20 * epoch : 20 * (epoch + 1)]) == probe.share_indices().tolist()
    assert loader.state_dict()["source"]["type"] == "RankStream"


# ---- RankStream / RankDataLoader: one loader for every epoch -----------------------------
def _meta(tmp_path, n):
    path = tmp_path / "meta.jsonl"
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(n)))
    return path


def _share(meta, epoch, rank, world_size, mini_epochs):
    ds = RankDataset(meta, seed=2, mini_epochs=mini_epochs, world_size=world_size, rank=rank)
    ds.set_epoch(epoch)
    return sorted(ds[i]["id"] for i in range(len(ds)))


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_each_epoch_reads_the_ranks_share_once_with_one_loader(tmp_path, num_workers):
    meta = _meta(tmp_path, 37)
    ds = RankDataset(meta, seed=2, mini_epochs=2, world_size=2, rank=1)
    loader = RankDataLoader(ds, 1, mapper=lambda r: r["id"], num_workers=num_workers)
    workers = max(1, num_workers)
    shares = [_share(meta, e, 1, 2, 2) for e in range(4)]
    ids = [b[0] for b in itertools.islice(iter(loader), sum(map(len, shares)) - workers)]
    # Worker w reads positions w, w + n, ... of each epoch's share, epoch after epoch; the
    # loader returns one batch of each worker in turn.
    parts = {w: ids[w::workers] for w in range(workers)}
    for w, part in parts.items():
        start = 0
        for share in shares:
            mine = len(range(w, len(share), workers))
            chunk = part[start : start + mine]
            assert set(chunk) <= set(share) and len(set(chunk)) == len(chunk)
            start += mine
    seen = {w: 0 for w in parts}
    for share in shares[:2]:  # one full epoch: each record of it exactly once
        epoch_ids = []
        for w in parts:
            mine = len(range(w, len(share), workers))
            epoch_ids += parts[w][seen[w] : seen[w] + mine]
            seen[w] += mine
        assert sorted(epoch_ids) == share


def test_the_order_within_a_share_is_shuffled_and_differs_by_epoch(tmp_path):
    meta = _meta(tmp_path, 40)
    ds = RankDataset(meta, seed=2, mini_epochs=1, world_size=1, rank=0)
    ids = [r["id"] for r in itertools.islice(iter(RankStream(ds)), 80)]
    assert ids[:40] != sorted(ids[:40]) and ids[:40] != ids[40:]
    assert sorted(ids[:40]) == sorted(ids[40:]) == list(range(40))


def test_iter_from_jumps_to_a_position(tmp_path):
    ds = RankDataset(_meta(tmp_path, 30), seed=1, mini_epochs=3, world_size=1, rank=0)
    stream = RankStream(ds)
    straight = list(itertools.islice(iter(stream), 50))
    assert list(itertools.islice(stream.iter_from(17), 33)) == straight[17:]


def test_resume_with_workers_continues_with_the_next_batch(tmp_path):
    meta = _meta(tmp_path, 41)

    def make():
        ds = RankDataset(meta, seed=2, mini_epochs=2, world_size=2, rank=0)
        return RankDataLoader(ds, 3, mapper=lambda r: r["id"], num_workers=2)

    reference = list(itertools.islice(iter(make()), 12))
    first = make()
    head = list(itertools.islice(iter(first), 5))
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + list(itertools.islice(iter(resumed), 7)) == reference


def test_a_state_of_another_rank_is_refused(tmp_path):
    from trainkit.config import ConfigError

    meta = _meta(tmp_path, 20)
    state = RankDataLoader(RankDataset(meta, world_size=2, rank=0), 2).state_dict()
    other = RankDataLoader(RankDataset(meta, world_size=2, rank=1), 2)
    with pytest.raises(ConfigError, match="does not match"):
        other.load_state_dict(state)
