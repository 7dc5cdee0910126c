"""default_setup with a LazyConfig: receipts, reloadable config.yaml, seeds, stays mutable."""

import argparse
import logging
import textwrap

import numpy as np
import pytest
import torch
import yaml

from trainkit.config import LazyConfig
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


def test_lazy_setup_writes_a_reloadable_config_and_origins_and_seeds(tmp_path, restore_logging):
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
