"""Issue 6 "data at scale": constant-memory samplers, one shared copy per machine,
RankDataset shares, and the indexed metadata file."""

import itertools
import json
import os
import pickle
import time
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
from torch.utils.data import DataLoader

from tests.dist import RankFailure, run_on_ranks
from trainkit.data import (
    DatasetCatalog,
    DatasetFromList,
    MetaFileDataset,
    RandomSubsetTrainingSampler,
    RankDataLoader,
    RankDataset,
    ToIterableDataset,
    TrainingSampler,
)
from trainkit.data import metafile as metafile_module
from trainkit.data.rank_dataset import rank_share
from trainkit.data.samplers._base import StreamSampler

# --------------------------------------------------------------------------- samplers


def _draw(sampler, n):
    return list(itertools.islice(iter(sampler), n))


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_every_epoch_is_a_new_permutation(n):
    stream = _draw(TrainingSampler(n, seed=11, rank=0, world_size=1), 4 * n)
    epochs = [stream[e * n : (e + 1) * n] for e in range(4)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    if n >= 7:
        assert len({tuple(e) for e in epochs}) == 4


def test_random_subset_is_fixed_and_reshuffled_every_epoch():
    sampler = RandomSubsetTrainingSampler(
        100, 0.3, seed_shuffle=1, seed_subset=2, rank=0, world_size=1
    )
    stream = _draw(sampler, 90)
    epochs = [stream[i * 30 : (i + 1) * 30] for i in range(3)]
    assert len(set(epochs[0])) == 30 and all(set(e) == set(epochs[0]) for e in epochs)
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_ranks_are_disjoint_and_cover_each_epoch(world_size):
    n = 48
    per_rank = [
        _draw(TrainingSampler(n, seed=4, rank=r, world_size=world_size), n // world_size)
        for r in range(world_size)
    ]
    merged = [per_rank[p % world_size][p // world_size] for p in range(n)]
    assert merged == _draw(TrainingSampler(n, seed=4, rank=0, world_size=1), n)


def test_huge_sampler_jumps_in_constant_time_and_memory():
    size = 400_000_000
    sampler = TrainingSampler(size, seed=0, rank=1, world_size=8)
    began = time.perf_counter()
    sampler.load_state_dict({**sampler.state_dict(), "num_drawn": 3 * size})  # epoch 24
    first = next(iter(sampler))
    assert time.perf_counter() - began < 0.5
    assert 0 <= first < size
    # No attribute grows with the size: nothing numpy-sized is stored.
    assert all(getattr(v, "nbytes", 0) < 1 << 20 for v in vars(sampler).values())
    small = TrainingSampler(1000, seed=5, rank=0, world_size=1)
    resumed = TrainingSampler(1000, seed=5, rank=0, world_size=1)
    head = _draw(small, 1234)
    resumed.load_state_dict(small.state_dict())
    assert head + _draw(resumed, 100) == _draw(TrainingSampler(1000, seed=5), 1334)


class _NoFullIteration(TrainingSampler):
    """Fails if anything iterates the full stream instead of jumping to a worker's share."""

    def __iter__(self):
        raise AssertionError("ToIterableDataset iterated the whole stream")


@pytest.mark.parametrize("num_workers", [2])
def test_to_iterable_dataset_workers_jump_to_their_share(num_workers):
    n = 30
    sampler = _NoFullIteration(n, seed=2, rank=0, world_size=1)
    assert isinstance(sampler, StreamSampler)
    ds = ToIterableDataset(list(range(n)), sampler, shard_chunk_size=2)
    loader = DataLoader(
        ds, batch_size=None, num_workers=num_workers, multiprocessing_context="fork"
    )
    batches = iter(loader)
    got = [x for x, _ in zip(batches, range(2 * n))]
    # Stop the workers and their queue threads now: later tests fork launchers from this
    # process, and a fork while a feeder thread holds a lock can hang the child.
    batches._shutdown_workers()
    expected = _draw(TrainingSampler(n, seed=2, rank=0, world_size=1), 2 * n)
    assert sorted(got) == sorted(expected)  # each worker its chunks, together each index once
    # torch interleaves the workers round-robin, one item at a time: chunks of 2 are
    # dealt to workers in turn, so the reordering is fixed and independent of timing.
    assert sorted(got[: 2 * num_workers]) == sorted(expected[: 2 * num_workers])


# --------------------------------------------------------------------------- shared records


def _records(n=50):
    return [{"id": i, "file": f"img{i}.jpg", "width": 10 + i % 3, "height": 11} for i in range(n)]


def _memfd_inodes():
    inodes = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "trainkit-dataset" in line:
                inodes.add(int(line.split()[4]))
    return inodes


def test_dataset_from_list_lives_in_an_anonymous_segment():
    ds = DatasetFromList(iter(_records()))  # any iterable, streamed
    assert len(ds) == 50 and ds[7] == _records()[7]
    assert ds.segment_identity is not None
    assert ds.segment_identity[1] in _memfd_inodes()
    # Sent to a process (spawn, queues): reattaches to the same segment, not a copy.
    clone = pickle.loads(ForkingPickler.dumps(ds))
    assert clone.segment_identity == ds.segment_identity and clone[49] == _records()[49]
    # Plain pickle stores the records, like a tensor: loadable once the original is gone.
    payload = pickle.dumps(DatasetFromList(_records()))
    restored = pickle.loads(payload)
    assert restored.segment_identity not in (None, ds.segment_identity)
    assert [restored[i] for i in range(50)] == _records()
    empty = DatasetFromList([])
    assert len(empty) == 0


def _child_reads(payload, conn):
    ds = pickle.loads(payload)
    conn.send((ds.segment_identity, ds[3], ds.segment_identity[1] in _memfd_inodes()))


def test_pickled_dataset_reattaches_in_another_process():
    import multiprocessing as mp

    ds = DatasetFromList(_records())
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child_reads, args=(ForkingPickler.dumps(ds), child))
    proc.start()
    identity, record, mapped = parent.recv()
    proc.join(10)
    assert identity == ds.segment_identity and record == _records()[3] and mapped


def _worker_identity(ds):
    return [ds.dataset.segment_identity, ds.dataset[1]]


class _Probe:
    def __init__(self, ds):
        self.dataset = ds

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return _worker_identity(self)


@pytest.mark.slow
def test_spawned_loader_workers_map_the_same_segment():
    ds = DatasetFromList(_records())
    loader = DataLoader(_Probe(ds), batch_size=None, num_workers=1, multiprocessing_context="spawn")
    batches = iter(loader)
    identity, record = next(batches)
    batches._shutdown_workers()  # no live worker or queue thread left for later forks
    assert tuple(identity) == ds.segment_identity and record == _records()[1]


def _shared_job(tmp_dir):
    from trainkit.config import get_cfg
    from trainkit.data import build_train_loader
    from trainkit.utils import comm

    def load():
        with open(os.path.join(tmp_dir, f"called.{comm.get_rank()}"), "w"):
            pass
        return (r for r in _records(40))  # a generator: streamed, never a list

    DatasetCatalog.register("scale_shared", load)
    cfg = get_cfg()
    cfg.DATASETS.TRAIN = ("scale_shared",)
    cfg.SEED = 3
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = 1
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True  # reads sizes from the shared records
    loader = build_train_loader(cfg)
    batches = list(itertools.islice(iter(loader), 3))
    ds = loader.records
    return {
        "identity": ds.segment_identity,
        "mapped": ds.segment_identity[1] in _memfd_inodes(),
        "len": len(ds),
        "ids": [r["id"] for b in batches for r in b],
        "dev_shm_names": sorted(os.listdir("/dev/shm")),
    }


@pytest.mark.distributed
def test_one_segment_per_machine_attached_by_every_local_rank(tmp_path):
    before = set(os.listdir("/dev/shm"))
    results = run_on_ranks(_shared_job, 2, args=(str(tmp_path),), timeout_s=90)
    assert results[0]["identity"] == results[1]["identity"] is not None
    assert all(r["mapped"] and r["len"] == 40 for r in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["called.0"]  # only local rank 0
    assert not set(results[0]["ids"]) & set(results[1]["ids"])
    # Nothing named, so nothing to leak (other jobs' semaphores may come and go meanwhile).
    assert not [n for n in set(os.listdir("/dev/shm")) - before if "trainkit" in n]


def _crash_job(tmp_dir, fail_in_load):
    from trainkit.data.build import load_catalog_dataset
    from trainkit.utils import comm

    with open(os.path.join(tmp_dir, f"pid.{comm.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))

    def load():
        if fail_in_load:
            raise OSError("annotations.json is unreadable")
        return _records(20)

    DatasetCatalog.register("scale_crash", load)
    ds = load_catalog_dataset("scale_crash")
    if comm.get_rank() == 1:
        raise RuntimeError(f"rank 1 crashes holding segment {ds.segment_identity}")
    time.sleep(30)  # rank 0 would wait here; the launcher must stop it


def _holds_segment(pid):
    try:
        return any(
            "trainkit-dataset" in os.readlink(f"/proc/{pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{pid}/fd")
        )
    except OSError:
        return False  # the process is gone, and with it its descriptors and mappings


@pytest.mark.distributed
@pytest.mark.parametrize("fail_in_load", [False, True])
def test_crash_leaves_no_segment_behind(tmp_path, fail_in_load):
    before = set(os.listdir("/dev/shm"))
    began = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(_crash_job, 2, args=(str(tmp_path), fail_in_load), timeout_s=60)
    assert time.monotonic() - began < 25  # no rank waited out the sleep or a collective
    if fail_in_load:
        assert "annotations.json is unreadable" in str(info.value)
    else:
        assert "rank 1 crashes holding segment" in str(info.value)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(_holds_segment(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_holds_segment(pid) for pid in pids)
    assert not [n for n in set(os.listdir("/dev/shm")) - before if "trainkit" in n]


# --------------------------------------------------------------------------- RankDataset


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


def _write_jsonl(path, n, *, blank_every=0, crlf=False, trailing_newline=True):
    newline = "\r\n" if crlf else "\n"
    lines = []
    for i in range(n):
        lines.append(json.dumps({"id": i, "file": f"img{i:06d}.jpg"}))
        if blank_every and i % blank_every == 0:
            lines.append("")
    text = newline.join(lines) + (newline if trailing_newline else "")
    path.write_text(text, newline="")
    return path


def test_rank_dataset_holds_only_its_share_and_rebuilds_it(tmp_path):
    meta = _write_jsonl(tmp_path / "meta.jsonl", 60)
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
    from trainkit.data import sample_rng

    return record["id"], int(sample_rng().integers(1000))


def test_rank_data_loader_streams_epochs_and_resumes(tmp_path):
    meta = _write_jsonl(tmp_path / "meta.jsonl", 41)

    def make():
        ds = RankDataset(meta, seed=2, mini_epochs=2, world_size=2, rank=1)
        return RankDataLoader(ds, 3, mapper=_tag)

    straight = make()
    batches = list(itertools.islice(iter(straight), 9))
    # shares of 10 and 10 records: batches run on from one mini-epoch into the next
    ids = [s[0] for b in batches[:6] for s in b]
    assert len(set(ids)) == 18  # 18 of the 20 records of one full epoch: no repeats
    first = make()
    head = list(itertools.islice(iter(first), 4))
    resumed = make()
    resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
    assert head + list(itertools.islice(iter(resumed), 5)) == batches


# --------------------------------------------------------------------------- MetaFileDataset


@pytest.mark.parametrize(
    "options", [{}, {"blank_every": 3}, {"crlf": True}, {"trailing_newline": False}]
)
def test_metafile_random_access_matches_the_lines(tmp_path, monkeypatch, options):
    monkeypatch.setattr(metafile_module, "_SCAN_CHUNK", 64)  # many chunk boundaries
    meta = _write_jsonl(tmp_path / "m.jsonl", 200, **options)
    ds = MetaFileDataset(meta)
    assert len(ds) == 200
    for i in np.random.default_rng(0).permutation(200)[:50].tolist() + [0, 199, -1]:
        assert ds[i]["id"] == range(200)[i]
    with pytest.raises(IndexError):
        ds[200]
    assert ds.index_path == tmp_path / "m.jsonl.idx"
    assert not list(tmp_path.glob("*.tmp.*"))  # written through a temporary + os.replace


def test_metafile_index_is_reused_and_rebuilt_when_the_file_changes(tmp_path):
    meta = _write_jsonl(tmp_path / "m.jsonl", 10)
    index = tmp_path / "idx"
    first = MetaFileDataset(meta, index_dir=index)
    (index_file,) = index.glob("m.jsonl.*.idx")
    built = index_file.stat().st_mtime_ns
    MetaFileDataset(meta, index_dir=index)
    assert index_file.stat().st_mtime_ns == built  # reused
    assert len(first) == 10
    _write_jsonl(meta, 12)
    os.utime(meta, ns=(time.time_ns(), time.time_ns() + 10**9))  # coarse mtime clocks
    again = MetaFileDataset(meta, index_dir=index)
    assert len(again) == 12 and again[11]["id"] == 11
    index_file.write_bytes(index_file.read_bytes()[:70])  # a truncated index is rebuilt
    assert len(MetaFileDataset(meta, index_dir=index)) == 12


def test_metafile_pickles_by_path_and_refuses_a_changed_file(tmp_path):
    meta = _write_jsonl(tmp_path / "m.jsonl", 5)
    ds = MetaFileDataset(meta)
    payload = pickle.dumps(ds)
    assert len(payload) < 1000 and pickle.loads(payload)[4]["id"] == 4
    _write_jsonl(meta, 6)
    os.utime(meta, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(RuntimeError, match="changed since"):
        pickle.loads(payload)


def test_metafile_registers_in_the_catalog_and_trains_with_a_global_shuffle(tmp_path):
    from trainkit.config import get_cfg
    from trainkit.data import build_train_loader

    meta = _write_jsonl(tmp_path / "m.jsonl", 24)
    DatasetCatalog.register("scale_metafile", lambda: MetaFileDataset(meta))
    try:
        cfg = get_cfg()
        cfg.DATASETS.TRAIN = ("scale_metafile",)
        cfg.SEED = 0
        cfg.SOLVER.IMS_PER_BATCH = 4
        cfg.DATALOADER.NUM_WORKERS = 0
        cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
        loader = build_train_loader(cfg)
        ids = [r["id"] for b in itertools.islice(iter(loader), 6) for r in b]
    finally:
        DatasetCatalog.remove("scale_metafile")
    assert sorted(ids) == list(range(24))
    assert ids == [i for i in _draw(TrainingSampler(24, seed=0), 24)]
    assert MetaFileDataset(tmp_path / "m.jsonl")[3] == {"id": 3, "file": "img000003.jpg"}
