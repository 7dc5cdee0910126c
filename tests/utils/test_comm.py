"""comm without a process group, and every comm function on a real 2-process Gloo job."""

import pytest
import torch

from tests.dist import run_on_ranks
from trainkit.utils import comm


def test_single_process_defaults():
    assert comm.get_world_size() == 1
    assert comm.get_rank() == 0
    assert comm.get_local_rank() == 0
    assert comm.get_local_size() == 1
    assert comm.is_main_process()
    comm.synchronize()
    assert comm.all_gather({"a": 1}) == [{"a": 1}]
    assert comm.gather([1, 2]) == [[1, 2]]
    seed = comm.shared_random_seed()
    assert isinstance(seed, int) and 0 <= seed < 2**31
    d = {"x": torch.tensor(2.0)}
    assert comm.reduce_dict(d) is d


def test_local_group_missing_message():
    comm.reset_local_process_group()
    with pytest.raises(RuntimeError, match="launch"):
        comm.get_local_process_group()


def _every_comm_function():
    rank = comm.get_rank()
    out = {
        "rank": rank,
        "world": comm.get_world_size(),
        "local_rank": comm.get_local_rank(),
        "local_size": comm.get_local_size(),
        "is_main": comm.is_main_process(),
        # arbitrary picklable objects, of different sizes on each rank
        "all_gather": comm.all_gather({"rank": rank, "payload": "x" * (rank * 1000 + 1)}),
        "gather": comm.gather((rank, [rank] * 3), dst=0),
        "gather_dst1": comm.gather(rank * 7, dst=1),
        "seed": comm.shared_random_seed(),
        "local_all_gather": comm.all_gather(rank, group=comm.get_local_process_group()),
    }
    reduced = comm.reduce_dict({"b": torch.tensor(float(rank + 1)), "a": torch.tensor(10.0 * rank)})
    out["reduce_avg"] = {k: float(v) for k, v in reduced.items()}
    reduced = comm.reduce_dict({"a": torch.tensor(float(rank + 1))}, average=False)
    out["reduce_sum"] = float(reduced["a"])
    comm.synchronize()
    return out


@pytest.mark.distributed
def test_comm_on_two_processes():
    r0, r1 = run_on_ranks(_every_comm_function, 2, timeout_s=60)
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["world"] == r1["world"] == 2
    assert (r0["local_rank"], r1["local_rank"]) == (0, 1)
    assert r0["local_size"] == 2
    assert r0["is_main"] and not r1["is_main"]
    expected = [{"rank": 0, "payload": "x"}, {"rank": 1, "payload": "x" * 1001}]
    assert r0["all_gather"] == r1["all_gather"] == expected
    assert r0["gather"] == [(0, [0, 0, 0]), (1, [1, 1, 1])]
    assert r1["gather"] == []
    assert r0["gather_dst1"] == [] and r1["gather_dst1"] == [0, 7]
    assert r0["seed"] == r1["seed"]
    assert r0["local_all_gather"] == [0, 1]
    assert r0["reduce_avg"] == {"a": 5.0, "b": 1.5}
    assert r0["reduce_sum"] == 3.0
