"""SOLVER keys of the lr schedule: the cosine end lr (two spellings), fixed-gamma decays and
RESCALE_INTERVAL, with the errors for settings that cannot work."""

import pytest
import torch
from torch import nn

from trainkit.config import ConfigError, get_cfg
from trainkit.solver import build_lr_scheduler


def _cfg(**solver):
    cfg = get_cfg()
    defaults = {"BASE_LR": 2.0, "MAX_ITER": 20, "WARMUP_ITERS": 0}
    for key, value in {**defaults, **solver}.items():
        setattr(cfg.SOLVER, key, value)
    return cfg


def _lrs(cfg):
    """The lr of every iteration (MAX_ITER values) and after the final step."""
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=cfg.SOLVER.BASE_LR)
    scheduler = build_lr_scheduler(cfg, optimizer)
    lrs = []
    for _ in range(cfg.SOLVER.MAX_ITER + 1):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def _cosine(**solver):
    return _lrs(_cfg(LR_SCHEDULER_NAME="WarmupCosineLR", **solver))


def test_new_keys_have_detectron2_defaults():
    solver = get_cfg().SOLVER
    assert solver.BASE_LR_END == 0.0
    assert solver.BASE_LR_END_FACTOR == 0.0
    assert solver.NUM_DECAYS == 3
    assert solver.RESCALE_INTERVAL is False


def test_cosine_decays_to_zero_by_default():
    assert _cosine()[-1] == pytest.approx(0.0, abs=1e-12)


def test_absolute_end_lr_and_factor_give_the_same_schedule():
    absolute = _cosine(BASE_LR_END=0.5)
    relative = _cosine(BASE_LR_END_FACTOR=0.25)
    assert absolute == pytest.approx(relative)
    assert absolute[-1] == pytest.approx(0.5)
    assert absolute[0] == pytest.approx(2.0)


def test_end_lr_given_both_ways_is_refused():
    with pytest.raises(ConfigError, match=r"BASE_LR_END=0\.5 and SOLVER\.BASE_LR_END_FACTOR=0\.25"):
        _cosine(BASE_LR_END=0.5, BASE_LR_END_FACTOR=0.25)


@pytest.mark.parametrize(
    ("solver", "message"),
    [
        ({"BASE_LR_END": 3.0}, r"SOLVER\.BASE_LR_END=3\.0 \(BASE_LR=2\.0\).*between 0 and BASE_LR"),
        ({"BASE_LR_END": -0.1}, r"SOLVER\.BASE_LR_END=-0\.1"),
        ({"BASE_LR_END_FACTOR": 1.5}, r"SOLVER\.BASE_LR_END_FACTOR=1\.5"),
        ({"BASE_LR_END": 0.1, "BASE_LR": 0.0}, r"BASE_LR_END=0\.1 needs SOLVER\.BASE_LR > 0"),
    ],
)
def test_end_lr_outside_zero_to_base_lr_is_refused(solver, message):
    with pytest.raises(ConfigError, match=message):
        _cosine(**solver)


def test_end_lr_keys_are_ignored_by_other_schedules():
    lrs = _lrs(_cfg(STEPS=(10,), BASE_LR_END=5.0, BASE_LR_END_FACTOR=3.0))
    assert lrs[9] == pytest.approx(2.0) and lrs[10] == pytest.approx(0.2)


def test_fixed_gamma_schedule_from_config():
    lrs = _lrs(_cfg(LR_SCHEDULER_NAME="WarmupStepWithFixedGammaLR", NUM_DECAYS=3, GAMMA=0.5))
    # 20 iterations, 3 decays: 4 equal parts of 5 iterations
    assert lrs[:20] == pytest.approx([2.0] * 5 + [1.0] * 5 + [0.5] * 5 + [0.25] * 5)
    assert lrs[20] == pytest.approx(0.25)  # the step after the last iteration does not fail


@pytest.mark.parametrize(
    ("solver", "message"),
    [
        ({"NUM_DECAYS": 0}, r"SOLVER\.NUM_DECAYS must be a positive integer.*got 0"),
        ({"GAMMA": 0.0}, r"SOLVER\.GAMMA must be > 0"),
    ],
)
def test_fixed_gamma_schedule_checks_its_keys(solver, message):
    with pytest.raises(ConfigError, match=message):
        _lrs(_cfg(LR_SCHEDULER_NAME="WarmupStepWithFixedGammaLR", **solver))


def test_rescale_interval_fits_the_schedule_after_warmup():
    common = {"STEPS": (8,), "WARMUP_ITERS": 4, "WARMUP_FACTOR": 0.5, "MAX_ITER": 20}
    fixed = _lrs(_cfg(**common))
    rescaled = _lrs(_cfg(RESCALE_INTERVAL=True, **common))
    assert fixed[8] == pytest.approx(0.2)  # the step at 8 of 20 iterations
    # rescaled: 8/20 of the 16 iterations after warm-up -> 4 + 6.4, the drop lands at 11
    assert rescaled[10] == pytest.approx(2.0) and rescaled[11] == pytest.approx(0.2)
    # warm-up is the same linear ramp from BASE_LR * WARMUP_FACTOR to BASE_LR in both
    assert fixed[:4] == pytest.approx([1.0, 1.25, 1.5, 1.75])
    assert rescaled[:4] == pytest.approx([1.0, 1.25, 1.5, 1.75])


def test_unknown_schedule_lists_all_three():
    with pytest.raises(ValueError, match="WarmupStepWithFixedGammaLR"):
        _lrs(_cfg(LR_SCHEDULER_NAME="Poly"))


def test_rescaled_warmup_ends_where_the_schedule_starts():
    # detectron2 warms up towards the schedule's value at the end of warm-up and then jumps
    # to its start value; trainkit's ramp ends at the start value, so there is no jump.
    lrs = _cosine(WARMUP_ITERS=10, WARMUP_FACTOR=0.0, RESCALE_INTERVAL=True)
    assert lrs[5] == pytest.approx(1.0)  # half-way up a ramp from 0 to BASE_LR
    assert lrs[10] == pytest.approx(2.0)
