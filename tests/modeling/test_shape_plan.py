"""The padding rule of compiled models: planned canvases, batch shapes, graph budget."""

from __future__ import annotations

import logging

import pytest

from trainkit.config import get_cfg
from trainkit.modeling.shape_plan import ShapePlan, plan_canvases, shape_plans_from_config


def test_main_job_plan_has_seven_training_and_five_eval_shapes():
    cfg = get_cfg()
    cfg.merge_from_file("configs/shapes/cnn_small.yaml")
    train, test = shape_plans_from_config(cfg)
    # MAX_SIZE_TRAIN 64 x RANDOM_SCALE [0.8, 1.2]: levels 64 and 80; six buckets give 8
    # canvases; the budget (recompile limit 8, minus one spare) drops the smallest that fits.
    assert train.canvases == [
        (64, 48), (48, 80), (80, 48), (64, 64), (64, 80), (80, 64), (80, 80)
    ]  # fmt: skip
    assert train.batch_size == 32 and train.num_shapes == 7
    assert test.canvases == [(32, 64), (64, 32), (48, 64), (64, 48), (64, 64)]
    assert test.batch_size == 32


def test_budget_drops_smallest_canvases_that_fit_in_another():
    full = plan_canvases(51.2, 76.8, [0.5, 0.75, 1.0, 1.333, 2.0], 16, budget=100)
    assert len(full) == 10
    assert plan_canvases(51.2, 76.8, [0.5, 0.75, 1.0, 1.333, 2.0], 16, budget=8) == full[2:]
    # The largest canvas always stays: it holds every batch the config allows.
    assert plan_canvases(51.2, 76.8, [0.5, 2.0], 16, budget=1) == [(80, 80)]


def test_no_grouping_gives_square_canvases_only():
    assert plan_canvases(30, 64, [], 16, budget=8) == [(32, 32), (48, 48), (64, 64)]


def test_batch_shape_picks_the_smallest_canvas_holding_the_images():
    plan = ShapePlan([(64, 64), (48, 80), (80, 80)], batch_size=8, divisibility=16)
    assert plan.batch_shape(40, 70, 8) == (8, 48, 80)
    assert plan.batch_shape(50, 60, 3) == (8, 64, 64)  # short last batch: padded to 8
    assert plan.batch_shape(70, 70, 9) == (9, 80, 80)  # a larger batch keeps its size


def test_batch_beyond_the_plan_is_rounded_and_warned_once(caplog):
    plan = ShapePlan([(64, 64)], batch_size=2, divisibility=16)
    with caplog.at_level(logging.WARNING, logger="trainkit.modeling.shape_plan"):
        assert plan.batch_shape(70, 20, 2) == (2, 80, 32)
        assert plan.batch_shape(70, 20, 2) == (2, 80, 32)
    assert len([r for r in caplog.records if "fits none" in r.message]) == 1


@pytest.mark.parametrize("world_size, accumulate, expected", [(1, 1, 32), (1, 2, 16)])
def test_training_batch_is_the_per_rank_micro_batch(world_size, accumulate, expected):
    cfg = get_cfg()
    cfg.SOLVER.IMS_PER_BATCH = 32
    cfg.SOLVER.ACCUMULATE_STEPS = accumulate
    cfg.INPUT.MAX_SIZE_TRAIN = cfg.INPUT.MAX_SIZE_TEST = 64
    assert shape_plans_from_config(cfg)[0].batch_size == expected


def test_uncapped_sizes_give_no_plan(caplog):
    cfg = get_cfg()
    cfg.INPUT.MAX_SIZE_TRAIN = 0
    with caplog.at_level(logging.WARNING, logger="trainkit.modeling.shape_plan"):
        train, test = shape_plans_from_config(cfg)
    assert train is None and test is not None
    assert "cannot be planned" in caplog.text
