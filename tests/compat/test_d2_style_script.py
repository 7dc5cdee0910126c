"""A detectron2 training script runs unchanged but for its imports (tests/compat/scripts/)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "d2_style_train_net.py"


def _run(out, *args):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "OUTPUT_DIR", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _check_run(out, max_iter):
    seen = json.loads((out / "seen.json").read_text())
    assert seen["max_iter"] == max_iter
    metrics = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert any("toy/accuracy" in m for m in metrics)  # put from inside the model
    assert (out / "last_checkpoint").read_text().strip() == "model_final.pth"
    return seen["seen"]


def test_detectron2_style_script_trains_resumes_and_evaluates(tmp_path):
    out = tmp_path / "run"
    _run(out)
    assert _check_run(out, 12) == list(range(12))
    assert (out / "model_0000005.pth").exists()
    log = _run(out, "--resume", "SOLVER.MAX_ITER", "16")
    assert "Starting training from iteration 12" in log
    assert _check_run(out, 16) == list(range(12, 16))
    _run(out, "--eval-only", "MODEL.WEIGHTS", str(out / "model_final.pth"))


@pytest.mark.distributed
def test_detectron2_style_script_on_two_processes(tmp_path):
    out = tmp_path / "run2"
    _run(out, "--num-gpus", "2")
    assert _check_run(out, 12) == list(range(12))
