"""tools/plain_train_net.py: the explicit loop trains, writes receipts, resumes, evaluates."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAIN = str(ROOT / "tools" / "plain_train_net.py")
SMOKE = str(ROOT / "configs" / "smoke.yaml")
FAST = ["DATALOADER.NUM_WORKERS", "0", "SOLVER.CHECKPOINT_PERIOD", "3", "WRITER_PERIOD", "2"]


def _run(*opts, flags=(), env=None):
    result = subprocess.run(
        [sys.executable, PLAIN, "--config-file", SMOKE, *flags, *FAST, *opts],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_plain_loop_trains_resumes_and_evaluates(tmp_path):
    log = _run("OUTPUT_DIR", str(tmp_path), "SOLVER.MAX_ITER", "4")
    assert "Starting training from iteration 0" in log
    assert "copypaste: top1,top5" in log
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"
    lines = [json.loads(x) for x in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 3]
    assert {"total_loss", "loss_cls", "lr"} <= set(lines[-1])

    log = _run("OUTPUT_DIR", str(tmp_path), "SOLVER.MAX_ITER", "6", flags=["--resume"])
    assert "Starting training from iteration 4" in log
    lines = [json.loads(x) for x in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 3, 5]


@pytest.mark.slow  # 16 s: two runs of the plain loop; its train/resume/eval test stays default
def test_a_process_of_the_same_job_resumes_by_itself_another_job_does_not(tmp_path):
    # What a process restarted by --max-restarts (or torchrun, or SLURM) sees: the job's run
    # id is the one recorded next to the checkpoints, so it resumes without --resume.
    job = {"TORCHELASTIC_RUN_ID": "job-a"}
    _run("OUTPUT_DIR", str(tmp_path), "SOLVER.MAX_ITER", "4", env=job)
    assert (tmp_path / "run_id").read_text().strip() == "elastic-job-a"
    log = _run("OUTPUT_DIR", str(tmp_path), "SOLVER.MAX_ITER", "6", env=job)
    assert "resuming from" in log and "model_final.pth" in log
    assert "Starting training from iteration 4" in log
    # another job in the same OUTPUT_DIR starts over, as without --resume
    log = _run(
        "OUTPUT_DIR", str(tmp_path), "SOLVER.MAX_ITER", "2", env={"TORCHELASTIC_RUN_ID": "b"}
    )
    assert "Starting training from iteration 0" in log
