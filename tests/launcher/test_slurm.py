"""SLURM's environment read as a job's: node lists, ranks, the rendezvous address."""

import pytest

from trainkit.launcher.slurm import (
    SlurmEnvironmentError,
    expand_nodelist,
    rendezvous_port,
    slurm_variables,
)
from trainkit.utils import UsageError


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[8-10],b", ["a8", "a9", "a10", "b"]),
        ("gpu-[1-2]-x,cpu[005]", ["gpu-1-x", "gpu-2-x", "cpu005"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("", []),
    ],
)
def test_nodelist_expansion(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[01-03", "node]", "node[a-b]", "node[1-]"])
def test_malformed_nodelist_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="SLURM|range"):
        expand_nodelist(bad)


def _task(procid, localid, nodeid, **extra):
    env = {
        "SLURM_JOB_ID": "4321",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "node[07-08]",
    }
    env.update(extra)
    return env


def test_four_tasks_on_two_nodes_map_to_torchrun_variables():
    got = [slurm_variables(_task(r, r % 2, r // 2), num_gpus_per_machine=1) for r in range(4)]
    assert [g["RANK"] for g in got] == ["0", "1", "2", "3"]
    assert [g["LOCAL_RANK"] for g in got] == ["0", "1", "0", "1"]
    assert {g["WORLD_SIZE"] for g in got} == {"4"}
    assert {g["LOCAL_WORLD_SIZE"] for g in got} == {"2"}
    assert {g["MASTER_ADDR"] for g in got} == {"node07"}  # the first node of the step
    assert {g["MASTER_PORT"] for g in got} == {str(20000 + 4321)}


def test_port_and_address_overrides():
    assert rendezvous_port({"SLURM_JOB_ID": "123456"}) == 20000 + 3456
    assert rendezvous_port({"SLURM_JOB_ID": "123456", "MASTER_PORT": "29500"}) == 29500
    got = slurm_variables(_task(0, 0, 0, MASTER_ADDR="10.0.0.5"), 1)
    assert got["MASTER_ADDR"] == "10.0.0.5"


def test_not_a_multi_task_step_means_launch_starts_the_processes():
    assert slurm_variables({}, 1) is None
    batch_script = {k: v for k, v in _task(0, 0, 0).items() if k != "SLURM_STEP_ID"}
    assert slurm_variables(batch_script, 1) is None  # sbatch's script itself, not an srun task
    single = _task(0, 0, 0, SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1")
    assert slurm_variables(single, 1) is None
    # detectron2's way: one task per node, each a launcher of 8 processes
    per_node = _task(1, 0, 1, SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    assert slurm_variables(per_node, 8) is None


@pytest.mark.parametrize(
    ("env", "num_gpus", "message"),
    [
        (_task(0, 0, 0, SLURM_STEP_TASKS_PER_NODE="3,1"), 1, "same number of tasks"),
        (_task(0, 0, 0), 4, "leave --num-gpus at 1"),
        (_task(1, 0, 1), 1, "--distribution=block"),  # cyclic: task 1 on node 1
        (_task(0, 0, 0, SLURM_STEP_NODELIST=""), 1, "set MASTER_ADDR"),
    ],
)
def test_steps_that_cannot_run_say_what_to_change(env, num_gpus, message):
    with pytest.raises(SlurmEnvironmentError, match=message) as info:
        slurm_variables(env, num_gpus)
    assert isinstance(info.value, UsageError) and "\n" not in str(info.value)
