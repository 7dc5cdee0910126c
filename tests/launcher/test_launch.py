"""launch(): spawning, multi-machine, torchrun, failure propagation and rendezvous."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.dist import RankFailure, free_port, run_on_ranks
from trainkit.launcher import LaunchError, launch
from trainkit.utils import comm


def _ranks():
    import torch.distributed as dist

    return {
        "rank": comm.get_rank(),
        "local_rank": comm.get_local_rank(),
        "world": comm.get_world_size(),
        "local_size": comm.get_local_size(),
        "backend": dist.get_backend(),
        "local_gather": comm.all_gather(comm.get_rank(), group=comm.get_local_process_group()),
        "global_gather": comm.all_gather(comm.get_rank()),
    }


def _identity(x):
    return x


@pytest.mark.distributed
def test_world_size_one_runs_in_process():
    assert launch(_identity, 1, args=(5,)) == [5]


@pytest.mark.distributed
def test_two_machines_of_two_processes():
    results = run_on_ranks(_ranks, 4, num_machines=2, timeout_s=90)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
    assert all(r["world"] == 4 and r["local_size"] == 2 for r in results)
    assert all(r["backend"] == "gloo" for r in results)
    assert [r["local_gather"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(r["global_gather"] == [0, 1, 2, 3] for r in results)


def _raise_on_rank_one():
    if comm.get_rank() == 1:
        raise ValueError("boom from rank one")
    comm.synchronize()  # rank 0 waits in a collective that will never complete


def _sigkill_rank_one():
    if comm.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_gather("never completes")


def _exit_rank_one():
    if comm.get_rank() == 1:
        os._exit(3)
    comm.synchronize()


def _recording_pid(func_name, directory):
    with open(os.path.join(directory, f"pid{comm.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    globals()[func_name]()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_raise_on_rank_one, r"rank 1 raised an exception:(.|\n)*ValueError: boom from rank one"),
        (_sigkill_rank_one, r"rank 1 was killed by signal SIGKILL"),
        (_exit_rank_one, r"rank 1 exited with status 3"),
    ],
)
def test_failed_rank_stops_the_job_promptly(func, expected, tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchError, match=expected) as info:
        launch(_recording_pid, 2, args=(func.__name__, str(tmp_path)))
    assert info.value.rank == 1
    pids = [int((tmp_path / f"pid{rank}").read_text()) for rank in range(2)]
    assert not any(_alive(pid) for pid in pids)  # no process left behind
    # far below any collective timeout; generous for a loaded CI machine
    assert time.monotonic() - start < 30


def _sleep_forever_unless_rank3():
    if comm.get_rank() == 3:
        raise RuntimeError("machine 1 fails")
    time.sleep(300)


@pytest.mark.distributed
def test_failure_on_one_machine_stops_the_other():
    with pytest.raises(RankFailure) as info:
        run_on_ranks(_sleep_forever_unless_rank3, 4, num_machines=2, timeout_s=120)
    text = str(info.value)
    assert "rank 3 raised an exception" in text
    assert "stopped from another machine" in text


@pytest.mark.slow  # 16 processes: a stress test of free ports and rendezvous (28 s in CI)
@pytest.mark.distributed
def test_eight_jobs_started_at_once_all_succeed():
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(run_on_ranks, _ranks, 2, timeout_s=120) for _ in range(8)]
        results = [f.result() for f in futures]
    assert all([r["rank"] for r in job] == [0, 1] for job in results)


def test_detectron2_import_paths_name_the_launchers_launch():
    import trainkit.engine
    import trainkit.launcher
    from trainkit.engine.launch import DEFAULT_TIMEOUT, LaunchError
    from trainkit.engine.launch import launch as from_module

    assert trainkit.engine.launch is from_module is launch is trainkit.launcher.launch
    assert trainkit.engine.LaunchError is LaunchError is trainkit.launcher.LaunchError
    assert trainkit.engine.DEFAULT_TIMEOUT is DEFAULT_TIMEOUT is trainkit.launcher.DEFAULT_TIMEOUT


def test_argument_errors():
    with pytest.raises(ValueError, match="--machine-rank 2 is out of range"):
        launch(_identity, 1, num_machines=2, machine_rank=2)
    with pytest.raises(ValueError, match="at least 1"):
        launch(_identity, 0)
    with pytest.raises(ValueError, match="works on one machine only"):
        launch(_identity, 1, num_machines=2, machine_rank=0, dist_url="auto")
    with pytest.raises(ValueError, match="not understood"):
        launch(_identity, 2, dist_url="udp://x")


def test_too_many_gpus_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="--num-gpus 4 asks for more GPUs than this machine shows"):
        launch(_identity, 4)


def test_backend_choice(monkeypatch):
    # The choice moved with the joining of the job into trainkit.launcher.job (used by
    # launch()'s processes, torchrun's and srun's alike).
    from trainkit.launcher import job

    assert job.default_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(job.dist, "is_nccl_available", lambda: True)
    assert job.default_backend() == "nccl"


def test_port_clash_is_one_line_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=rf"tcp://127.0.0.1:{port} is already in use"):
            launch(_identity, 2, dist_url=f"tcp://127.0.0.1:{port}")


def test_unreachable_rendezvous_times_out_with_address():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"tcp://127.0.0.1:{port}"):
        launch(
            _identity,
            1,
            num_machines=2,
            machine_rank=1,
            dist_url=f"tcp://127.0.0.1:{port}",
            rendezvous_timeout_s=1.0,
        )
    assert time.monotonic() - start < 20


_TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from trainkit.engine import launch
    from trainkit.utils import comm

    def main(tag):
        return {"tag": tag, "rank": comm.get_rank(), "world": comm.get_world_size(),
                "local_rank": comm.get_local_rank(), "gather": comm.all_gather(comm.get_rank())}

    # num_gpus_per_machine is ignored under torchrun: the environment decides
    print(json.dumps(launch(main, 8, args=("x",))[0]))
    """
)


@pytest.mark.distributed
def test_torchrun_style_start_joins_through_env(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_TORCHRUN_SCRIPT)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outputs.append(out)
    import json

    results = [json.loads(o.strip().splitlines()[-1]) for o in outputs]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["gather"] == [0, 1] for r in results)
    assert [r["local_rank"] for r in results] == [0, 1]


class _Preempted(Exception):
    exit_code = 75


def _preempted_everywhere():
    comm.synchronize()
    raise _Preempted("stopped by SIGTERM")


@pytest.mark.distributed
def test_worker_exit_code_is_carried_to_launch_error():
    with pytest.raises(LaunchError) as info:
        launch(_preempted_everywhere, 2)
    assert info.value.exit_code == 75
