"""RankStream / RankDataLoader: one loader for every epoch, shares read by disjoint workers."""

import itertools
import json

import pytest

from trainkit.data import RankDataLoader, RankDataset
from trainkit.data.rank_stream import RankStream


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
