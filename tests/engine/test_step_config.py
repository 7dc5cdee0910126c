"""The step trainer a config describes: SOLVER.AMP.PRECISION and its checks."""

import itertools

import pytest
import torch
from torch import nn

from trainkit.config import ConfigError, get_cfg
from trainkit.engine import AMPTrainer, SimpleTrainer
from trainkit.engine.step_config import (
    amp_precision,
    build_step_trainer,
    check_step_arithmetic,
)
from trainkit.utils import UsageError


def _parts():
    model = nn.Linear(4, 1)
    return model, itertools.repeat(torch.ones(2, 4)), torch.optim.SGD(model.parameters(), lr=0.1)


def _cfg(enabled=True, precision=""):
    cfg = get_cfg()
    cfg.SOLVER.AMP.ENABLED = enabled
    cfg.SOLVER.AMP.PRECISION = precision
    return cfg


@pytest.mark.parametrize(
    ("precision", "dtype", "has_scaler"),
    [
        ("", torch.bfloat16, False),
        ("bfloat16", torch.bfloat16, False),
        ("float16", torch.float16, True),
    ],
)
def test_precision_picks_the_dtype_and_the_scaler(precision, dtype, has_scaler):
    step = build_step_trainer(_cfg(precision=precision), *_parts())
    assert isinstance(step, AMPTrainer)
    assert step.precision == dtype  # "" on the CPU: bfloat16, as before the key existed
    assert (step.grad_scaler is not None) is has_scaler
    check_step_arithmetic(_cfg(precision=precision), step)


def test_an_unknown_precision_names_the_key():
    with pytest.raises(ConfigError, match="SOLVER.AMP.PRECISION.*'fp16'"):
        build_step_trainer(_cfg(precision="fp16"), *_parts())
    with pytest.raises(ConfigError, match="SOLVER.AMP.PRECISION"):
        amp_precision(_cfg(enabled=False, precision="half"))


def test_a_step_with_another_precision_than_the_config_is_refused():
    step = AMPTrainer(*_parts(), precision=torch.float16)
    check_step_arithmetic(_cfg(precision="float16"), step)
    with pytest.raises(UsageError, match="SOLVER.AMP.PRECISION='bfloat16'"):
        check_step_arithmetic(_cfg(precision="bfloat16"), step)
    with pytest.raises(UsageError, match="SOLVER.AMP.PRECISION=''"):
        check_step_arithmetic(_cfg(precision=""), step)  # the CPU's usual type is bfloat16


def test_without_amp_the_precision_is_not_used():
    step = build_step_trainer(_cfg(enabled=False, precision="float16"), *_parts())
    assert type(step) is SimpleTrainer
