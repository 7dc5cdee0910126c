"""One serialised copy per machine however DatasetFromList is called: sharing by content.

Ranks (and any other processes of the user) that build ``DatasetFromList`` from identical
records map one memfd segment, found through an abstract unix socket named after the
records' digest; different records never meet. See trainkit/data/records/segment_sharing.py.
"""

import gc
import itertools
import logging
import os
import pickle
import socket
import threading
import time
from multiprocessing.reduction import ForkingPickler

import pytest
from torch.utils.data import DataLoader

from tests.dist import RankFailure, run_on_ranks
from trainkit.data import DatasetCatalog, DatasetFromList
from trainkit.data.records import segment_sharing as share_module
from trainkit.data.records.segment_sharing import attach_segment

_BLOB = bytes(range(256)) * 8  # 2 KiB per record: pickles are big, the list stays small


def _records(n=800, tag="a", blob=_BLOB):
    # 800 x 2 KiB = 1.6 MiB serialised: above the sharing threshold (1 MiB).
    return [{"id": i, "tag": tag, "blob": blob} for i in range(n)]


def _mapped_segments(pid="self"):
    """Inodes of the DatasetFromList memfds that process ``pid`` maps."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "trainkit-dataset" in line:
                inodes.add(int(line.split()[4]))
    return inodes


def _share_threads():
    return [t for t in threading.enumerate() if t.name.startswith("trainkit-share-")]


def _stop_sharing_now():
    share_module.stop_all()
    gc.collect()
    deadline = time.monotonic() + 5
    while _share_threads() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def _stop_sharing():
    _stop_sharing_now()  # datasets of earlier tests may still be alive and serving
    yield
    _stop_sharing_now()


# --------------------------------------------------------------------------- one process


def _small_records(n=50):
    return [{"id": i, "file": f"img{i}.jpg", "width": 10 + i % 3, "height": 11} for i in range(n)]


def test_records_live_in_an_anonymous_segment_that_pickling_reattaches():
    ds = DatasetFromList(iter(_small_records()))  # any iterable, streamed
    assert len(ds) == 50 and ds[7] == _small_records()[7]
    assert ds.segment_identity is not None
    assert ds.segment_identity[1] in _mapped_segments()
    # Sent to a process (spawn, queues): reattaches to the same segment, not a copy.
    clone = pickle.loads(ForkingPickler.dumps(ds))
    assert clone.segment_identity == ds.segment_identity and clone[49] == _small_records()[49]
    # Plain pickle stores the records, like a tensor: loadable once the original is gone.
    restored = pickle.loads(pickle.dumps(DatasetFromList(_small_records())))
    assert restored.segment_identity not in (None, ds.segment_identity)
    assert [restored[i] for i in range(50)] == _small_records()
    assert len(DatasetFromList([])) == 0


def _child_reads(payload, conn):
    ds = pickle.loads(payload)
    conn.send((ds.segment_identity, ds[3], ds.segment_identity[1] in _mapped_segments()))


def test_a_dataset_sent_to_another_process_maps_the_same_segment():
    import multiprocessing as mp

    ds = DatasetFromList(_small_records())
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child_reads, args=(ForkingPickler.dumps(ds), child))
    proc.start()
    identity, record, mapped = parent.recv()
    proc.join(10)
    assert identity == ds.segment_identity and record == _small_records()[3] and mapped


class _Probe:
    """One item: the segment and a record as a (spawned) loader worker sees them."""

    def __init__(self, ds):
        self.dataset = ds

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return [self.dataset.segment_identity, self.dataset[1]]


@pytest.mark.slow
def test_spawned_loader_workers_map_the_same_segment():
    ds = DatasetFromList(_small_records())
    loader = DataLoader(_Probe(ds), batch_size=None, num_workers=1, multiprocessing_context="spawn")
    batches = iter(loader)
    identity, record = next(batches)
    batches._shutdown_workers()  # no live worker or queue thread left for later forks
    assert tuple(identity) == ds.segment_identity and record == _small_records()[1]


def test_identical_records_share_one_segment_and_the_extra_copy_is_freed():
    gc.collect()
    before = _mapped_segments()  # earlier tests' datasets may still be alive
    first = DatasetFromList(_records())
    second = DatasetFromList(_records())
    assert first.segment_identity == second.segment_identity is not None
    # The second copy is gone: one new segment is mapped.
    assert _mapped_segments() - before == {first.segment_identity[1]}
    assert second[7] == _records()[7] and len(second) == 800


def test_different_records_are_never_shared():
    ds_a = DatasetFromList(_records(tag="a"))
    ds_b = DatasetFromList(_records(tag="b"))
    assert ds_a.segment_identity != ds_b.segment_identity
    assert ds_a[3]["tag"] == "a" and ds_b[3]["tag"] == "b"
    boundaries = DatasetFromList(_records(n=400, blob=_BLOB * 2))  # other records, other sizes
    assert boundaries.segment_identity not in (ds_a.segment_identity, ds_b.segment_identity)


def test_a_holder_takes_over_when_the_server_drops_its_dataset():
    server = DatasetFromList(_records())
    holder = DatasetFromList(_records())
    identity = server.segment_identity
    del server
    gc.collect()
    deadline = time.monotonic() + 5
    later = DatasetFromList(_records())
    while later.segment_identity != identity and time.monotonic() < deadline:
        time.sleep(0.05)  # the holder's thread claims the name a moment after the EOF
        later = DatasetFromList(_records())
    assert later.segment_identity == holder.segment_identity == identity
    del holder, later
    gc.collect()
    deadline = time.monotonic() + 5
    while _share_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _share_threads()  # nothing keeps running once the datasets are gone


def test_small_datasets_stay_private_without_a_thread():
    small = DatasetFromList(_records(n=10))
    again = DatasetFromList(_records(n=10))
    assert small.segment_identity != again.segment_identity
    assert not _share_threads()


def test_a_forked_child_does_not_keep_the_name_bound(monkeypatch, caplog):
    import multiprocessing as mp

    monkeypatch.setattr(share_module, "TIMEOUT_S", 1.0)
    ds = DatasetFromList(_records())
    ctx = mp.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(3,))  # inherits the listening socket
    child.start()
    try:
        del ds
        gc.collect()
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="trainkit.data.records.segment_sharing"):
            rebuilt = DatasetFromList(_records())
            again = DatasetFromList(_records())
        # Had the child kept the socket, the name would still be bound with nobody
        # answering: each build would wait for the timeout and keep a private copy.
        assert time.monotonic() - began < 1.0
        assert "Cannot share" not in caplog.text
        assert rebuilt.segment_identity == again.segment_identity
    finally:
        child.kill()
        child.join()


def test_a_handle_that_cannot_be_opened_falls_back_to_the_digest():
    ds = DatasetFromList(_records())
    handle = ds._lst._segment.handle()
    gone = handle._replace(pid=2**22 + 1)  # no such process: /proc/<pid>/fd fails
    segment = attach_segment(gone)
    assert segment.identity == ds.segment_identity
    clone = pickle.loads(ForkingPickler.dumps(ds))  # the usual way: /proc of this process
    assert clone.segment_identity == ds.segment_identity and clone[5] == _records()[5]


def _fake_server(address, payload_fd, message, ready, uid=None):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        if uid is not None:
            os.setuid(uid)
        listener.bind(address)
        listener.listen(1)
        ready.set()
        listener.settimeout(5)
        conn, _ = listener.accept()
        with conn:
            socket.send_fds(conn, [message], [payload_fd])
            conn.recv(1)


def test_a_server_offering_other_records_is_refused(caplog):
    from trainkit.data.records.dataset_from_list import _serialize_records

    impostor = _serialize_records(_records(tag="x"))  # same size, other records
    wanted = _serialize_records(_records(tag="y"))  # what the dataset below will build
    assert impostor.nbytes == wanted.nbytes
    # Claims to serve the "y" records (right size and digest) but sends the "x" segment.
    lie = share_module.MESSAGE.pack(share_module.MESSAGE_MAGIC, wanted.nbytes, wanted.digest)
    ready = threading.Event()
    server = threading.Thread(
        target=_fake_server,
        args=(share_module.segment_address(wanted.digest), impostor.fileno(), lie, ready),
    )
    server.start()
    ready.wait(5)
    with caplog.at_level(logging.WARNING, logger="trainkit.data.records.segment_sharing"):
        ds = DatasetFromList(_records(tag="y"))
    server.join(5)
    assert ds[4]["tag"] == "y" and ds.segment_identity != impostor.identity
    assert "header names other records" in caplog.text and "private copy" in caplog.text


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a server as another user")
def test_a_server_of_another_user_is_refused(caplog):
    import multiprocessing as mp

    from trainkit.data.records.dataset_from_list import _serialize_records

    wanted = _serialize_records(_records(tag="z"))
    message = share_module.MESSAGE.pack(share_module.MESSAGE_MAGIC, wanted.nbytes, wanted.digest)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    squatter = ctx.Process(
        target=_fake_server,
        args=(
            share_module.segment_address(wanted.digest),
            wanted.fileno(),
            message,
            ready,
            65534,
        ),
    )
    squatter.start()
    try:
        assert ready.wait(5)
        with caplog.at_level(logging.WARNING, logger="trainkit.data.records.segment_sharing"):
            ds = DatasetFromList(_records(tag="z"))
        assert ds.segment_identity != wanted.identity and ds[1]["tag"] == "z"
        assert "another user" in caplog.text
    finally:
        squatter.kill()
        squatter.join()


# --------------------------------------------------------------------------- real jobs


def _ranks_job(tmp_dir):
    from trainkit.utils import comm

    rank = comm.get_rank()
    same = DatasetFromList(_records(tag="same"))
    own = DatasetFromList(_records(tag=f"rank{rank}"))
    comm.synchronize()  # both ranks hold both datasets while the other looks
    result = {
        "same": same.segment_identity,
        "own": own.segment_identity,
        "own_tags": {own[i]["tag"] for i in range(0, 800, 97)},
        "mapped": _mapped_segments(),
    }
    comm.synchronize()
    return result


@pytest.mark.distributed
def test_ranks_share_identical_lists_and_never_different_ones(tmp_path):
    results = run_on_ranks(_ranks_job, 2, args=(str(tmp_path),), timeout_s=90)
    assert results[0]["same"] == results[1]["same"] is not None
    assert results[0]["own"] != results[1]["own"]
    assert results[0]["own_tags"] == {"rank0"} and results[1]["own_tags"] == {"rank1"}
    # Three segments on the machine: the shared one and one per rank, nothing more.
    assert len(results[0]["mapped"] | results[1]["mapped"]) == 3


def _lonely_job():
    from trainkit.utils import comm

    length = None
    if comm.get_rank() == 0:  # only this rank builds: it must not wait for the other
        length = len(DatasetFromList(_records(tag="lonely")))
    comm.synchronize()
    return length


@pytest.mark.distributed
def test_a_rank_that_builds_alone_does_not_wait_for_the_others():
    began = time.monotonic()
    assert run_on_ranks(_lonely_job, 2, timeout_s=60) == [800, None]
    assert time.monotonic() - began < 40  # far from the collective timeouts


def _catalog_job(tmp_dir):
    from trainkit.config import get_cfg
    from trainkit.data import build_train_loader
    from trainkit.utils import comm

    def load():
        with open(os.path.join(tmp_dir, f"called.{comm.get_rank()}"), "w"):
            pass
        # A generator (streamed, never a list) of 1.3 MiB: large enough to be shared.
        return (dict(r, blob=_BLOB * 16) for r in _small_records(40))

    DatasetCatalog.register("shared_catalog", load)
    cfg = get_cfg()
    cfg.DATASETS.TRAIN = ("shared_catalog",)
    cfg.SEED = 3
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = 1
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True  # reads sizes from the shared records
    loader = build_train_loader(cfg, mapper=lambda record: record)  # records as they are
    batches = list(itertools.islice(iter(loader), 3))
    ds = loader.records
    return {
        "identity": ds.segment_identity,
        "mapped": ds.segment_identity[1] in _mapped_segments(),
        "len": len(ds),
        "ids": [r["id"] for b in batches for r in b],
    }


@pytest.mark.distributed
def test_the_catalog_keeps_one_copy_per_machine_without_a_collective(tmp_path):
    before = set(os.listdir("/dev/shm"))
    results = run_on_ranks(_catalog_job, 2, args=(str(tmp_path),), timeout_s=90)
    assert results[0]["identity"] == results[1]["identity"] is not None
    assert all(r["mapped"] and r["len"] == 40 for r in results)
    # Every rank loads for itself (no rank waits for another), and they share one copy.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["called.0", "called.1"]
    assert not set(results[0]["ids"]) & set(results[1]["ids"])
    # Nothing named, so nothing to leak (other jobs' semaphores may come and go meanwhile).
    assert not [n for n in set(os.listdir("/dev/shm")) - before if "trainkit" in n]


def _crash_job(tmp_dir, fail_in_load):
    from trainkit.data.catalog import load_catalog_dataset
    from trainkit.utils import comm

    with open(os.path.join(tmp_dir, f"pid.{comm.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))

    def load():
        if fail_in_load:
            raise OSError("annotations.json is unreadable")
        return _small_records(20)

    DatasetCatalog.register("shared_crash", load)
    ds = load_catalog_dataset("shared_crash")
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
def test_a_crash_leaves_no_segment_behind(tmp_path, fail_in_load):
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


# --------------------------------------------------------------------------- memory (PSS)


def _tree(root):
    """``root`` and every live process below it."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _pss_bytes(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    except OSError:
        return 0  # gone meanwhile


