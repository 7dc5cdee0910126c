"""A detectron2 user's metric code (``detectron2.utils.events``) behaves the same on trainkit.

Mirrors the behaviours exercised by detectron2's tests/test_events.py, plus the parts of
detectron2/utils/events.py those tests lean on, through trainkit's public names.
"""

import json
import logging
import unittest

import pytest
import torch

from trainkit.utils.events import (
    CommonMetricPrinter,
    EventStorage,
    EventWriter,
    JSONWriter,
    TensorboardXWriter,
    get_event_storage,
    has_event_storage,
)


def _read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def printer_logs():
    """Capture what CommonMetricPrinter logs, whatever setup_logger did to propagation."""
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    target = logging.getLogger("trainkit.utils.events")
    old_level = target.level
    target.addHandler(handler)
    target.setLevel(logging.INFO)
    yield records
    target.removeHandler(handler)
    target.setLevel(old_level)


def test_has_event_storage_follows_the_context_stack():
    assert not has_event_storage()
    with EventStorage() as outer:
        assert has_event_storage()
        with EventStorage():
            assert has_event_storage()
        assert get_event_storage() is outer
    assert not has_event_storage()


def test_json_lines_every_period_hold_the_latest_unsmoothed_value(tmp_path):
    path = tmp_path / "metrics.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(path))
        for step in range(60):
            storage.put_scalar("counter", step, smoothing_hint=False)
            if step % 20 == 19:
                writer.write()
            storage.step()
        writer.close()
    assert [line["counter"] for line in _read_lines(path)] == [19, 39, 59]
    assert [line["iteration"] for line in _read_lines(path)] == [19, 39, 59]


def test_json_lines_split_metrics_put_at_other_iterations(tmp_path):
    # "rare" is put every 17 iterations, written every 20: each write emits one line per
    # iteration that holds a new latest value, oldest first.
    path = tmp_path / "metrics.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(path))
        for step in range(60):
            if step % 17 == 0:
                storage.put_scalar("rare", step, smoothing_hint=False)
            storage.put_scalar("every", step, smoothing_hint=False)
            if step % 20 == 19:
                writer.write()
            storage.step()
        writer.close()
    lines = _read_lines(path)
    assert [line["iteration"] for line in lines] == [17, 19, 34, 39, 51, 59]
    assert [line.get("rare") for line in lines] == [17, None, 34, None, 51, None]
    assert [line.get("every") for line in lines] == [None, 19, None, 39, None, 59]


def test_smoothing_window_is_counted_in_iterations(tmp_path):
    path = tmp_path / "metrics.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(path), window_size=10)
        for step in range(20):
            storage.put_scalar("each", step)
            if step % 2 == 1:
                storage.put_scalar("every_2nd", step)
            if step % 5 == 4:
                storage.put_scalar("every_5th", step)
            if step % 10 == 9:
                writer.write()
            storage.step()
        names = ("each", "every_2nd", "every_5th")
        counts = {name: storage.count_samples(name, 10) for name in names}
        writer.close()
    assert counts == {"each": 10, "every_2nd": 5, "every_5th": 2}
    lines = _read_lines(path)
    # Medians over the values of iterations 0-9, then 10-19, however many each metric has.
    assert [line["each"] for line in lines] == [4.5, 14.5]
    assert [line["every_2nd"] for line in lines] == [5, 15]
    assert [line["every_5th"] for line in lines] == [6.5, 16.5]


def test_count_samples_of_an_unknown_name_is_zero_and_records_nothing():
    with EventStorage() as storage:
        assert storage.count_samples("never_put") == 0
        assert "never_put" not in storage.histories()


def test_tensorboard_smooths_over_the_same_iterations(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorboardXWriter(str(tmp_path), window_size=10)
    with EventStorage() as storage:
        for step in range(20):
            if step % 2 == 1:
                storage.put_scalar("every_2nd", step)
            if step % 10 == 9:
                writer.write()
            storage.step()
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("every_2nd")] == [(9, 5.0), (19, 15.0)]


def test_printer_shows_eta_only_when_it_knows_max_iter(printer_logs):
    with EventStorage() as storage:
        with_max, without_max = CommonMetricPrinter(10), CommonMetricPrinter()
        for _ in range(2):
            storage.put_scalar("time", 1.0)
            storage.step()
        with_max.write()
        without_max.write()
    assert len(printer_logs) == 2
    assert "eta" in printer_logs[0]
    assert "eta" not in printer_logs[1]


