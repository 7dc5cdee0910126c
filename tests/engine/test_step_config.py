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


class _GradsSeenInForward(nn.Module):
    """A linear model that notes whether its weight held a gradient when forward ran."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.grad_in_forward = []

    def forward(self, batch):
        self.grad_in_forward.append(self.linear.weight.grad is not None)
        return self.linear(batch).pow(2).mean()


@pytest.mark.parametrize("amp", [False, True])
def test_the_configured_step_clears_gradients_before_the_forward_pass(amp):
    # The previous step's gradients are freed before the activations are allocated.
    model = _GradsSeenInForward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = build_step_trainer(_cfg(enabled=amp), model, [torch.ones(2, 4)] * 3, optimizer)
    step.train(0, 3)
    assert model.grad_in_forward == [False, False, False]
    # SimpleTrainer's own default stays detectron2's: cleared after the forward pass.
    model.grad_in_forward.clear()
    SimpleTrainer(model, [torch.ones(2, 4)] * 2, optimizer).train(0, 2)
    assert model.grad_in_forward == [True, True]
