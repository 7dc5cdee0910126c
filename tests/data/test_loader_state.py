"""Loader positions written by older trainkit versions still load, and go on where they were.

Each literal state below was written by trainkit at 563aaeb (before the state format had one
owner), together with the batches its loader returned next; the loader of today loads it and
must return the same batches.
"""

import itertools
import json

import pytest
import torch

from trainkit.config import ConfigError, get_cfg
from trainkit.data import (
    RankDataLoader,
    RankDataset,
    TrainingSampler,
    build_batch_data_loader,
    build_train_loader,
)
from trainkit.data.plans.loader_state import is_global_position, upgrade
from trainkit.data.samplers import InferenceSampler

WIDTHS = [10, 30, 64, 100, 150, 220]
RECORDS = [{"id": i, "width": WIDTHS[i % 6] + i % 4, "height": 100} for i in range(60)]

GLOBAL_V2 = {
    "version": 2,
    "kind": "global",
    "stream": {"type": "TrainingSampler", "seed": 42, "size": 60, "shuffle": True},
    "global_batch_size": 4,
    "num_buckets": 4,
    "position": 16,
    "buckets": [[], [[14, 2], [32, 7]], [], [[59, 11], [41, 14]]],
    "steps": 3,
    "micro": 0,
    "split": [1, 1],
}
RANK_V1 = {
    "version": 1,
    "kind": "rank",
    "num_batches": 4,
    "num_drawn": 14,
    "pass_offset": 0,
    "sampler": {
        "num_drawn": 14,
        "type": "TrainingSampler",
        "seed": 3,
        "world_size": 2,
        "size": 60,
        "shuffle": True,
    },
    "batch_size": 3,
    "rank": 1,
    "world_size": 2,
    "buckets": [[[18, 13], [42, 17]], []],
    "last_batch": [[5, 23], [52, 25], [3, 27]],
}
# Version 1 as first written: no "kind" and no "pass_offset".
RANK_V1_FIRST = {k: v for k, v in RANK_V1.items() if k not in ("kind", "pass_offset")}
RANK_V1_FINITE = {
    "version": 1,
    "kind": "rank",
    "num_batches": 2,
    "num_drawn": 6,
    "pass_offset": 0,
    "sampler": None,
    "batch_size": 4,
    "rank": 0,
    "world_size": 1,
    "buckets": [[]],
    "last_batch": [[4, 4], [5, 5]],
}
STREAM = {
    "kind": "stream",
    "num_workers": 1,
    "workers": [{"read": 22, "pending": [[19, 1], [20, 1]]}],
    "next_worker": 0,
}
RANK_DATA_LOADER_V2 = {
    "version": 2,
    "loader": {
        "kind": "stream",
        "num_workers": 1,
        "workers": [{"read": 12, "pending": []}],
        "next_worker": 0,
    },
    "seed": 2,
    "rank": 1,
    "world_size": 2,
    "mini_epochs": 2,
}


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def _ids(record):
    return record["id"]


def _resumed(loader, state):
    loader.load_state_dict(state)
    return _take(loader, 2)


def test_a_version_2_global_position_continues():
    cfg = get_cfg()
    cfg.SEED = 42
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    cfg.DATALOADER.ASPECT_RATIO_BINS = [0.5, 1.0, 2.0]
    loader = build_train_loader(cfg, _ids, dataset=RECORDS)
    assert _resumed(loader, GLOBAL_V2) == [[43, 48, 6, 1], [14, 32, 38, 20]]
    assert loader.state_dict()["steps"] == 5


@pytest.mark.parametrize("state", [RANK_V1, RANK_V1_FIRST], ids=["v1", "v1-first"])
def test_a_version_1_rank_position_continues(state):
    sampler = TrainingSampler(60, seed=3, rank=1, world_size=2)
    loader = build_batch_data_loader(
        RECORDS, sampler, None, single_gpu_batch_size=3, aspect_ratio_grouping=True
    )
    batches = _resumed(loader, state)
    assert [[r["id"] for r in b] for b in batches] == [[18, 42, 1], [43, 32, 0]]


def test_a_version_1_finite_rank_position_starts_the_next_pass():
    loader = build_batch_data_loader(
        list(range(6)), InferenceSampler(6, rank=0, world_size=1), 4, drop_last=False
    )
    assert _resumed(loader, RANK_V1_FINITE) == [[0, 1, 2, 3], [4, 5]]
    assert loader.last_batch_positions == [10, 11]


class _Numbers(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(60):
            yield {"id": i, "width": 10 + (i % 3) * 10, "height": 20}


def test_a_stream_position_without_version_continues():
    from trainkit.data import MapDataset

    loader = build_batch_data_loader(
        MapDataset(_Numbers(), _ids), None, 4, num_workers=0, aspect_ratio_grouping=True
    )
    assert _resumed(loader, STREAM) == [[19, 20, 22, 23], [25, 26, 28, 29]]


def test_a_version_2_rank_data_loader_position_continues(tmp_path):
    meta = tmp_path / "m.jsonl"
    meta.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(41)))
    dataset = RankDataset(meta, seed=2, mini_epochs=2, world_size=2, rank=1)
    loader = RankDataLoader(dataset, 3, mapper=_ids)
    assert _resumed(loader, RANK_DATA_LOADER_V2) == [[10, 31, 4], [18, 29, 36]]
    other = RankDataLoader(RankDataset(meta, seed=3, world_size=2, rank=1), 3, mapper=_ids)
    with pytest.raises(ConfigError, match="does not match"):
        other.load_state_dict(RANK_DATA_LOADER_V2)


def test_only_positions_in_the_global_stream_are_global():
    assert is_global_position(GLOBAL_V2)
    assert is_global_position(upgrade(GLOBAL_V2))
    for state in (RANK_V1, RANK_V1_FIRST, STREAM, RANK_DATA_LOADER_V2, None, {}, [1]):
        assert not is_global_position(state)
    assert all(upgrade(s)["version"] == 3 for s in (RANK_V1, STREAM, RANK_DATA_LOADER_V2))


def test_an_unknown_version_is_refused_with_what_to_do():
    with pytest.raises(ConfigError, match="versions 1 to 3.*OUTPUT_DIR"):
        upgrade({**GLOBAL_V2, "version": 9})
