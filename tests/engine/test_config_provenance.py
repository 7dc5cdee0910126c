"""Origins recorded by the engine: auto-scaling, the run-time SEED, default_setup's files."""

import argparse
import logging
import os

import pytest
import torch
import yaml
from torch import nn

from trainkit.config import get_cfg
from trainkit.config.provenance import config_changes
from trainkit.config.scaling import auto_scale_config
from trainkit.data import build_train_loader
from trainkit.engine import DefaultTrainer, default_argument_parser, default_setup, launch


@pytest.fixture
def restore_logging():
    yield
    for name in ("trainkit", "fvcore"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
            h.close()
        lg.propagate = True


def _written_for_two(tmp_path):
    """A config file written for 2 processes, as a user would have it."""
    path = tmp_path / "two.yaml"
    path.write_text(
        "SOLVER:\n"
        "  REFERENCE_WORLD_SIZE: 2\n"
        "  IMS_PER_BATCH: 8\n"
        "  BASE_LR: 0.2\n"
        "  MAX_ITER: 10\n"
        "  STEPS: (6,)\n"
        "  WARMUP_ITERS: 2\n"
        "  CHECKPOINT_PERIOD: 5\n"
    )
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    return cfg, path


def test_auto_scaling_origin_names_the_scaling_and_what_it_replaced(tmp_path):
    cfg, path = _written_for_two(tmp_path)
    scaled = auto_scale_config(cfg, 4)
    assert scaled.SOLVER.BASE_LR == pytest.approx(0.4)
    assert scaled.get_origin("SOLVER.BASE_LR") == (
        f"auto-scaling from 2 to 4 processes (was 0.2, from {path}:4)"
    )
    assert scaled.get_origin("SOLVER.REFERENCE_WORLD_SIZE").startswith(
        "auto-scaling from 2 to 4 processes (was 2"
    )
    assert scaled.get_origin("SOLVER.GAMMA") is None  # not scaled, still the default
    assert cfg.get_origin("SOLVER.BASE_LR") == f"{path}:4"  # the input is not modified


def test_config_yaml_is_the_scaled_config_and_reloads_without_scaling_again(
    tmp_path, restore_logging
):
    cfg, _ = _written_for_two(tmp_path)
    cfg.OUTPUT_DIR = str(tmp_path / "run1")
    default_setup(cfg, None)  # a world size of 1 here: half the batch, twice the steps
    assert (cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.MAX_ITER, cfg.SOLVER.REFERENCE_WORLD_SIZE) == (
        4,
        20,
        1,
    )
    dumped = yaml.safe_load((tmp_path / "run1" / "config.yaml").read_text())
    assert dumped["SOLVER"]["IMS_PER_BATCH"] == 4 and dumped["SOLVER"]["MAX_ITER"] == 20
    assert dumped["SOLVER"]["REFERENCE_WORLD_SIZE"] == 1
    origins = (tmp_path / "run1" / "config_origins.yaml").read_text()
    assert "SOLVER.REFERENCE_WORLD_SIZE: 1" in origins
    assert "# auto-scaling from 2 to 1 processes (was 2" in origins

    again = get_cfg()
    again.merge_from_file(str(tmp_path / "run1" / "config.yaml"))
    again.OUTPUT_DIR = str(tmp_path / "run2")
    default_setup(again, None)
    assert again.SOLVER.IMS_PER_BATCH == 4 and again.SOLVER.MAX_ITER == 20
    assert DefaultTrainer.auto_scale_workers(again, 1) == again  # nothing left to scale
    lines = (tmp_path / "run1" / "config.yaml").read_text().splitlines()
    line = lines.index("  MAX_ITER: 20") + 1
    assert again.get_origin("SOLVER.MAX_ITER") == f"{tmp_path / 'run1' / 'config.yaml'}:{line}"


def test_config_origins_file_lists_each_changed_key_with_its_origin(tmp_path, restore_logging):
    cfg = get_cfg()
    cfg.merge_from_list(["SOLVER.BASE_LR", "0.3"])
    cfg.OUTPUT_DIR = str(tmp_path / "out")
    default_setup(cfg, None)
    text = (tmp_path / "out" / "config_origins.yaml").read_text()
    rows = dict(line.split("#", 1) for line in text.splitlines() if not line.startswith("#"))
    rows = {value.strip(): origin.strip() for value, origin in rows.items()}
    assert rows["SOLVER.BASE_LR: 0.3"] == "command line"
    assert rows[f"OUTPUT_DIR: {cfg.OUTPUT_DIR}"] == "code"  # set by this test
    assert yaml.safe_load(text) == {"OUTPUT_DIR": cfg.OUTPUT_DIR, "SOLVER.BASE_LR": 0.3}


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(1, 1)

    def forward(self, batch):
        return {"loss": self.w(torch.stack(batch)).pow(2).mean()}


class _TinyTrainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _Tiny()

    @classmethod
    def build_train_loader(cls, cfg):
        records = [{"x": [float(i)], "width": 1, "height": 1} for i in range(16)]
        return build_train_loader(cfg, mapper=lambda r: torch.tensor(r["x"]), dataset=records)

    def build_writers(self):
        return []


def test_random_seed_drawn_by_the_trainer_has_a_run_time_origin(tmp_path):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path)
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.DATALOADER.NUM_WORKERS = 0  # the default (4, detectron2's) would fork for nothing here
    cfg.DATASETS.TEST = ()
    assert cfg.SEED < 0
    trainer = _TinyTrainer(cfg)
    assert trainer.cfg.SEED >= 0
    origin = trainer.cfg.get_origin("SEED")
    assert origin.startswith("run time: a random seed shared by all ranks (was -1, the default)")
    changes = {c.key: c.origin for c in config_changes(trainer.cfg, get_cfg())}
    assert changes["SEED"] == origin


def test_parser_has_print_config():
    args = default_argument_parser().parse_args(["--print-config", "SOLVER.BASE_LR", "1"])
    assert args.print_config and args.opts == ["SOLVER.BASE_LR", "1"]
    assert not default_argument_parser().parse_args([]).print_config


def _pid(args):
    return os.getpid(), args.num_gpus


def test_launch_starts_no_process_for_print_config():
    args = argparse.Namespace(print_config=True, num_gpus=2)
    assert launch(_pid, 2, args=(args,)) == [(os.getpid(), 2)]


def test_default_setup_prints_origins_for_the_planned_world_size_and_exits(
    tmp_path, capsys, restore_logging
):
    cfg, path = _written_for_two(tmp_path)
    cfg.OUTPUT_DIR = str(tmp_path / "never")
    args = argparse.Namespace(print_config=True, num_gpus=4, num_machines=1)
    with pytest.raises(SystemExit) as stop:
        default_setup(cfg, args)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "for a job of 4 processes" in out
    assert "SOLVER.BASE_LR: 0.4" in out and "# auto-scaling from 2 to 4 processes" in out
    assert "SOLVER.STEPS: [3]" in out
    assert not (tmp_path / "never").exists()  # printing creates nothing
