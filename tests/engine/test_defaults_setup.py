"""default_argument_parser and default_setup."""

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from trainkit.config import get_cfg
from trainkit.engine import default_argument_parser, default_setup


def test_parser_flags_and_trailing_opts():
    args = default_argument_parser().parse_args(
        ["--config-file", "a.yaml", "--num-gpus", "2", "--resume", "SOLVER.BASE_LR", "0.1"]
    )
    assert args.config_file == "a.yaml" and args.num_gpus == 2 and args.resume
    assert not args.eval_only
    assert (args.num_machines, args.machine_rank, args.dist_url) == (1, 0, "auto")
    assert args.max_restarts == 0
    assert args.opts == ["SOLVER.BASE_LR", "0.1"]
    args = default_argument_parser().parse_args(["--max-restarts", "3", "SOLVER.MAX_ITER", "5"])
    assert args.max_restarts == 3 and args.opts == ["SOLVER.MAX_ITER", "5"]


@pytest.fixture
def restore_logging():
    yield
    for name in ("trainkit", "fvcore"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
            h.close()
        lg.propagate = True


def test_default_setup_writes_receipts_and_seeds(tmp_path, restore_logging):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path / "out")
    cfg.SEED = 42
    default_setup(cfg, None)
    out = tmp_path / "out"
    assert (out / "config.yaml").exists() and (out / "env.txt").exists()
    assert "PyTorch" in (out / "env.txt").read_text()
    logging.getLogger("trainkit.test").info("hello log file")
    assert "hello log file" in (out / "log.txt").read_text()
    assert "Seeded torch, numpy and random with 42" in (out / "log.txt").read_text()
    a = (torch.rand(1).item(), np.random.rand())
    reloaded = get_cfg()
    reloaded.merge_from_file(str(out / "config.yaml"))
    assert reloaded == cfg
    assert cfg.is_frozen()
    cfg2 = get_cfg()
    cfg2.OUTPUT_DIR = str(tmp_path / "out2")
    cfg2.SEED = 42
    default_setup(cfg2, None)
    assert (torch.rand(1).item(), np.random.rand()) == a


def test_random_seed_is_logged(tmp_path, restore_logging):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path)
    cfg.SEED = -1
    default_setup(cfg, None)
    assert "Using a random seed:" in (tmp_path / "log.txt").read_text()


def test_unwritable_output_dir_is_refused(tmp_path, restore_logging):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(blocker / "sub")
    with pytest.raises(PermissionError, match="OUTPUT_DIR .* cannot be created"):
        default_setup(cfg, None)


def test_collect_env_module_runs():
    out = subprocess.run(
        [sys.executable, "-m", "trainkit.utils.collect_env"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for item in ("PyTorch", "CUDA available", "distributed: Gloo", "trainkit git SHA", "fvcore"):
        assert item in out.stdout


def test_detectron2_keys_trainkit_does_not_read_are_logged_once(tmp_path, restore_logging):
    cfg = get_cfg()
    cfg.merge_from_list(
        ["MODEL.ROI_HEADS.NUM_CLASSES", "3", "INPUT.MIN_SIZE_TEST", "64", "SOLVER.BASE_LR", "0.1"]
    )
    cfg.OUTPUT_DIR = str(tmp_path)
    default_setup(cfg, None)
    lines = [
        line for line in (tmp_path / "log.txt").read_text().splitlines() if "not used by" in line
    ]
    assert len(lines) == 1
    # INPUT.MIN_SIZE_TEST is read by DefaultPredictor; SOLVER.BASE_LR is trainkit's own key
    assert lines[0].endswith("only a project's own code reads): MODEL.ROI_HEADS.NUM_CLASSES")


def test_nothing_is_logged_when_no_detectron2_only_key_is_set(tmp_path, restore_logging):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(tmp_path)
    default_setup(cfg, None)
    assert "not used by trainkit" not in (tmp_path / "log.txt").read_text()
