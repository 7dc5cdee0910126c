"""An unbiased-teacher-style project with its own loop trains, evaluates and resumes.

The script (tests/compat/scripts/d2_semisup_train_net.py) keeps that project's trainer
shape: DefaultTrainer subclass that skips DefaultTrainer.__init__, teacher + student in one
checkpoint through a DetectionCheckpointer subclass overriding _load_model, its own
train_loop and run_step on ``self._trainer._data_loader_iter``, EMA teacher, pseudo-labels,
metrics through comm.gather, EvalHooks for student and teacher, TEST.VAL_LOSS in its config.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "d2_semisup_train_net.py"


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


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]


def _check_training(out, log):
    metrics = _metrics(out)
    losses = [m for m in metrics if "loss_cls" in m]
    assert losses and all(math.isfinite(m["total_loss"]) for m in losses)
    # After the burn-in (4 steps) the teacher's pseudo-labels add the unsupervised loss.
    assert any("loss_cls_pseudo" in m for m in metrics)
    evals = [m for m in metrics if "classification/top1" in m]
    assert evals and "classification_student/top1" in evals[0]
    # Student and teacher are evaluated at the period end (5) and once more after training.
    assert log.count("copypaste: Task: classification") == 4
    state = torch.load(out / "model_final.pth", weights_only=True)["model"]
    assert any(k.startswith("modelTeacher.") for k in state)
    assert any(k.startswith("modelStudent.") for k in state)


def test_semisup_project_trains_and_evaluates(tmp_path):
    out = tmp_path / "run"
    _check_training(out, _run(out))
    assert (out / "model_0000005.pth").exists()


@pytest.mark.slow
def test_semisup_project_resumes_and_evaluates_its_weights(tmp_path):
    out = tmp_path / "run"
    _check_training(out, _run(out))

    # An interrupted run resumes from its iteration-5 checkpoint, through the project's
    # own checkpointer (_load_model) and resume_or_load.
    (out / "model_final.pth").unlink()
    (out / "model_0000011.pth").unlink()
    (out / "last_checkpoint").write_text("model_0000005.pth")
    log = _run(out, "--resume")
    assert "Starting training from iteration 6" in log
    assert "TSCheckpointer._load_model called" in log
    assert (out / "model_final.pth").exists()

    _run(tmp_path / "eval", "--eval-only", "MODEL.WEIGHTS", str(out / "model_final.pth"))
    results = json.loads((tmp_path / "eval" / "eval_only.json").read_text())
    assert 0.0 <= results["classification"]["top1"] <= 100.0


@pytest.mark.slow
@pytest.mark.distributed
def test_semisup_project_on_two_processes(tmp_path):
    out = tmp_path / "run2"
    _check_training(out, _run(out, "--num-gpus", "2"))
