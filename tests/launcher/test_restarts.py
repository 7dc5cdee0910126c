"""launch(..., max_restarts=N): restarts on torch.distributed.elastic, resumes, never retries
a user error, a pre-emption or a non-finite loss."""

import logging
import os
import signal
import time

import pytest

from tests.dist import RankFailure, run_on_ranks
from tests.engine.test_default_trainer import _assert_same, _train, _two_rank_run
from trainkit.config import ConfigError
from trainkit.engine import hooks
from trainkit.engine.hooks.preemption import TrainingPreempted
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.launcher import LaunchError, launch
from trainkit.launcher.elastic import JobFailed, should_restart
from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainkit.launcher.restarts import is_restart, record_run_id, restart_count, run_id
from trainkit.utils import UsageError, comm


def _mark_round(directory):
    """Leave a file per (round, rank) and return the round, the same on every rank."""
    round_ = restart_count()
    open(os.path.join(directory, f"round{round_}.rank{comm.get_rank()}"), "w").close()
    return round_


def _rounds(directory):
    return sorted({name.split(".")[0] for name in os.listdir(directory)})


def _dies_in_the_first_round(directory, how):
    round_ = _mark_round(directory)
    comm.synchronize()  # the process group works in every round (stale keys would hang here)
    if round_ == 0 and comm.get_rank() == comm.get_world_size() - 1:
        if how == "raise":
            raise RuntimeError("the first round fails")
        os.kill(os.getpid(), signal.SIGKILL)
    comm.synchronize()
    return {"round": round_, "gather": comm.all_gather(round_)}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failed_job_is_restarted_on_every_rank(tmp_path, how):
    results = run_on_ranks(
        _dies_in_the_first_round, 2, args=(str(tmp_path), how), max_restarts=2, timeout_s=180
    )
    assert results == [{"round": 1, "gather": [1, 1]}] * 2
    assert _rounds(tmp_path) == ["round0", "round1"]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_machines_restart_together(tmp_path):
    results = run_on_ranks(
        _dies_in_the_first_round,
        2,
        args=(str(tmp_path), "raise"),
        num_machines=2,
        max_restarts=1,
        timeout_s=180,
    )
    assert results == [{"round": 1, "gather": [1, 1]}] * 2


def _always_fails(directory):
    _mark_round(directory)
    comm.synchronize()
    if comm.get_rank() == 1:
        raise RuntimeError("fails every time")
    comm.synchronize()


@pytest.mark.distributed
@pytest.mark.slow
def test_restarts_are_bounded_then_the_failed_rank_is_named(tmp_path):
    with pytest.raises(RankFailure, match=r"LaunchError: rank 1 raised an exception:") as info:
        run_on_ranks(_always_fails, 2, args=(str(tmp_path),), max_restarts=2, timeout_s=240)
    assert "RuntimeError: fails every time" in str(info.value)
    assert _rounds(tmp_path) == ["round0", "round1", "round2"]


def _user_error_on_rank_one(directory):
    _mark_round(directory)
    if comm.get_rank() == 1:
        raise ConfigError("SOLVER.BASE_LR must be >= 0, got -1.0")
    comm.synchronize()


@pytest.mark.distributed
def test_a_user_error_is_never_retried(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"UsageError: SOLVER.BASE_LR must be >= 0") as info:
        run_on_ranks(
            _user_error_on_rank_one, 2, args=(str(tmp_path),), max_restarts=3, timeout_s=120
        )
    assert "Traceback" not in str(info.value).split("\n", 1)[0]
    assert _rounds(tmp_path) == ["round0"]
    assert time.monotonic() - start < 90


def _preempted(directory):
    _mark_round(directory)
    comm.synchronize()
    raise TrainingPreempted("SIGTERM", 4, None)


@pytest.mark.distributed
def test_a_preempted_job_is_not_restarted(tmp_path):
    with pytest.raises(LaunchError, match="pre-empted") as info:
        launch(_preempted, 2, args=(str(tmp_path),), max_restarts=2)
    assert info.value.exit_code == 75
    assert _rounds(tmp_path) == ["round0"]


@pytest.mark.parametrize(
    ("kind", "exit_code", "restarts"),
    [
        ("error", 1, True),
        ("stall", 124, True),
        ("usage", 2, False),
        ("preempted", PREEMPTED_EXIT_CODE, False),
        ("non_finite", NON_FINITE_EXIT_CODE, False),
        ("error", NON_FINITE_EXIT_CODE, False),  # a rank's own status, however it was seen
    ],
)
def test_which_failures_are_restarted(kind, exit_code, restarts):
    failure = JobFailed("it failed", 0, exit_code, kind)
    assert should_restart(failure, restart_count=0, max_restarts=2) is restarts
    assert should_restart(failure, restart_count=2, max_restarts=2) is False


def _non_finite_on_rank_one(directory):
    _mark_round(directory)
    comm.synchronize()
    if comm.get_rank() == 1:  # a CPU loss checked every step: only its own rank sees it
        raise NonFiniteLossError(7, {"loss_cls": float("nan")})
    time.sleep(30)  # busy, as rank 0 would be in the all-reduce: the guard ends it with 65


@pytest.mark.distributed
def test_a_non_finite_loss_is_not_restarted(tmp_path):
    with pytest.raises(LaunchError, match="iteration=7") as info:
        launch(_non_finite_on_rank_one, 2, args=(str(tmp_path),), max_restarts=2)
    assert info.value.exit_code == NON_FINITE_EXIT_CODE
    assert _rounds(tmp_path) == ["round0"]


