"""auto_scale_workers: detectron2's documented example and refused configurations."""

import pytest

from trainkit.config import ConfigError, get_cfg
from trainkit.config.scaling import ScalingError, auto_scale_config
from trainkit.utils import UsageError


def _cfg(batch=16, lr=0.1, ref=8, max_iter=5000, steps=(4000,), eval_period=1000, ckpt=1000):
    cfg = get_cfg()
    cfg.SOLVER.IMS_PER_BATCH = batch
    cfg.SOLVER.BASE_LR = lr
    cfg.SOLVER.REFERENCE_WORLD_SIZE = ref
    cfg.SOLVER.MAX_ITER = max_iter
    cfg.SOLVER.STEPS = steps
    cfg.SOLVER.WARMUP_ITERS = 1000
    cfg.TEST.EVAL_PERIOD = eval_period
    cfg.SOLVER.CHECKPOINT_PERIOD = ckpt
    return cfg


def test_documented_example():
    cfg = _cfg()
    out = auto_scale_config(cfg, 16)
    assert out.SOLVER.IMS_PER_BATCH == 32
    assert out.SOLVER.BASE_LR == pytest.approx(0.2)
    assert out.SOLVER.REFERENCE_WORLD_SIZE == 16
    assert out.SOLVER.MAX_ITER == 2500
    assert out.SOLVER.STEPS == (2000,)
    assert out.TEST.EVAL_PERIOD == 500
    assert out.SOLVER.WARMUP_ITERS == 500 and out.SOLVER.CHECKPOINT_PERIOD == 500
    assert out.is_frozen()
    assert cfg.SOLVER.IMS_PER_BATCH == 16  # the input is not modified


@pytest.mark.parametrize("ref", [0, 16])
def test_disabled_or_same_world_size_is_unchanged(ref):
    cfg = _cfg(ref=ref)
    out = auto_scale_config(cfg, 16)
    assert out.SOLVER.IMS_PER_BATCH == 16 and out.SOLVER.MAX_ITER == 5000


def test_scaling_down():
    out = auto_scale_config(_cfg(ref=8), 2)
    assert out.SOLVER.IMS_PER_BATCH == 4 and out.SOLVER.MAX_ITER == 20000


def test_refuses_period_rounding_to_zero():
    with pytest.raises(
        ScalingError, match=r"TEST.EVAL_PERIOD=1, .* would round to 0 on 4 processes"
    ):
        auto_scale_config(_cfg(ref=1, eval_period=1, batch=4), 4)


def test_refuses_batch_not_divisible_by_reference():
    with pytest.raises(
        ScalingError, match=r"IMS_PER_BATCH=10 is not divisible by SOLVER.REFERENCE_WORLD_SIZE=8"
    ):
        auto_scale_config(_cfg(batch=10), 16)


def test_refusals_are_config_errors_that_users_see_as_one_line():
    with pytest.raises(ConfigError) as info:
        auto_scale_config(_cfg(batch=10), 16)
    assert isinstance(info.value, UsageError) and isinstance(info.value, ScalingError)
    with pytest.raises(ScalingError, match=r"SOLVER.REFERENCE_WORLD_SIZE=-2 .* or 0 to turn off"):
        auto_scale_config(_cfg(ref=-2), 4)


def test_a_world_size_below_one_is_a_callers_bug_not_a_usage_error():
    with pytest.raises(ValueError, match="world_size") as info:
        auto_scale_config(_cfg(ref=8), 0)
    assert not isinstance(info.value, UsageError)


def _accumulate_cfg(ref, accumulate=1, batch=16):
    cfg = _cfg(batch=batch, ref=ref)
    cfg.SOLVER.SCALE_MODE = "accumulate"
    cfg.SOLVER.ACCUMULATE_STEPS = accumulate
    return cfg


def test_accumulate_mode_runs_an_8_process_config_on_2_by_accumulating_4():
    out = auto_scale_config(_accumulate_cfg(ref=8), 2)
    assert out.SOLVER.ACCUMULATE_STEPS == 4
    # the recipe is kept: global batch, learning rate, schedule
    assert out.SOLVER.IMS_PER_BATCH == 16 and out.SOLVER.BASE_LR == pytest.approx(0.1)
    assert out.SOLVER.MAX_ITER == 5000 and out.SOLVER.STEPS == (4000,)
    assert out.TEST.EVAL_PERIOD == 1000 and out.SOLVER.WARMUP_ITERS == 1000
    assert out.SOLVER.REFERENCE_WORLD_SIZE == 2  # reloading the dump on 2 does not rescale
    assert auto_scale_config(out, 2).SOLVER.ACCUMULATE_STEPS == 4


@pytest.mark.parametrize(
    ("ref", "accumulate", "world", "expected"),
    [
        (2, 1, 1, 2),  # one process accumulates what two did
        (2, 1, 4, 1),  # more processes than micro-batches: smaller micro-batches
        (1, 4, 2, 2),
        (1, 4, 4, 1),
        (4, 2, 8, 1),
        (4, 2, 2, 4),
    ],
)
def test_accumulate_rule(ref, accumulate, world, expected):
    out = auto_scale_config(_accumulate_cfg(ref, accumulate), world)
    assert out.SOLVER.ACCUMULATE_STEPS == expected
    assert out.SOLVER.IMS_PER_BATCH == 16
    if expected != accumulate:
        assert out.get_origin("SOLVER.ACCUMULATE_STEPS").startswith("auto-scaling")


@pytest.mark.parametrize(("ref", "world", "batch"), [(2, 3, 16), (4, 3, 12), (2, 32, 16)])
def test_accumulate_mode_refuses_a_growing_micro_batch(ref, world, batch):
    with pytest.raises(ScalingError, match="micro-batch would have to grow") as info:
        auto_scale_config(_accumulate_cfg(ref, batch=batch), world)
    # The message names the keys it is about, in the glossary's words.
    message = str(info.value)
    assert f"SOLVER.REFERENCE_WORLD_SIZE={ref} processes" in message
    assert f"on {world} processes" in message and "worker" not in message


def test_unknown_scale_mode_is_a_config_error():
    cfg = _cfg()
    cfg.SOLVER.SCALE_MODE = "quadratic"
    with pytest.raises(ConfigError, match="unknown SOLVER.SCALE_MODE 'quadratic'"):
        auto_scale_config(cfg, 2)
