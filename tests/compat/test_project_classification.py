"""An image-classification project on detectron2's engine runs with trainkit for detectron2.

The project (tests/compat/scripts/d2_classification_project.py) has the patterns of public
ones such as tkianai/ImageClassification.detectron2: a META_ARCH_REGISTRY classifier over a
BACKBONE_REGISTRY backbone, an ``add_*_config`` on detectron2's ``_C``, a ``DatasetMapper``
subclass that sets ``tfm_gens``, detection-only imports it never uses, and train_net.py's
main. It trains, evaluates, resumes and evaluates alone, on 1 and 2 processes.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SCRIPT = Path(__file__).resolve().parent / "scripts" / "d2_classification_project.py"

CONFIG = """\
MODEL:
  META_ARCHITECTURE: "ClsNet"
  BACKBONE:
    NAME: "build_tinynet_backbone"
  PIXEL_MEAN: [128.0, 128.0, 128.0]
  PIXEL_STD: [64.0, 64.0, 64.0]
  TINYNET:
    WIDTH: 4
  CLSNET:
    NUM_CLASSES: 3
    INPUT_SIZE: 12
DATASETS:
  TRAIN: ("tiny_cls_train",)
  TEST: ("tiny_cls_val",)
DATALOADER:
  ASPECT_RATIO_GROUPING: False
  NUM_WORKERS: 0
SOLVER:
  IMS_PER_BATCH: 8
  BASE_LR: 0.05
  STEPS: ()
  MAX_ITER: 12
  WARMUP_ITERS: 2
  CHECKPOINT_PERIOD: 6
TEST:
  EVAL_PERIOD: 6
INPUT:
  CROP:
    ENABLED: True
VERSION: 2
"""


def _dataset(root, split, n):
    """``n`` images whose dominant colour channel is their label, and their JSON records."""
    rng = np.random.default_rng(len(split))
    (root / split).mkdir(parents=True)
    records = []
    for i in range(n):
        label = i % 3
        image = rng.integers(0, 80, size=(10 + i % 4, 14, 3), dtype=np.uint8)
        image[..., label] += 150
        path = root / split / f"{i}.png"
        Image.fromarray(image).save(path)
        records.append({"file_name": str(path), "image_id": i, "label": label})
    (root / f"{split}.json").write_text(json.dumps(records))


@pytest.fixture
def project(tmp_path):
    _dataset(tmp_path / "data", "train", 24)
    _dataset(tmp_path / "data", "val", 12)
    (tmp_path / "cls.yaml").write_text(CONFIG)
    return tmp_path


def _run(project, *args):
    env = dict(os.environ, CLS_PROJECT_DATA=str(project / "data"))
    out = project / "run"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--config-file", str(project / "cls.yaml"), *args]
        + ["OUTPUT_DIR", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _metrics(project):
    lines = (project / "run" / "metrics.json").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _check_trained(project, max_iter):
    metrics = _metrics(project)
    losses = [m["loss_cls"] for m in metrics if "loss_cls" in m]
    assert losses and all(math.isfinite(x) for x in losses)
    evals = [m for m in metrics if "accuracy/top1" in m]
    assert [m["iteration"] for m in evals][-1] == max_iter
    assert all(m["accuracy/count"] == 12 for m in evals)  # every val image, whatever the ranks
    assert (project / "run" / "last_checkpoint").read_text().strip() == "model_final.pth"


def test_classification_project_trains_resumes_and_evaluates(project):
    log = _run(project)
    assert "tfm_gens (detectron2 0.1's name) replaces the augmentations" in log
    _check_trained(project, 12)
    assert (project / "run" / "model_0000005.pth").exists()

    log = _run(project, "--resume", "SOLVER.MAX_ITER", "16")
    assert "Starting training from iteration 12" in log
    _check_trained(project, 16)
    assert max(m["iteration"] for m in _metrics(project) if "loss_cls" in m) == 15

    weights = project / "run" / "model_final.pth"
    _run(project, "--eval-only", "MODEL.WEIGHTS", str(weights))
    result = json.loads((project / "run" / "eval_only.json").read_text())
    assert set(result) == {"accuracy"} and result["accuracy"]["count"] == 12


@pytest.mark.slow
@pytest.mark.distributed
def test_classification_project_on_two_processes(project):
    _run(project, "--num-gpus", "2")
    _check_trained(project, 12)
    log = _run(project, "--num-gpus", "2", "--resume", "SOLVER.MAX_ITER", "16")
    assert "Starting training from iteration 12" in log
    _check_trained(project, 16)
