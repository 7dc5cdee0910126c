"""A LazyConfig project in detectron2's layout trains with tools/lazyconfig_train_net.py.

The project is written here the way detectron2's new-style configs are: a main config that
pulls ``optimizer``, ``lr_multiplier``, ``dataloader``, ``model`` and ``train`` from
``common/`` files by relative import or ``model_zoo.get_config``; a data config in the shape
of detectron2's ``common/data/coco.py`` (a registered dataset, the default ``DatasetMapper``
with ``ResizeShortestEdge``/``RandomFlip`` through ``LazyCall``, no data seed, so the loader
draws one); and a small classifier of the project's own. The run trains, evaluates, resumes
(continuing the drawn data stream) and evaluates a checkpoint with ``--eval-only``.
"""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "lazyconfig_train_net.py"

_PROJECT = {
    "tinyproj/__init__.py": "",
    "tinyproj/data.py": """
        import os

        import numpy as np
        from PIL import Image

        from trainkit.data import DatasetCatalog, MetadataCatalog

        def _records(split, count):
            root = os.path.join(os.environ["TINYPROJ_DATA"], split)
            os.makedirs(root, exist_ok=True)
            rng = np.random.RandomState(len(split))
            records = []
            for i in range(count):
                label, h, w = i % 2, int(rng.randint(16, 24)), int(rng.randint(16, 24))
                image = rng.randint(0, 60, size=(h, w, 3)).astype(np.uint8)
                image[..., label] += 150
                path = os.path.join(root, f"{i}.png")
                if not os.path.exists(path):
                    Image.fromarray(image).save(path)
                records.append(
                    {"file_name": path, "image_id": i, "height": h, "width": w, "label": label}
                )
            return records

        DatasetCatalog.register("tinyproj_train", lambda: _records("train", 16))
        DatasetCatalog.register("tinyproj_val", lambda: _records("val", 8))
        MetadataCatalog.get("tinyproj_val").set(thing_classes=["red", "green"])
    """,
    "tinyproj/model.py": """
        import torch
        from torch import nn
        from torch.nn import functional as F

        class TinyClassifier(nn.Module):
            def __init__(self, num_classes, channels):
                super().__init__()
                self.net = nn.Sequential(
                    nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes),
                )

            def forward(self, batched_inputs):
                images = [x["image"].float()[None] / 255.0 for x in batched_inputs]
                logits = torch.cat([self.net(image) for image in images])
                if not self.training:
                    return logits
                labels = torch.tensor([x["label"] for x in batched_inputs])
                return {"loss_cls": F.cross_entropy(logits, labels)}
    """,
    "configs/common/data/tiny.py": """
        from omegaconf import OmegaConf

        import trainkit.data.transforms as T
        from trainkit.config import LazyCall as L
        from trainkit.data import (
            DatasetMapper,
            build_detection_test_loader,
            build_detection_train_loader,
            get_detection_dataset_dicts,
        )
        from trainkit.evaluation import ClassificationEvaluator

        import tinyproj.data  # registers the datasets

        dataloader = OmegaConf.create()
        dataloader.train = L(build_detection_train_loader)(
            dataset=L(get_detection_dataset_dicts)(names="tinyproj_train"),
            mapper=L(DatasetMapper)(
                is_train=True,
                augmentations=[
                    L(T.ResizeShortestEdge)(
                        short_edge_length=(12, 16, 20), sample_style="choice", max_size=32
                    ),
                    L(T.RandomFlip)(horizontal=True),
                ],
                image_format="RGB",
                use_instance_mask=False,
            ),
            total_batch_size=4,
            num_workers=0,
        )
        dataloader.test = L(build_detection_test_loader)(
            dataset=L(get_detection_dataset_dicts)(names="tinyproj_val", filter_empty=False),
            mapper=L(DatasetMapper)(
                is_train=False,
                augmentations=[L(T.ResizeShortestEdge)(short_edge_length=16, max_size=32)],
                image_format="${...train.mapper.image_format}",
            ),
            num_workers=0,
        )
        dataloader.evaluator = L(ClassificationEvaluator)(dataset_name="${..test.dataset.names}")
    """,
    "configs/common/models/tiny.py": """
        from trainkit.config import LazyCall as L

        from tinyproj.model import TinyClassifier

        model = L(TinyClassifier)(num_classes=2, channels=4)
    """,
    "configs/tiny/tiny_1x.py": """
        from trainkit import model_zoo

        from ..common.data.tiny import dataloader
        from ..common.models.tiny import model

        optimizer = model_zoo.get_config("common/optim.py").SGD
        optimizer.lr = 0.05
        lr_multiplier = model_zoo.get_config("common/coco_schedule.py").lr_multiplier_1x
        train = model_zoo.get_config("common/train.py").train
        train.device = "cpu"
        train.max_iter = 6
        train.checkpointer.period = 3
        train.eval_period = 0
        train.log_period = 3
    """,
}


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    for name, text in _PROJECT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _run(project, *args):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(project)]),
        "TINYPROJ_DATA": str(project / "data"),
    }
    result = subprocess.run(
        [sys.executable, str(TOOL), "--config-file", "configs/tiny/tiny_1x.py", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _losses(out):
    rows = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    return {row["iteration"]: row["loss_cls"] for row in rows if "loss_cls" in row}


def _train_resume_evaluate(project, *launch):
    out = project / "out"
    log = _run(project, *launch, f"train.output_dir={out}")
    losses = _losses(out)
    assert sorted(losses) == [2, 5] and all(math.isfinite(v) for v in losses.values())
    assert (out / "model_0000002.pth").exists()
    assert (out / "last_checkpoint").read_text().strip() == "model_final.pth"
    assert "classification/top1" in (out / "metrics.json").read_text()
    origins = (out / "config_origins.yaml").read_text()
    # Set by the model zoo's optimizer, which line 7 takes: that line, nothing appended.
    assert re.search(r"^optimizer\.momentum: 0\.9 +# configs/tiny/tiny_1x\.py:7$", origins, re.M)

    log = _run(project, *launch, "--resume", f"train.output_dir={out}", "train.max_iter=9")
    assert "Starting training from iteration 6" in log
    # The data config sets no seed: the loader drew one, and the resume continues its stream.
    assert "Continuing the data stream of the checkpoint" in log
    assert sorted(_losses(out)) == [2, 5, 8]

    log = _run(
        project,
        *launch,
        "--eval-only",
        f"train.output_dir={project / 'eval'}",
        f"train.init_checkpoint={out / 'model_final.pth'}",
    )
    assert "copypaste: top1,top5" in log


def test_lazyconfig_project_trains_resumes_and_evaluates(project):
    _train_resume_evaluate(project)


@pytest.mark.slow
@pytest.mark.distributed
def test_lazyconfig_project_on_two_processes(project):
    _train_resume_evaluate(project, "--num-gpus", "2")
