"""PeriodMetrics: which steps are kept, when a non-finite loss raises, what a period files."""

import math

import pytest
import torch

from trainkit.engine.period_metrics import PeriodMetrics
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.utils.events import EventStorage


def _losses(a, b):
    loss_dict = {"loss_a": torch.tensor(a), "loss_b": torch.tensor(b)}
    return loss_dict, loss_dict["loss_a"] + loss_dict["loss_b"]


def _add(metrics, step, a, b, **kwargs):
    loss_dict, total = _losses(a, b)
    metrics.add(step, loss_dict, total, 0.01 * step, **kwargs)


def _history(storage, name):
    return [(i, v) for v, i in storage.history(name).values()]


@pytest.mark.parametrize("deferred", [False, True])
def test_only_kept_steps_are_filed_with_their_iteration(deferred):
    metrics = PeriodMetrics()
    with EventStorage(0) as storage:
        for step in range(6):
            _add(metrics, step, float(step), 1.0, keep=step % 2 == 1, deferred=deferred)
        metrics.file(storage, 5)
        assert _history(storage, "total_loss") == [(1, 2.0), (3, 4.0), (5, 6.0)]
        assert _history(storage, "loss_a") == [(1, 1.0), (3, 3.0), (5, 5.0)]
        assert [i for _, i in storage.history("data_time").values()] == [1, 3, 5]
        metrics.file(storage, 6)  # nothing kept since: nothing more filed
        assert len(storage.history("total_loss").values()) == 3


def test_a_non_finite_loss_raises_at_once_when_read_every_step():
    metrics = PeriodMetrics()
    _add(metrics, 0, 1.0, 1.0, keep=False, deferred=False)
    with pytest.raises(NonFiniteLossError) as raised:
        _add(metrics, 1, 1.0, math.nan, keep=False, deferred=False)
    assert raised.value.iteration == 1
    assert "loss_b" in str(raised.value)


def test_a_deferred_non_finite_loss_files_the_steps_before_it_then_raises():
    metrics = PeriodMetrics()
    with EventStorage(0) as storage:
        for step in range(5):
            b = math.inf if step in (2, 3) else 1.0
            _add(metrics, step, 1.0, b, keep=True, deferred=True)  # noted, never read here
        with pytest.raises(NonFiniteLossError) as raised:
            metrics.file(storage, 4)
        assert raised.value.iteration == 2  # the first bad step, not where it was read
        assert [i for _, i in storage.history("total_loss").values()] == [0, 1]


def test_check_reads_the_deferred_steps_and_a_bad_one_is_not_forgotten():
    metrics = PeriodMetrics()
    _add(metrics, 0, 1.0, 1.0, keep=False, deferred=True)
    metrics.check(collective=False)  # all finite: passes
    _add(metrics, 1, math.nan, 1.0, keep=False, deferred=True)
    _add(metrics, 2, 1.0, 1.0, keep=False, deferred=True)
    for _ in range(2):  # a checkpoint path that checks again raises again
        with pytest.raises(NonFiniteLossError, match="loss_a") as raised:
            metrics.check(collective=False)
        assert raised.value.iteration == 1


def test_a_new_set_of_loss_names_is_filed_under_its_own_names():
    metrics = PeriodMetrics()
    with EventStorage(0) as storage:
        _add(metrics, 0, 1.0, 2.0, keep=True, deferred=False)
        metrics.add(1, {"other": torch.tensor(5.0)}, torch.tensor(5.0), 0.0, "val_", keep=True,
                    deferred=False)  # fmt: skip
        metrics.file(storage, 1)
        assert _history(storage, "total_loss") == [(0, 3.0)]
        assert _history(storage, "val_total_loss") == [(1, 5.0)]
        assert _history(storage, "other") == [(1, 5.0)]