def _one_process_dies_once(directory):
    round_ = _mark_round(directory)
    if round_ == 0:
        os._exit(1)
    return round_


@pytest.mark.distributed
@pytest.mark.slow
def test_one_process_with_restarts_runs_under_the_agent(tmp_path):
    assert launch(_one_process_dies_once, 1, args=(str(tmp_path),), max_restarts=1) == [1]
    assert _rounds(tmp_path) == ["round0", "round1"]


def _torchruns_counts_after_one_failure(directory):
    if _mark_round(directory) == 0:
        os._exit(1)
    return {n: os.environ[n] for n in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")}


@pytest.mark.distributed
@pytest.mark.slow
def test_each_round_tells_its_processes_the_restart_count_as_torchrun_does(tmp_path):
    # Every round runs under a new agent (which would say 0); the launcher's count is passed on.
    counts = launch(_torchruns_counts_after_one_failure, 1, args=(str(tmp_path),), max_restarts=2)
    assert counts == [{"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "2"}]


class _KillAt(hooks.CallbackHook):
    """SIGKILL this process after iteration ``k`` (a crash that leaves no trace)."""

    def __init__(self, k):
        def after_step(trainer):
            if trainer.iter == k:
                os.kill(os.getpid(), signal.SIGKILL)

        super().__init__(after_step=after_step)


def _crash_once_then_finish(output_dir):
    from tests.engine import test_default_trainer as helpers

    if restart_count() == 0 and comm.get_rank() == 1:
        original = helpers.RegressionTrainer.build_hooks
        # In this process only: crash after iteration 7, past the checkpoint of iteration 4.
        helpers.RegressionTrainer.build_hooks = lambda self: [*original(self), _KillAt(7)]
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("trainkit.launcher.restarts").addHandler(handler)
    out = _train(output_dir)  # no resume=True: a restarted job resumes by itself
    return {**{k: out[k] for k in ("weights", "momentum", "start_iter")}, "log": messages}


@pytest.mark.distributed
@pytest.mark.slow
def test_a_restarted_trainer_resumes_by_itself_to_the_same_weights(tmp_path):
    straight = run_on_ranks(_two_rank_run, 2, args=(str(tmp_path / "a"), "straight"), timeout_s=180)
    restarted = run_on_ranks(
        _crash_once_then_finish, 2, args=(str(tmp_path / "b"),), max_restarts=1, timeout_s=240
    )
    assert [r["start_iter"] for r in restarted] == [5, 5]  # resumed from model_0000004
    for rank in range(2):
        _assert_same(straight[rank], restarted[rank])
    resumed = [m for m in restarted[0]["log"] if m.startswith("restart 1: resuming from")]
    assert resumed and resumed[0].endswith("model_0000004.pth"), restarted[0]["log"]


def test_negative_restarts_refused():
    with pytest.raises(UsageError, match="--max-restarts must be at least 0, got -1"):
        launch(lambda: None, 2, max_restarts=-1)


@pytest.fixture
def no_job_env(monkeypatch):
    names = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "TRAINKIT_RESTART_COUNT")
    for name in (*names, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_run_id_comes_from_the_agent_else_from_slurm(no_job_env):
    assert run_id() == ""
    no_job_env.setenv("SLURM_JOB_ID", "77")
    assert run_id() == "slurm-77"
    no_job_env.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default: no id
    assert run_id() == "slurm-77"
    no_job_env.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert run_id() == "elastic-abc"


def test_a_restart_resumes_only_the_checkpoints_of_its_own_run(tmp_path, no_job_env):
    no_job_env.setenv("TORCHELASTIC_RUN_ID", "first")
    assert not is_restart(str(tmp_path))  # nothing recorded yet
    record_run_id(str(tmp_path))
    assert is_restart(str(tmp_path))
    no_job_env.setenv("TORCHELASTIC_RUN_ID", "second")  # another job in the same directory
    assert not is_restart(str(tmp_path))
    no_job_env.delenv("TORCHELASTIC_RUN_ID")
    assert not is_restart(str(tmp_path))
    no_job_env.setenv("TRAINKIT_RESTART_COUNT", "1")  # no run id: the job's count decides
    assert is_restart(str(tmp_path))


def test_a_restarted_trainer_resumes_without_being_asked(tmp_path, no_job_env):
    no_job_env.setenv("TORCHELASTIC_RUN_ID", "job-1")
    straight = _train(tmp_path / "straight", workers=0)
    _train(tmp_path / "run", stop_after=7, workers=0)  # dies after iteration 7; checkpoint of 4
    assert (tmp_path / "run" / "run_id").read_text().strip() == "elastic-job-1"
    no_job_env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("trainkit.launcher.restarts").addHandler(handler)
    try:
        restarted = _train(tmp_path / "run", workers=0)  # resume=False, as without --resume
    finally:
        logging.getLogger("trainkit.launcher.restarts").removeHandler(handler)
    assert restarted["start_iter"] == 5
    _assert_same(straight, restarted)
    assert f"restart 1: resuming from {tmp_path / 'run' / 'model_0000004.pth'}" in messages
    # another run in the same directory starts afresh
    no_job_env.setenv("TORCHELASTIC_RUN_ID", "job-2")
    assert _train(tmp_path / "run", max_iter=2, workers=0)["start_iter"] == 0