def test_printer_logger_attribute_works_with_assert_logs():
    printer = CommonMetricPrinter(5)
    assert printer.logger.name == "trainkit.utils.events"
    case = unittest.TestCase()
    with EventStorage(start_iter=3) as storage, case.assertLogs(printer.logger) as logs:
        storage.put_scalar("time", 2.0)
        storage.put_scalar("total_loss", 0.25)
        printer.write()
    assert len(logs.output) == 1
    assert "iter: 3" in logs.output[0]
    assert "eta: 0:00:02" in logs.output[0]  # one iteration (4) left after this one


def test_printer_eta_is_zero_on_the_last_iteration(printer_logs):
    with EventStorage(start_iter=49) as storage:
        storage.put_scalar("time", 3.0)
        CommonMetricPrinter(50).write()
    assert "eta: 0:00:00" in printer_logs[-1]


def test_printer_shows_losses_and_bracketed_metrics_smoothed(printer_logs):
    with EventStorage() as storage:
        for step in range(30):
            storage.put_scalar("loss_box", float(step))
            storage.put_scalar("[metric]grad_norm", 10.0 * step)
            storage.put_scalar("accuracy", 0.5)  # neither a loss nor a [metric]: not shown
            storage.put_scalar("data_time", 0.25)
            storage.put_scalar("time", 0.5)
            storage.put_scalar("lr", 0.01, smoothing_hint=False)
            storage.step()
        storage.iter = 29
        CommonMetricPrinter(100, window_size=4).write()
    line = printer_logs[-1]
    # Medians over iterations 26-29.
    assert "loss_box: 27.5" in line
    assert "[metric]grad_norm: 275" in line
    assert "accuracy" not in line
    for part in (
        "iter: 29",
        "time: 0.5000",
        "last_time: 0.5000",
        "data_time: 0.2500",
        "last_data_time: 0.2500",
        "lr: 0.01",
    ):
        assert part in line


def test_printer_is_silent_after_the_last_iteration(printer_logs):
    with EventStorage(start_iter=10) as storage:
        storage.put_scalar("total_loss", 1.0)
        CommonMetricPrinter(10).write()
    assert printer_logs == []


def test_storage_scalar_api():
    with EventStorage(start_iter=5) as storage:
        assert storage.iter == storage.iteration == 5
        storage.put_scalars(a=1, b=torch.tensor(2.0), smoothing_hint=False)
        storage.put_scalars(c=3.0, cur_iter=2)
        with storage.name_scope("val"):
            storage.put_scalar("top1", 0.75)
        assert storage.latest() == {
            "a": (1.0, 5),
            "b": (2.0, 5),
            "c": (3.0, 2),
            "val/top1": (0.75, 5),
        }
        assert storage.smoothing_hints() == {"a": False, "b": False, "c": True, "val/top1": True}
        assert set(storage.histories()) == {"a", "b", "c", "val/top1"}
        assert storage.history("c").values() == [(3.0, 2)]
        storage.step()
        storage.put_scalar("a", 5.0, smoothing_hint=False)
        assert storage.history("a").values() == [(1.0, 5), (5.0, 6)]
        assert storage.history("a").avg(2) == 3.0
        assert storage.history("a").global_avg() == 3.0
        assert storage.history("a").latest() == 5.0
        storage.iter = 9
        assert storage.iter == 9
        with pytest.raises(KeyError):
            storage.history("missing")


def test_latest_with_smoothing_hint_takes_the_median_of_the_window():
    with EventStorage() as storage:
        for step, value in enumerate([9.0, 1.0, 2.0, 3.0]):
            storage.put_scalar("noisy", value, cur_iter=step)
            storage.put_scalar("exact", value, smoothing_hint=False, cur_iter=step)
        smoothed = storage.latest_with_smoothing_hint(window_size=3)
        assert smoothed["noisy"] == (2.0, 3)  # iterations 1-3
        assert smoothed["exact"] == (3.0, 3)
        assert storage.latest_with_smoothing_hint()["noisy"] == (2.5, 3)  # window 20: all


def test_put_histogram_and_put_image_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorboardXWriter(str(tmp_path))
    with EventStorage(start_iter=4) as storage:
        storage.put_histogram("weights", torch.tensor([0.0, 1.0, 1.0, 3.0]), bins=3)
        storage.put_image("sample", torch.rand(3, 8, 8))
        writer.write()
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    (hist,) = acc.Histograms("weights")
    assert hist.step == 4
    assert (hist.histogram_value.min, hist.histogram_value.max) == (0.0, 3.0)
    assert hist.histogram_value.num == 4
    assert hist.histogram_value.sum == 5.0 and hist.histogram_value.sum_squares == 11.0
    assert list(hist.histogram_value.bucket) == [1.0, 2.0, 1.0]
    (img,) = acc.Images("sample")
    assert (img.step, img.width, img.height) == (4, 8, 8)


def test_event_writer_base_class():
    writer = EventWriter()
    with pytest.raises(NotImplementedError):
        writer.write()
    writer.close()  # a no-op
