"""A DeepLab-style semantic-segmentation project trains, evaluates and resumes exactly.

The script (tests/compat/scripts/d2_sem_seg_train_net.py) has the pieces of detectron2's
projects/DeepLab: add_*_config, a SEM_SEG_HEADS_REGISTRY head on ASPP, SemanticSegmentor,
load_sem_seg data, DatasetMapper with RandomCrop_CategoryAreaConstraint, SemSegEvaluator and
a scheduler on _get_warmup_factor_at_iter.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "d2_sem_seg_train_net.py"


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


def _final_eval(out):
    evals = [m for m in _metrics(out) if "sem_seg/mIoU" in m]
    assert evals, "no evaluation in metrics.json"
    return {k: v for k, v in evals[-1].items() if k.startswith("sem_seg/")}


def _train(out):
    _run(out)
    results = _final_eval(out)
    assert {"sem_seg/mIoU", "sem_seg/fwIoU", "sem_seg/mACC", "sem_seg/pACC"} <= set(results)
    assert {"sem_seg/IoU-grey", "sem_seg/IoU-red", "sem_seg/IoU-blue"} <= set(results)
    losses = [m["loss_sem_seg"] for m in _metrics(out) if "loss_sem_seg" in m]
    assert losses and all(math.isfinite(v) for v in losses)
    for name in ("model_0000003.pth", "model_0000007.pth", "model_final.pth"):
        assert (out / name).exists()
    return results


def test_sem_seg_project_trains_and_evaluates(tmp_path):
    _train(tmp_path / "run")


@pytest.mark.slow
def test_sem_seg_project_resumes_exactly_and_evaluates_its_weights(tmp_path):
    out = tmp_path / "run"
    results = _train(out)
    # An interrupted run: keep the iteration-3 checkpoint only, and resume from it.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "model_0000003.pth").write_bytes((out / "model_0000003.pth").read_bytes())
    (resumed / "last_checkpoint").write_text("model_0000003.pth")
    log = _run(resumed, "--resume")
    assert "Starting training from iteration 4" in log
    assert _final_eval(resumed) == pytest.approx(results)

    # --eval-only with the final weights gives the same numbers.
    log = _run(tmp_path / "eval", "--eval-only", "MODEL.WEIGHTS", str(out / "model_final.pth"))
    assert f"{results['sem_seg/mIoU']:.4f}" in log


@pytest.mark.slow
@pytest.mark.distributed
def test_sem_seg_project_on_two_processes(tmp_path):
    out = tmp_path / "run2"
    _run(out, "--num-gpus", "2")
    results = _final_eval(out)
    assert 0.0 <= results["sem_seg/mIoU"] <= 100.0
    assert (out / "model_final.pth").exists()
