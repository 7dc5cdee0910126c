"""A DefaultTrainer with a validation-loss hook runs with trainkit for detectron2.

The project (tests/compat/scripts/d2_val_loss_hook_project.py) has the widely copied
``LossEvalHook`` pattern of public projects such as pawelbeza/ClothesDetectorModel: the hook
inserted at ``hooks.insert(-1, ...)``, ``hooks[1]`` replaced by an ``LRScheduler`` subclass
that steps a plateau scheduler on the validation loss, and the default loaders and mapper.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

SCRIPT = Path(__file__).resolve().parent / "scripts" / "d2_val_loss_hook_project.py"

CONFIG = """\
MODEL:
  META_ARCHITECTURE: "ImageClassifier"
  NUM_CLASSES: 3
  CLASSIFIER:
    CHANNELS: [4, 8]
DATASETS:
  TRAIN: ("project_train",)
  TEST: ("project_val",)
DATALOADER:
  NUM_WORKERS: 0
  SAMPLER_TRAIN: "RepeatFactorTrainingSampler"
  REPEAT_THRESHOLD: 0.5
INPUT:
  MIN_SIZE_TRAIN: (12,)
  MAX_SIZE_TRAIN: 16
  MIN_SIZE_TEST: 12
  MAX_SIZE_TEST: 16
SOLVER:
  LR_SCHEDULER_NAME: "ReduceLROnPlateau"
  IMS_PER_BATCH: 4
  BASE_LR: 0.05
  WARMUP_ITERS: 4
  MAX_ITER: 12
  CHECKPOINT_PERIOD: 6
TEST:
  EVAL_PERIOD: 4
WRITER_PERIOD: 4  # the writers keep each scalar's latest value only: write every evaluation
"""


def _dataset(root, split, n):
    rng = np.random.default_rng(len(split))
    (root / split).mkdir(parents=True)
    records = []
    for i in range(n):
        label = i % 3
        image = rng.integers(0, 80, size=(10 + i % 3, 14, 3), dtype=np.uint8)
        image[..., label] += 150
        path = root / split / f"{i}.png"
        Image.fromarray(image).save(path)
        # what RepeatFactorTrainingSampler reads; the default mapper passes it through
        annotations = [{"category_id": label}]
        records.append(
            {"file_name": str(path), "image_id": i, "label": label, "annotations": annotations}
        )
    (root / f"{split}.json").write_text(json.dumps(records))


@pytest.fixture
def project(tmp_path):
    _dataset(tmp_path / "data", "train", 20)
    _dataset(tmp_path / "data", "val", 8)
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    return tmp_path


def _run(project, *args):
    data = project / "data"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--config-file", str(project / "cfg.yaml")]
        + ["--train-json", str(data / "train.json"), "--val-json", str(data / "val.json")]
        + [*args, "OUTPUT_DIR", str(project / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _metrics(project):
    lines = (project / "run" / "metrics.json").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _plateau_state(project):
    checkpoint = torch.load(project / "run" / "model_final.pth", weights_only=True)
    return checkpoint["trainer"]["hooks"]["LRSchedulerWithLossHook"]


def _check_run(project, max_iter):
    metrics = _metrics(project)
    val = {m["iteration"]: m["validation_loss"] for m in metrics if "validation_loss" in m}
    assert sorted(val) == list(range(3, max_iter, 4))  # every EVAL_PERIOD and the last
    assert all(math.isfinite(v) for v in val.values())
    assert [m for m in metrics if "classification/top1" in m][-1]["iteration"] == max_iter
    assert (project / "run" / "last_checkpoint").read_text().strip() == "model_final.pth"


def test_validation_loss_hook_project_trains_resumes_and_evaluates(project):
    log = _run(project)
    assert "LRSchedulerWithLossHook, PeriodicCheckpointer" in log  # hooks[1] replaced
    assert "LossEvalHook, PeriodicWriter (priority 100)" in log  # insert(-1): before the writer
    assert "Not checkpointed: hook LRSchedulerWithLossHook's state['_warmup']" in log
    _check_run(project, 12)
    lrs = {m["iteration"]: m["lr"] for m in _metrics(project) if "lr" in m}
    start = 0.05 * 0.001  # WARMUP_FACTOR * BASE_LR: the project's own warm-up drives the lr
    # set at iteration 2 by the project's warm-up, not by the default WarmupMultiStepLR
    assert lrs[3] == pytest.approx(start + 0.5 * (0.05 - start))
    assert (project / "run" / "model_0000005.pth").exists()
    assert _plateau_state(project)["last_epoch"] == 8  # plateau steps after the warm-up

    log = _run(project, "--resume", "SOLVER.MAX_ITER", "16")
    assert "Starting training from iteration 12" in log
    _check_run(project, 16)
    assert _plateau_state(project)["last_epoch"] == 12  # continued from the saved state

    _run(project, "--eval-only", "MODEL.WEIGHTS", str(project / "run" / "model_final.pth"))
    result = json.loads((project / "run" / "eval_only.json").read_text())
    assert set(result["classification"]) == {"top1"}


@pytest.mark.slow
@pytest.mark.distributed
def test_validation_loss_hook_project_on_two_processes(project):
    _run(project, "--num-gpus", "2")
    _check_run(project, 12)
    log = _run(project, "--num-gpus", "2", "--resume", "SOLVER.MAX_ITER", "16")
    assert "Starting training from iteration 12" in log
    _check_run(project, 16)
    assert _plateau_state(project)["last_epoch"] == 12
