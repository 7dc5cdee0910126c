"""tools/plot_metrics.py on the metrics.json of real (tiny) training runs."""

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.data import build_batch_data_loader, build_train_loader
from trainkit.data.common import DatasetFromList
from trainkit.data.samplers import InferenceSampler
from trainkit.engine import DefaultTrainer
from trainkit.evaluation import DatasetEvaluator
from trainkit.utils.events import JSONWriter

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "plot_metrics.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("plot_metrics", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1, 1)

    def forward(self, batch):
        x = torch.stack([b[0] for b in batch])
        y = torch.stack([b[1] for b in batch])
        pred = self.fc(x)
        if not self.training:
            return (pred - y).abs()
        return {"loss_fit": nn.functional.mse_loss(pred, y)}


class _ErrorEvaluator(DatasetEvaluator):
    def reset(self):
        self._errors = []

    def process(self, inputs, outputs):
        self._errors.extend(outputs.flatten().tolist())

    def evaluate(self):
        return {"fit": {"mean_abs_error": sum(self._errors) / len(self._errors)}}


def _pairs(n):
    return [(torch.tensor([i / n]), torch.tensor([2.0 * i / n + 1.0])) for i in range(n)]


class _LineTrainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _Line()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=lambda r: r, dataset=_pairs(32))

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        data = DatasetFromList(_pairs(8), serialize=False)
        return build_batch_data_loader(data, InferenceSampler(len(data)), 4, drop_last=False)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name):
        return _ErrorEvaluator()

    def build_writers(self):
        return [JSONWriter(os.path.join(self.cfg.OUTPUT_DIR, "metrics.json"))]


def _train(output_dir, lr):
    output_dir.mkdir(parents=True)
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.SEED = 1
    cfg.DATASETS.TEST = ("line_val",)
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.BASE_LR = lr
    cfg.SOLVER.MAX_ITER = 20
    cfg.SOLVER.STEPS = ()
    cfg.SOLVER.WARMUP_ITERS = 0
    cfg.SOLVER.CHECKPOINT_PERIOD = 1000
    cfg.TEST.EVAL_PERIOD = 10
    cfg.WRITER_PERIOD = 5
    _LineTrainer(cfg).train()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, lr in (("fast", 0.1), ("slow", 0.01)):
        _train(root / name, lr)
    return root


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_runs_wrote_what_the_plot_reads(runs):
    lines = [json.loads(x) for x in (runs / "fast" / "metrics.json").read_text().splitlines()]
    keys = set().union(*lines)
    assert {"total_loss", "loss_fit", "lr", "fit/mean_abs_error"} <= keys


def test_plot_command_overlays_runs_into_one_png(runs, tmp_path):
    out = tmp_path / "plots" / "compare.png"
    result = subprocess.run(
        [sys.executable, str(TOOL), str(runs / "fast"), str(runs / "slow"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {out}" in result.stdout
    width, height = _png_size(out)
    assert width > 0 and height > 0 and out.stat().st_size > 0


def test_one_run_is_written_next_to_its_metrics_by_default(runs):
    tool = _load_tool()
    written = tool.main([str(runs / "slow")])
    assert written == os.path.join(str(runs / "slow"), "metrics.png")
    assert _png_size(Path(written))[0] > 0


def test_a_missing_metrics_json_is_one_line_and_status_2(tmp_path):
    result = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path / "nothing_here")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no metrics.json in" in lines[0], result.stderr
    assert "nothing_here" in lines[0]


def test_panels_order_and_what_is_left_out():
    keys = {
        "loss_cls",
        "total_loss",
        "lr",
        "time",
        "data_time",
        "eta_seconds",
        "data/skipped_records",
        "[metric]amp_skipped_steps",
        "validation/loss_cls",
        "classification/top1",
    }
    assert _load_tool().plotted_keys(keys) == [
        "total_loss",
        "loss_cls",
        "lr",
        "validation/loss_cls",
        "classification/top1",
    ]


def test_resumed_run_last_write_wins_and_a_cut_line_is_skipped(tmp_path):
    (tmp_path / "metrics.json").write_text(
        '{"iteration": 4, "total_loss": 3.0}\n'
        '{"iteration": 9, "total_loss": 2.0}\n'
        '{"iteration": 9, "total_loss": 2.5}\n'  # rewritten after a resume
        '{"iteration": 14, "total_lo'  # the run died while writing
    )
    series = _load_tool().read_metrics(str(tmp_path))
    assert series == {"total_loss": [(4, 3.0), (9, 2.5)]}


def test_run_labels_are_directory_names_unless_they_clash():
    tool = _load_tool()
    assert tool.run_labels(["out/a", "out/b/"]) == ["a", "b"]
    assert tool.run_labels(["x/run", "y/run"]) == ["x/run", "y/run"]
