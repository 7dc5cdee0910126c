"""default_setup through one adapter: a LazyConfig's receipts, seeds and origins; both kinds."""

import argparse
import logging
import textwrap

import numpy as np
import pytest
import torch
import yaml

from trainkit.config import LazyConfig, get_cfg
from trainkit.config.run_config import run_config
from trainkit.engine import default_setup
from trainkit.utils.errors import MissingFileError, UsageError


@pytest.fixture
def restore_logging():
    yield
    for name in ("trainkit", "fvcore"):
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
            handler.close()
        lg.propagate = True


def _config(tmp_path, extra=""):
    path = tmp_path / "cfg.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import torch
            from trainkit.config import LazyCall as L
            model = L(torch.nn.Linear)(in_features=2, out_features=3)
            train = dict(output_dir={str(tmp_path / "out")!r}, seed=7, max_iter=5)
            {extra}
            """
        )
    )
    return str(path)


def _args(config_file, *opts, **flags):
    return argparse.Namespace(config_file=config_file, opts=list(opts), **flags)


def test_a_lazyconfig_run_writes_a_reloadable_config_origins_and_seeds(tmp_path, restore_logging):
    path = _config(tmp_path)
    cfg = LazyConfig.apply_overrides(LazyConfig.load(path), ["train.max_iter=9"])
    assert default_setup(cfg, _args(path, "train.max_iter=9")) is cfg
    out = tmp_path / "out"
    reloaded = LazyConfig.load(str(out / "config.yaml"))
    assert reloaded.train.max_iter == 9 and reloaded.model._target_ == "torch.nn.Linear"
    origins = yaml.safe_load((out / "config_origins.yaml").read_text())
    assert origins["train.max_iter"] == 9
    text = (out / "config_origins.yaml").read_text()
    assert "train.max_iter: 9" in text and "# command line" in text
    assert (out / "env.txt").exists()
    assert "Seeded torch, numpy and random with 7" in (out / "log.txt").read_text()
    a = (torch.rand(1).item(), np.random.rand())
    torch.manual_seed(0)
    default_setup(cfg, None)
    assert (torch.rand(1).item(), np.random.rand()) == a
    cfg.train.max_iter = 11  # a LazyConfig stays mutable, as in detectron2
    assert cfg.train.max_iter == 11


def test_a_config_yaml_cannot_hold_is_logged_and_the_run_goes_on(tmp_path, restore_logging):
    path = _config(tmp_path, "extra = dict(fn=lambda x: x)")
    cfg = LazyConfig.load(path)
    default_setup(cfg, _args(path))
    out = tmp_path / "out"
    assert not (out / "config.yaml").exists()
    assert "cannot save the config" in (out / "log.txt").read_text()
    assert (out / "config_origins.yaml").exists()


def test_lazy_weights_are_checked_before_the_run(tmp_path, restore_logging):
    path = _config(tmp_path)
    cfg = LazyConfig.load(path)
    cfg.train.init_checkpoint = str(tmp_path / "missing.pth")
    with pytest.raises(MissingFileError, match="train.init_checkpoint file not found"):
        default_setup(cfg, _args(path))
    cfg.train.init_checkpoint = ""
    with pytest.raises(UsageError, match="--eval-only needs train.init_checkpoint"):
        default_setup(cfg, _args(path, eval_only=True, resume=False))


def _rows(text):
    rows = {}
    for line in text.splitlines():
        if "  # " in line and not line.startswith("#"):
            key_value, origin = line.split("  # ", 1)
            rows[key_value.split(":", 1)[0]] = origin.strip()
    return rows


def test_print_config_of_a_lazyconfig_lists_the_origins_its_merges_recorded(tmp_path, capsys):
    # Recorded by load and apply_overrides: the script's flags are not read again.
    path = _config(tmp_path)
    cfg = LazyConfig.apply_overrides(LazyConfig.load(path), ["train.max_iter=9"])
    cfg.train.seed = 3  # code
    with pytest.raises(SystemExit) as stop:
        default_setup(cfg, argparse.Namespace(print_config=True, num_gpus=2, num_machines=1))
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "for a job of 2 processes" in out
    rows = _rows(out)
    line = next(i for i, x in enumerate(open(path).read().splitlines(), 1) if "train =" in x)
    assert rows["train.output_dir"] == f"{path}:{line}"
    assert rows["model._target_"] == f"{path}:{line - 1}"
    assert rows["train.max_iter"] == "command line"
    assert rows["train.seed"] == "code"
    assert not (tmp_path / "out").exists()


def test_one_adapter_reads_either_kind_of_config(tmp_path):
    lazy = run_config(LazyConfig.load(_config(tmp_path)))
    assert (lazy.output_dir, lazy.seed, lazy.weights) == (str(tmp_path / "out"), 7, "")
    assert lazy.weights_key == "train.init_checkpoint"
    assert lazy.scaled(8) is lazy  # a LazyConfig is not rescaled
    cfg = get_cfg()
    cfg.merge_from_list(["SOLVER.REFERENCE_WORLD_SIZE", "1", "OUTPUT_DIR", str(tmp_path)])
    yacs = run_config(cfg)
    assert (yacs.output_dir, yacs.seed, yacs.weights_key) == (str(tmp_path), -1, "MODEL.WEIGHTS")
    scaled = yacs.scaled(2)
    assert scaled.cfg.SOLVER.IMS_PER_BATCH == 2 * cfg.SOLVER.IMS_PER_BATCH
    assert {c.key: c.origin for c in scaled.changes()}["SOLVER.IMS_PER_BATCH"].startswith(
        "auto-scaling from 1 to 2 processes"
    )
    yacs.scale_in_place(2)
    assert cfg == scaled.cfg and not cfg.is_frozen()
    yacs.freeze()
    assert cfg.is_frozen()
