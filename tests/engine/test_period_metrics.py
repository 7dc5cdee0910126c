"""The step's loss listeners: what is kept, when a non-finite loss raises, what a period files."""

import math
import types

import pytest
import torch

from trainkit.engine.events import StepEvents, StepListener
from trainkit.engine.period_metrics import LossCheck, MetricsWriter
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.utils.events import EventStorage


def _channel(deferred, every_step=True):
    events = StepEvents(types.SimpleNamespace(iter=0))
    check = LossCheck(deferred)
    writer = MetricsWriter(check, every_step=every_step)
    events.subscribe(check, writer)
    return events, check


def _add(events, step, a, b, prefix=""):
    loss_dict = {"loss_a": torch.tensor(a), "loss_b": torch.tensor(b)}
    events.losses(step, loss_dict, loss_dict["loss_a"] + loss_dict["loss_b"], 0.01 * step, prefix)


def _history(storage, name):
    return [(i, v) for v, i in storage.history(name).values()]


@pytest.mark.parametrize("deferred", [False, True])
def test_every_step_is_filed_with_its_iteration_at_the_period_end(deferred):
    events, _ = _channel(deferred)
    with EventStorage(0) as storage:
        for step in range(3):
            _add(events, step, float(step), 1.0)
        assert not storage.histories()  # nothing filed before the period end
        events.period_end(2, storage)
        assert _history(storage, "total_loss") == [(0, 1.0), (1, 2.0), (2, 3.0)]
        assert _history(storage, "loss_a") == [(0, 0.0), (1, 1.0), (2, 2.0)]
        assert [i for _, i in storage.history("data_time").values()] == [0, 1, 2]
        events.period_end(3, storage)  # nothing kept since: nothing more filed
        assert len(storage.history("total_loss").values()) == 3


def test_without_every_step_only_the_step_that_ends_the_period_is_filed():
    events, _ = _channel(False, every_step=False)
    with EventStorage(0) as storage:
        for step in range(4):
            _add(events, step, float(step), 1.0)
        events.period_end(3, storage)
        assert _history(storage, "total_loss") == [(3, 4.0)]


def test_a_non_finite_loss_raises_at_once_when_read_every_step():
    events, _ = _channel(False)
    _add(events, 0, 1.0, 1.0)
    with pytest.raises(NonFiniteLossError) as raised:
        _add(events, 1, 1.0, math.nan)
    assert raised.value.iteration == 1
    assert "loss_b" in str(raised.value)


def test_a_deferred_non_finite_loss_files_the_steps_before_it_then_raises():
    events, _ = _channel(True)
    with EventStorage(0) as storage:
        for step in range(5):
            _add(events, step, 1.0, math.inf if step in (2, 3) else 1.0)  # noted, never read
        with pytest.raises(NonFiniteLossError) as raised:
            events.period_end(4, storage)
        assert raised.value.iteration == 2  # the first bad step, not where it was read
        assert [i for _, i in storage.history("total_loss").values()] == [0, 1]


def test_check_reads_the_deferred_steps_and_a_bad_one_is_not_forgotten():
    events, check = _channel(True, every_step=False)
    _add(events, 0, 1.0, 1.0)
    check.check(collective=False)  # all finite: passes
    _add(events, 1, math.nan, 1.0)
    _add(events, 2, 1.0, 1.0)
    for _ in range(2):  # a checkpoint path that checks again raises again
        with pytest.raises(NonFiniteLossError, match="loss_a") as raised:
            check.check(collective=False)
        assert raised.value.iteration == 1


def test_a_new_set_of_loss_names_is_filed_under_its_own_names():
    events, _ = _channel(False)
    with EventStorage(0) as storage:
        _add(events, 0, 1.0, 2.0)
        events.losses(1, {"other": torch.tensor(5.0)}, torch.tensor(5.0), 0.0, "val_")
        events.period_end(1, storage)
        assert _history(storage, "total_loss") == [(0, 3.0)]
        assert _history(storage, "val_total_loss") == [(1, 5.0)]
        assert _history(storage, "other") == [(1, 5.0)]


class _Rider(StepListener):
    def __init__(self):
        self.compared = None

    def period_figures(self, iteration):
        return {"at": iteration}

    def compare_figures(self, per_rank, storage):
        self.compared = per_rank


def test_a_listeners_figures_ride_along_with_the_period_and_only_overridden_events_are_heard():
    events, _ = _channel(False)
    rider = _Rider()
    events.subscribe(rider)
    assert events._on_phase == [] and events._riders == [rider]
    with EventStorage(0) as storage:
        _add(events, 0, 1.0, 1.0)
        events.period_end(0, storage)
    assert rider.compared == [{"at": 0}]  # one rank: its own figures
