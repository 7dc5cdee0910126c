"""Joining a job: the environment, the per-round namespace of the store, the guard."""

import datetime
import json
import threading
import time

import pytest
import torch.distributed as dist

from trainkit.launcher import job, job_store
from trainkit.launcher.job import JobEnvironment
from trainkit.launcher.restarts import restart_count


def _env(rank, world_size=2, restart_count=0):
    return JobEnvironment(
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        master_addr="127.0.0.1",
        master_port=0,
        agent_store=True,
        restart_count=restart_count,
    )


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10))
    yield server


def _client(server):
    return dist.TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=10))


def _agree(server, envs, delays):
    """Run _agree_on_round for each env in its own thread (rank r starts after delays[r])."""
    results = {}

    def run(env, delay):
        time.sleep(delay)
        results[env.rank] = job_store.agree_on_round(
            _client(server), env.rank, env.world_size, env.restart_count, timeout_s=10
        )

    threads = [threading.Thread(target=run, args=(e, d)) for e, d in zip(envs, delays)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    return results


def test_each_round_gets_a_fresh_namespace_even_when_a_rank_reads_the_old_one(store):
    first = _agree(store, [_env(0), _env(1)], [0, 0])
    assert first[0] == first[1] and first[0][1] == 0
    # The next round: rank 1 starts first and finds the dead round's namespace (and its
    # "ready" record) still in the store, as it is in an elastic agent's store.
    second = _agree(store, [_env(0), _env(1)], [0.5, 0])
    assert second[0] == second[1]
    assert second[0][0] != first[0][0] and second[0][1] == 1
    # keys of the dead round are not visible in the new namespace
    dist.PrefixStore(first[0][0], store).set("rank_1_address", "dead")
    assert not dist.PrefixStore(second[0][0], store).check(["rank_1_address"])


def test_the_round_index_is_the_highest_restart_count_any_rank_knows(store):
    # A fresh store (rank 0's, or one re-created on another machine) still counts restarts.
    got = _agree(store, [_env(0), _env(1, restart_count=3)], [0, 0])
    assert got[0][1] == got[1][1] == 3


def test_restart_count_reads_the_job_first_then_torchrun_then_slurm(monkeypatch):
    for name in ("TRAINKIT_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    assert restart_count() == 0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert restart_count() == 1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert restart_count() == 2
    monkeypatch.setenv("TRAINKIT_RESTART_COUNT", "3")
    assert restart_count() == 3


def test_environment_needs_every_torchrun_variable():
    base = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
    }
    env = JobEnvironment.from_environ({**base, "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert env.rank == 1 and env.agent_store and env.restart_count == 0
    assert not JobEnvironment.from_environ(base).agent_store  # plain env://: rank 0 serves it
    assert JobEnvironment.from_environ({k: v for k, v in base.items() if k != "RANK"}) is None


def test_guard_stops_the_process_on_another_ranks_failure(store):
    round_store = dist.PrefixStore("r", store)
    stopped = []
    guard = job._Guard(round_store, _env(1, world_size=3), stopped.append)
    guard.start()
    job_store.post_abort(round_store, {"rank": 0, "message": "rank 0 raised", "exit_code": 1})
    job_store.post_abort(round_store, {"rank": 2, "message": "an echo", "exit_code": 1})
    deadline = time.monotonic() + 5
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    guard.stop()
    assert [r["message"] for r in stopped] == ["rank 0 raised"]  # the first failure only


def test_guard_of_rank_zero_posts_a_stall(store):
    round_store = dist.PrefixStore("r", store)
    now = time.time()
    for rank, (phase, it, since) in enumerate([("forward/backward", 5, 9.0), ("data", 5, 8.0)]):
        record = {
            "rank": rank,
            "phase": phase,
            "iteration": it,
            "started_at": now - since,
            "timeout_s": 3.0,
        }
        round_store.set(job.HEARTBEAT_KEY.format(rank=rank), json.dumps(record))
    stopped = []
    guard = job._Guard(round_store, _env(0), stopped.append)
    guard.start()
    deadline = time.monotonic() + 5
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    guard.stop()
    assert stopped and stopped[0]["rank"] == 1 and stopped[0]["exit_code"] == 124
    assert "rank 1 stopped making progress" in stopped[0]["message"]
    assert job_store.read_abort(round_store)["rank"] == 1  # posted for every other process


def test_a_rank_whose_peer_vanished_stops_with_the_cause_the_peer_posted(store):
    # Rank 0's all-reduce fails with "Connection closed by peer" when rank 3 exits; its log
    # must name rank 3's exception, which rank 3 posts just before exiting.
    echo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:1")
    assert job._is_secondary(echo)
    assert not job._is_secondary(ValueError("boom"))
    round_store = dist.PrefixStore("r", store)
    cause = {"rank": 3, "message": "rank 3 raised an exception", "exit_code": 1}
    threading.Timer(0.3, job_store.post_abort, (round_store, cause)).start()
    assert job._wait_for_abort(round_store) == cause  # posted after the echo was seen


def test_a_vanished_peer_that_posted_nothing_is_waited_for_a_moment_only(store):
    round_store = dist.PrefixStore("r", store)
    start = time.monotonic()
    assert job._wait_for_abort(round_store) is None  # SIGKILLed: the launcher names it
    assert job._SETTLE_S <= time.monotonic() - start < job._SETTLE_S + 2
