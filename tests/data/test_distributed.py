"""Two-rank gloo jobs: only the wiring (ranks, shared seed, per-rank state) is tested here;
the position arithmetic itself is covered for many world sizes in test_positions.py."""

import itertools

import pytest

from tests.dist import run_on_ranks

pytestmark = pytest.mark.distributed

N = 24
PER_RANK_BATCHES = 6  # 2 samples per rank per batch -> 12 per rank -> half an epoch each, twice


def _records():
    widths = [40, 90, 100, 140, 250]
    return [{"id": i, "width": widths[i % 5], "height": 100} for i in range(N)]


def _mapper(record):
    from trainkit.data import sample_rng

    return record["id"], int(sample_rng().integers(1 << 30))


def _same(record):  # records as they are (the default DatasetMapper needs file_name)
    return record


def _cfg(**overrides):
    from trainkit.config import get_cfg

    cfg = get_cfg()
    cfg.SEED = -1  # exercises the shared-seed collective in build_train_loader
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = 1
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.merge_from_list([x for kv in overrides.items() for x in (kv[0], str(kv[1]))])
    return cfg


def _job():
    from trainkit.data import DatasetCatalog, build_test_loader, build_train_loader
    from trainkit.utils import comm

    out = {"rank": comm.get_rank()}
    loader = build_train_loader(_cfg(), _mapper, dataset=_records())
    out["batches"] = list(itertools.islice(iter(loader), 2 * PER_RANK_BATCHES))
    out["positions"] = loader.last_batch_positions

    # grouped loader: save mid-stream, resume in a fresh loader, compare with a straight run
    cfg = _cfg(**{"DATALOADER.ASPECT_RATIO_GROUPING": True, "SEED": 5})
    straight = list(itertools.islice(iter(build_train_loader(cfg, _mapper, dataset=_records())), 9))
    first = build_train_loader(cfg, _mapper, dataset=_records())
    head = list(itertools.islice(iter(first), 4))
    resumed = build_train_loader(cfg, _mapper, dataset=_records())
    resumed.load_state_dict(first.state_dict())
    out["resume_ok"] = head + list(itertools.islice(iter(resumed), 5)) == straight

    try:
        build_train_loader(_cfg(**{"SOLVER.IMS_PER_BATCH": 3}), _mapper, dataset=_records())
    except ValueError as e:
        out["batch_error"] = str(e)

    DatasetCatalog.register("toy_test_7", lambda: [{"id": i} for i in range(7)])
    out["test_ids"] = [
        r["id"] for b in build_test_loader(_cfg(), "toy_test_7", mapper=_same) for r in b
    ]
    return out


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(_job, 2, timeout_s=120.0)


def test_rank_streams_are_disjoint_and_each_epoch_is_a_permutation(results):
    ids = [[sample[0] for batch in r["batches"] for sample in batch] for r in results]
    half = N // 2
    for epoch in range(2):
        parts = [set(rank_ids[epoch * half : (epoch + 1) * half]) for rank_ids in ids]
        assert not parts[0] & parts[1]
        assert parts[0] | parts[1] == set(range(N))
    assert results[0]["positions"][-1] % 2 == 0 and results[1]["positions"][-1] % 2 == 1


def test_ranks_share_the_seed_but_not_the_samples(results):
    draws = [[sample[1] for batch in r["batches"] for sample in batch] for r in results]
    assert not set(draws[0]) & set(draws[1])


def test_grouped_loader_resumes_on_every_rank(results):
    assert [r["resume_ok"] for r in results] == [True, True]


def test_indivisible_batch_size_names_both_numbers(results):
    for r in results:
        assert "IMS_PER_BATCH=3" in r["batch_error"] and "world size (2)" in r["batch_error"]


def test_test_loader_covers_every_record_once_over_ranks(results):
    assert results[0]["test_ids"] + results[1]["test_ids"] == list(range(7))
    assert [len(r["test_ids"]) for r in results] == [4, 3]
