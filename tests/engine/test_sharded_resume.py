"""A sharded run resumes anywhere with the data where it was (issue 30, points 4 and 5).

The ledger model of ``test_topology`` (its record ids per optimizer step) is trained with
``MODEL.FSDP.ENABLED`` on 2 processes, stopped after step 5 and resumed from the sharded
directory: on 2 processes bit for bit, on 1 and 3 processes and as hybrid shards on 4 with
the same records in every step as the run that never stopped; from a DDP file and back.
"""

import os
import shutil

import pytest
import torch

from tests.engine.test_topology import _assert_same_weights, _on

pytestmark = pytest.mark.distributed

# 12 images a step: 6 a process on 2, 2 x 6 on 1, 4 on 3, 3 on 4 (accumulate mode).
_FSDP = ("MODEL.FSDP.ENABLED", True, "SOLVER.IMS_PER_BATCH", 12)
_DDP = ("MODEL.FSDP.ENABLED", False, "SOLVER.IMS_PER_BATCH", 12)


def _stopped_and_resumed(tmp_path, name, world_size, first_opts=_FSDP, resumed_opts=_FSDP):
    out = str(tmp_path / name)
    first = _on(2, out, False, 2, 1, stop_after=5, opts=first_opts)
    resumed = _on(world_size, out, False, 2, 1, resume=True, opts=resumed_opts)
    ledger = {s: ids for s, ids in first["steps"].items() if s <= 5}
    ledger.update(resumed["steps"])
    assert sorted(resumed["steps"]) == list(range(6, 10))  # nothing repeated or skipped
    return ledger, resumed, out


def test_resumed_on_2_bit_for_bit_and_on_1_with_the_same_records_per_step(tmp_path):
    # One uninterrupted run; its checkpoint after step 5 is resumed as if it had stopped there.
    out = str(tmp_path / "run")
    straight = _on(2, out, False, 2, 1, opts=_FSDP)
    files = sorted(os.listdir(os.path.join(out, "model_0000005")))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "run.pth"]
    assert not [name for name in os.listdir(out) if name.startswith(".")]  # no partial left
    for world_size in (2, 1):
        directory = str(tmp_path / f"resumed_on_{world_size}")
        shutil.copytree(out, directory)
        for later in ("model_0000008", "model_final"):
            shutil.rmtree(os.path.join(directory, later))
        with open(os.path.join(directory, "last_checkpoint"), "w") as f:
            f.write("model_0000005")
        resumed = _on(world_size, directory, False, 2, 1, resume=True, opts=_FSDP)
        assert sorted(resumed["steps"]) == list(range(6, 10))  # nothing repeated or skipped
        ledger = {s: ids for s, ids in straight["steps"].items() if s <= 5}
        ledger.update(resumed["steps"])
        assert ledger == straight["steps"], world_size
        if world_size == 2:  # bit for bit on the same world size
            for key, value in straight["weights"].items():
                assert torch.equal(value, resumed["weights"][key]), key
        else:
            assert resumed["accumulate"] == 2
            _assert_same_weights(straight, resumed)


@pytest.mark.slow
def test_resumed_on_three_processes_and_as_hybrid_shards_on_four(tmp_path):
    straight = _on(2, str(tmp_path / "straight"), False, 2, 1, opts=_FSDP)
    ledger, resumed, _ = _stopped_and_resumed(tmp_path, "to3", 3)
    assert ledger == straight["steps"]
    _assert_same_weights(straight, resumed)
    hybrid = (*_FSDP, "MODEL.FSDP.SHARD_SIZE", 2)  # 2 replicas of 2 shards
    ledger, resumed, _ = _stopped_and_resumed(tmp_path, "to4", 4, resumed_opts=hybrid)
    assert ledger == straight["steps"]
    _assert_same_weights(straight, resumed)


@pytest.mark.slow
def test_a_ddp_checkpoint_resumes_sharded_and_a_sharded_one_under_ddp(tmp_path):
    straight = _on(2, str(tmp_path / "straight"), False, 2, 1, opts=_DDP)
    # DDP's file -> FSDP: every process keeps its shards of the file's whole tensors.
    ledger, resumed, out = _stopped_and_resumed(tmp_path, "ddp_fsdp", 2, _DDP, _FSDP)
    assert os.path.isfile(os.path.join(out, "model_0000005.pth"))
    assert os.path.isdir(os.path.join(out, "model_final"))
    assert ledger == straight["steps"]
    _assert_same_weights(straight, resumed)
    # FSDP's directory -> DDP: read whole on each process.
    ledger, resumed, out = _stopped_and_resumed(tmp_path, "fsdp_ddp", 2, _FSDP, _DDP)
    assert os.path.isfile(os.path.join(out, "model_final.pth"))
    assert ledger == straight["steps"]
    _assert_same_weights(straight, resumed)
