"""Faults injected through the real command line: kills, corrupt files, NaN, full disk, bad data.

Each test runs tools/train_net.py (through fault_wrapper.py, which injects one fault) in
subprocesses on the smoke config, and checks what the user sees and what is left on disk.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = str(Path(__file__).with_name("fault_wrapper.py"))
SMOKE = str(ROOT / "configs" / "smoke.yaml")
# no auto-scaling: the same iterations (and checkpoint names) with 1 and 2 processes
SHORT = [
    "SOLVER.MAX_ITER",
    "30",
    "SOLVER.CHECKPOINT_PERIOD",
    "10",
    "SOLVER.REFERENCE_WORLD_SIZE",
    "0",
]


def _run(out, *extra, fault="", num_gpus=1, resume=False, timeout=400, job_tag=""):
    args = [sys.executable, WRAPPER, "--config-file", SMOKE, "--num-gpus", str(num_gpus)]
    args += ["--resume"] if resume else []
    args += ["OUTPUT_DIR", str(out), *SHORT, *extra]
    env = dict(os.environ, TRAINKIT_TEST_FAULT=fault, TRAINKIT_TEST_JOB=job_tag)
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _processes_tagged(job_tag):
    """PIDs of live processes whose environment holds TRAINKIT_TEST_JOB=job_tag (ranks and
    loader workers inherit it from the command)."""
    needle = f"TRAINKIT_TEST_JOB={job_tag}".encode() + b"\0"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    found.append(int(pid))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _assert_tag_loadable(out):
    tag = (out / "last_checkpoint").read_text().strip()
    torch.load(out / tag, map_location="cpu", weights_only=True)  # never a partial file
    return tag


def _kill_when(out, condition, num_gpus, timeout=300):
    args = [
        sys.executable,
        WRAPPER,
        "--config-file",
        SMOKE,
        "--num-gpus",
        str(num_gpus),
        "--resume",
        "OUTPUT_DIR",
        str(out),
        *SHORT,
    ]
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TRAINKIT_TEST_FAULT=""),
    )
    deadline = time.monotonic() + timeout
    try:
        while not condition():
            assert proc.poll() is None, "the run ended before the kill point"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)  # the launcher; its workers die with it
        proc.wait()


def _killed_three_times_then_resumed(tmp_path, num_gpus):
    straight = tmp_path / "straight"
    result = _run(straight, num_gpus=num_gpus)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "killed"
    # 1: SIGKILL at an arbitrary moment after the first checkpoint (once its tag is written:
    # killing between the checkpoint's rename and the tag's write leaves no tag, rightly)
    tag = out / "last_checkpoint"
    _kill_when(out, lambda: tag.exists() and "model_0000009" in tag.read_text(), num_gpus)
    assert _assert_tag_loadable(out) == "model_0000009.pth"
    # 2: SIGKILL in the middle of writing the second checkpoint
    result = _run(out, fault="kill_during_save:model_0000019", num_gpus=num_gpus, resume=True)
    assert result.returncode != 0
    assert _assert_tag_loadable(out) == "model_0000009.pth"
    assert not (out / "model_0000019.pth").exists()
    # 3: SIGKILL while writing the final checkpoint
    result = _run(out, fault="kill_during_save:model_final", num_gpus=num_gpus, resume=True)
    assert result.returncode != 0
    assert _assert_tag_loadable(out) == "model_0000029.pth"
    # resume to the end: the same weights as the run that was never interrupted
    result = _run(out, num_gpus=num_gpus, resume=True)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = _weights(straight / "model_final.pth")
    got = _weights(out / "model_0000029.pth")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.slow
def test_killed_at_three_points_resumes_to_identical_weights(tmp_path):
    _killed_three_times_then_resumed(tmp_path, num_gpus=1)


@pytest.mark.slow
@pytest.mark.distributed
def test_killed_at_three_points_resumes_to_identical_weights_two_processes(tmp_path):
    _killed_three_times_then_resumed(tmp_path, num_gpus=2)


def test_sigterm_saves_a_checkpoint_and_exits_75(tmp_path):
    args = [
        sys.executable,
        WRAPPER,
        "--config-file",
        SMOKE,
        "OUTPUT_DIR",
        str(tmp_path),
        "SOLVER.MAX_ITER",
        "400",
        "SOLVER.CHECKPOINT_PERIOD",
        "1000",
    ]
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    metrics = tmp_path / "metrics.json"
    while not (metrics.exists() and metrics.read_text().strip()):  # training has started
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert "run the same command with --resume" in err.lower()
    tag = _assert_tag_loadable(tmp_path)
    assert re.fullmatch(r"model_\d{7}\.pth", tag)


def test_a_second_sigterm_exits_at_once_without_a_checkpoint(tmp_path):
    marker = tmp_path / "in_slow_step"
    out = tmp_path / "out"
    env = {
        **os.environ,
        "TRAINKIT_TEST_FAULT": "sleep_at_iter:3",
        "TRAINKIT_TEST_MARKER": str(marker),
    }
    args = [
        sys.executable,
        WRAPPER,
        "--config-file",
        SMOKE,
        "OUTPUT_DIR",
        str(out),
        "SOLVER.MAX_ITER",
        "400",
        "SOLVER.CHECKPOINT_PERIOD",
        "1000",
    ]
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():  # inside a step that sleeps for 60 s
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # graceful: would finish the step, then save
        time.sleep(2.5)  # later than the debounce window for one signal delivered twice
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()  # nothing is left behind if an assertion failed first
    log = stdout + stderr
    assert time.monotonic() - started < 10  # not after the 60 s step
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert "Received SIGTERM: finishing the current step" in log
    assert "Received SIGTERM again: exiting now without a checkpoint" in log
    assert not list(out.glob("*.pth")) and not (out / "last_checkpoint").exists()


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path):
    result = _run(tmp_path, "SOLVER.MAX_ITER", "20")
    assert result.returncode == 0, result.stderr[-3000:]
    final = tmp_path / "model_final.pth"
    final.write_bytes(final.read_bytes()[:1000])  # truncated
    result = _run(tmp_path, "SOLVER.MAX_ITER", "25", resume=True)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert re.search(r"Skipping checkpoint .*model_final\.pth", log)
    assert "Starting training from iteration 20" in log  # model_0000019 was the newest loadable


def test_non_finite_loss_names_iteration_and_keeps_last_checkpoint(tmp_path):
    result = _run(tmp_path, fault="nan_at_iter:15")
    assert result.returncode == NON_FINITE_EXIT_CODE  # not 1: restarts do not retry it
    assert re.search(r"infinite or NaN at iteration=14!.*loss_cls", result.stderr)
    assert _assert_tag_loadable(tmp_path) == "model_0000009.pth"


def test_disk_full_during_save_keeps_the_previous_checkpoint(tmp_path):
    result = _run(tmp_path, fault="enospc_on_save:model_0000019")
    assert result.returncode == 1
    assert "No space left on device" in result.stderr
    assert _assert_tag_loadable(tmp_path) == "model_0000009.pth"
    assert not list(tmp_path.glob(".*.tmp"))  # the partial temp file was removed


@pytest.mark.slow
def test_disk_full_during_a_background_save_is_raised_at_the_next_step(tmp_path):
    result = _run(tmp_path, "SOLVER.CHECKPOINT_ASYNC", "True", fault="enospc_on_save:model_0000019")
    assert result.returncode == 1
    assert re.search(r"CheckpointWriteError: .*model_0000019\.pth.*No space left", result.stderr)
    assert _assert_tag_loadable(tmp_path) == "model_0000009.pth"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_killed_during_a_background_save_keeps_the_previous_checkpoint(tmp_path):
    result = _run(tmp_path, "SOLVER.CHECKPOINT_ASYNC", "True", fault="kill_during_save:model_final")
    assert result.returncode != 0
    assert _assert_tag_loadable(tmp_path) == "model_0000029.pth"
    assert not (tmp_path / "model_final.pth").exists()
    assert list(tmp_path.glob(".model_final.pth.*.tmp"))  # the half-written file, under a temp name


def test_output_dir_that_cannot_be_created_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = _run(blocker / "out")
    assert result.returncode == 2
    assert "OUTPUT_DIR" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_mapper_errors_are_skipped_logged_and_counted(tmp_path):
    result = _run(tmp_path, "SOLVER.MAX_ITER", "10", fault="mapper_raises")
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert re.search(r"Skipping record \d+ of shapes_train .*injected mapper failure", log)
    skipped = [
        line
        for line in (tmp_path / "metrics.json").read_text().splitlines()
        if "skipped_records" in line
    ]
    assert skipped and '"data/skipped_records": 0' not in skipped[-1]


def test_a_loader_worker_that_dies_is_named(tmp_path):
    result = _run(tmp_path, "SOLVER.MAX_ITER", "10", fault="worker_dies:5")
    assert result.returncode == 1
    assert re.search(r"DataLoader worker \(pid \d+\) is killed by signal", result.stderr)


@pytest.mark.distributed
def test_a_rank_that_raises_mid_training_stops_the_job(tmp_path):
    start = time.monotonic()
    job_tag = f"raise-{os.getpid()}-{time.time_ns()}"
    result = _run(tmp_path, fault="raise_on_rank:1:5", num_gpus=2, job_tag=job_tag)
    assert result.returncode == 1
    assert "rank 1 raised an exception" in result.stderr
    assert "injected failure on rank 1 at step 5" in result.stderr
    assert "Traceback" in result.stderr  # the rank's own traceback is shown
    assert time.monotonic() - start < 120
    time.sleep(0.5)  # exit is asynchronous for the last children reaped
    assert _processes_tagged(job_tag) == []  # no rank or loader worker is left behind
