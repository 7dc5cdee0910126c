"""detectron2's scheduler behaviours (tests/test_scheduler.py) through trainkit names.

One deliberate difference (DIFFERENCES.md): stepping an ``LRMultiplier`` past ``max_iter``
keeps the schedule's end value instead of raising ``IndexError`` for step schedules.
"""

import math

import pytest
import torch
from fvcore.common.param_scheduler import (
    CosineParamScheduler,
    MultiStepParamScheduler,
    StepWithFixedGammaParamScheduler,
)
from torch import nn

from trainkit.config import CfgNode, get_cfg
from trainkit.solver import (
    LRMultiplier,
    LRScheduler,
    WarmupCosineLR,
    WarmupMultiStepLR,
    WarmupParamScheduler,
    build_lr_scheduler,
)


def _optimizer(lr):
    param = nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([param], lr=lr)


def _run(scheduler, optimizer, steps):
    """The lr before any step, then after each of ``steps`` scheduler steps."""
    lrs = [optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


# Linear warm-up over 5 of 30 iterations from 0.001 x 5, as in detectron2's test.
WARMUP = [0.005, 1.004, 2.003, 3.002, 4.001]


def test_warmup_then_multistep():
    optimizer = _optimizer(5.0)
    steps = MultiStepParamScheduler([1, 0.1, 0.01, 0.001], milestones=[10, 15, 20], num_updates=30)
    scheduler = LRMultiplier(optimizer, WarmupParamScheduler(steps, 0.001, 5 / 30), 30)
    assert isinstance(scheduler, LRScheduler)
    lrs = _run(scheduler, optimizer, 30)
    assert lrs[:5] == pytest.approx(WARMUP)
    assert lrs[5:10] == pytest.approx([5.0] * 5)
    assert lrs[10:15] == pytest.approx([0.5] * 5)
    assert lrs[15:20] == pytest.approx([0.05] * 5)
    assert lrs[20:] == pytest.approx([0.005] * 11)  # includes one step past the end


def test_warmup_then_cosine_joins_the_cosine():
    optimizer = _optimizer(5.0)
    scheduler = LRMultiplier(
        optimizer, WarmupParamScheduler(CosineParamScheduler(1, 0), 0.001, 5 / 30), 30
    )
    assert optimizer.param_groups[0]["lr"] == 0.005
    lrs = _run(scheduler, optimizer, 30)
    for iteration, lr in enumerate(lrs):
        cosine = 2.5 * (1.0 + math.cos(math.pi * iteration / 30))
        if iteration < 5:
            assert lr != pytest.approx(cosine, abs=1e-6)
        else:
            assert lr == pytest.approx(cosine, abs=1e-7)


@pytest.mark.parametrize("end_lr", [0.0, 0.5])
def test_cosine_from_config_ends_at_base_lr_end(end_lr):
    cfg = get_cfg()
    overrides = {
        "LR_SCHEDULER_NAME": "WarmupCosineLR",
        "MAX_ITER": 100,
        "WARMUP_ITERS": 10,
        "WARMUP_FACTOR": 0.1,
        "BASE_LR": 5.0,
        "BASE_LR_END": end_lr,
    }
    cfg.merge_from_other_cfg(CfgNode({"SOLVER": overrides}))
    optimizer = _optimizer(cfg.SOLVER.BASE_LR)
    scheduler = build_lr_scheduler(cfg, optimizer)
    assert optimizer.param_groups[0]["lr"] == cfg.SOLVER.BASE_LR * cfg.SOLVER.WARMUP_FACTOR
    lrs = _run(scheduler, optimizer, cfg.SOLVER.MAX_ITER)
    assert lrs[-1] == pytest.approx(end_lr, abs=1e-7)
    assert min(lrs[10:]) == pytest.approx(end_lr, abs=1e-7)


def _fixed_gamma_multiplier():
    decays = StepWithFixedGammaParamScheduler(
        base_value=1.0, gamma=0.1, num_decays=4, num_updates=30
    )
    return WarmupParamScheduler(decays, 0.001, 5 / 30, rescale_interval=True)


def test_warmup_then_fixed_gamma_on_the_rescaled_interval():
    optimizer = _optimizer(5.0)
    scheduler = LRMultiplier(optimizer, _fixed_gamma_multiplier(), 30)
    lrs = _run(scheduler, optimizer, 29)
    assert lrs[:5] == pytest.approx(WARMUP)
    # The 4 decays split the 25 iterations after warm-up into 5 equal parts.
    for part, value in enumerate([5.0, 0.5, 0.05, 0.005, 0.0005]):
        assert lrs[5 + 5 * part : 10 + 5 * part] == pytest.approx([value] * 5)


def test_stepping_past_the_end_keeps_the_last_lr():
    # detectron2 raises IndexError on this step; trainkit's LRScheduler hook takes it after
    # the final iteration, so the lr of the last iteration is kept instead.
    optimizer = _optimizer(5.0)
    scheduler = LRMultiplier(optimizer, _fixed_gamma_multiplier(), 30)
    lrs = _run(scheduler, optimizer, 32)
    assert lrs[29:] == pytest.approx([0.0005] * 4)


def test_lr_multiplier_starts_from_last_iter():
    schedule = MultiStepParamScheduler([1, 0.1], milestones=[10], num_updates=20)
    resumed_optimizer = _optimizer(1.0)
    resumed_optimizer.param_groups[0]["initial_lr"] = 1.0  # as torch leaves it after a run
    resumed = LRMultiplier(resumed_optimizer, schedule, 20, last_iter=11)
    assert resumed.last_epoch == 12
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_lr_multiplier_state_dict_has_detectron2_keys():
    optimizer = _optimizer(1.0)
    scheduler = LRMultiplier(optimizer, CosineParamScheduler(1, 0), 10)
    _run(scheduler, optimizer, 4)
    state = scheduler.state_dict()
    assert {"base_lrs", "last_epoch"} <= set(state)
    # a detectron2 checkpoint holds only those two keys; it loads
    other = LRMultiplier(_optimizer(1.0), CosineParamScheduler(1, 0), 10)
    other.load_state_dict({"base_lrs": state["base_lrs"], "last_epoch": state["last_epoch"]})
    assert other.last_epoch == 4


def test_lr_multiplier_needs_a_param_scheduler():
    with pytest.raises(TypeError, match="ParamScheduler"):
        LRMultiplier(_optimizer(1.0), lambda where: 1.0, 10)


def test_constant_warmup_method():
    multiplier = WarmupParamScheduler(CosineParamScheduler(1, 0), 0.01, 0.1, "constant")
    assert multiplier(0.0) == multiplier(0.05) == 0.01
    assert multiplier(0.1) == pytest.approx(CosineParamScheduler(1, 0)(0.1))


# ---- detectron2's older scheduler classes -------------------------------------------------
def test_old_warmup_multistep_lr_matches_the_new_schedule():
    optimizer = _optimizer(5.0)
    old = WarmupMultiStepLR(
        optimizer, milestones=[10, 15, 20], gamma=0.1, warmup_factor=0.001, warmup_iters=5
    )
    lrs = _run(old, optimizer, 29)
    assert lrs[:5] == pytest.approx(WARMUP)
    assert lrs[5:10] == pytest.approx([5.0] * 5)
    assert lrs[10:15] == pytest.approx([0.5] * 5)
    assert lrs[20:] == pytest.approx([0.005] * 10)


def test_old_warmup_multistep_lr_checks_arguments():
    with pytest.raises(ValueError, match="increasing"):
        WarmupMultiStepLR(_optimizer(1.0), milestones=[20, 10])
    with pytest.raises(ValueError, match="linear, constant"):
        WarmupMultiStepLR(_optimizer(1.0), milestones=[10], warmup_method="exp")


def test_old_warmup_cosine_lr_multiplies_warmup_and_cosine():
    optimizer = _optimizer(2.0)
    old = WarmupCosineLR(optimizer, max_iters=20, warmup_factor=0.1, warmup_iters=4)
    lrs = _run(old, optimizer, 20)
    for iteration, lr in enumerate(lrs):
        warmup = 0.1 * (1 - iteration / 4) + iteration / 4 if iteration < 4 else 1.0
        cosine = 0.5 * (1 + math.cos(math.pi * iteration / 20))
        assert lr == pytest.approx(2.0 * warmup * cosine)
    constant = WarmupCosineLR(_optimizer(1.0), 10, warmup_factor=0.5, warmup_method="constant")
    assert constant.get_last_lr() == [0.5]