def _segment_sizes(pid):
    """{inode: mapped bytes} of the DatasetFromList memfds that ``pid`` maps."""
    sizes = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if "trainkit-dataset" in line:
                    span, inode = line.split()[0], int(line.split()[4])
                    start, end = (int(x, 16) for x in span.split("-"))
                    sizes[inode] = sizes.get(inode, 0) + end - start
    except OSError:
        pass
    return sizes


class _ReadEverything:
    """Item i makes a loader worker read every page of the records (the worst case)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return 2  # one item per worker

    def __getitem__(self, i):
        held = self.dataset._lst
        return int(held._buffer[::4096].sum()) + int(held._ends[::512].sum())


def _measure_job(dataset):
    """Job-wide PSS and segments while 2 loader workers per rank have read ``dataset``."""
    from torch.utils.data import DataLoader

    from trainkit.utils import comm

    loader = DataLoader(
        _ReadEverything(dataset), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    batches = iter(loader)
    next(batches), next(batches)  # both workers read everything and stay alive
    comm.synchronize()
    measured = None
    if comm.get_rank() == 0:
        tree = _tree(os.getppid())  # the launcher: every rank and worker of the job
        segments = {}
        for pid in tree:
            segments.update(_segment_sizes(pid))
        measured = {
            "pss": sum(_pss_bytes(pid) for pid in tree),
            "procs": len(tree),
            "segment_bytes": sum(segments.values()),
        }
    comm.synchronize()
    batches._shutdown_workers()
    return measured


def _memory_job(num_records, record_bytes):
    from trainkit.utils import comm

    control = _measure_job(DatasetFromList([{"id": i} for i in range(16)]))
    blob = bytes(range(256)) * (record_bytes // 256)
    records = [{"id": i, "blob": blob} for i in range(num_records)]
    dataset = DatasetFromList(records)  # every rank builds the same list itself
    del records
    gc.collect()
    loaded = _measure_job(dataset)
    comm.synchronize()
    return {
        "control": control,
        "loaded": loaded,
        "identity": dataset.segment_identity,
        "copy_bytes": dataset._lst._segment.nbytes,
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_building_the_same_list_hold_one_copy():
    # 2 ranks x 2 fork workers, each worker reads every page; 2048 x 16 KiB = 32 MiB.
    rank0, rank1 = run_on_ranks(_memory_job, 2, args=(2048, 16384), timeout_s=120)
    assert rank0["identity"] == rank1["identity"] is not None
    control, loaded, copy_bytes = rank0["control"], rank0["loaded"], rank0["copy_bytes"]
    assert control["procs"] == loaded["procs"] == 7  # launcher, 2 ranks, 4 workers
    added = (loaded["pss"] - control["pss"]) / copy_bytes
    held = loaded["segment_bytes"] / copy_bytes
    mib = copy_bytes / 2**20
    print(f"serialised copies: {added:.2f} by PSS, {held:.2f} mapped ({mib:.1f} MiB each)")
    assert held <= 1.25
    assert 0.75 <= added <= 1.25


# --------------------------------------------------------------------------- default method


def test_a_plain_call_changes_the_default_until_it_is_restored():
    from trainkit.data.common import set_default_dataset_from_list_serialize_method

    def reverse(records):  # an observable method: the records come back reversed
        return list(records)[::-1]

    restore = set_default_dataset_from_list_serialize_method(reverse)
    try:
        assert DatasetFromList([1, 2])[0] == 2
        assert DatasetFromList.from_local_leader(lambda: [3, 4])[0] == 4
        assert DatasetFromList([1, 2]).segment_identity is None
    finally:
        restore.__exit__(None, None, None)
    assert DatasetFromList([1, 2]).segment_identity is not None
