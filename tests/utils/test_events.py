import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from trainkit.utils.events import (
    CommonMetricPrinter,
    EventStorage,
    HistoryBuffer,
    JSONWriter,
    TensorboardXWriter,
    get_event_storage,
)


@pytest.fixture
def events_log(caplog):
    # setup_logger() may have stopped "trainkit" from propagating to the root logger that
    # caplog listens on; attach caplog's handler to it directly.
    target = logging.getLogger("trainkit")
    attach = not target.propagate
    if attach:
        target.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="trainkit.utils.events")
    yield caplog
    if attach:
        target.removeHandler(caplog.handler)


def test_get_event_storage_outside_context_is_clear():
    with pytest.raises(RuntimeError, match="EventStorage"):
        get_event_storage()


def test_storage_stack_nests_and_pops():
    with EventStorage() as outer:
        assert get_event_storage() is outer
        with EventStorage() as inner:
            assert get_event_storage() is inner
        assert get_event_storage() is outer


def test_put_scalar_history_smoothing_and_scope():
    with EventStorage(start_iter=3) as storage:
        storage.put_scalar("loss", 4.0)
        storage.put_scalar("lr", 0.1, smoothing_hint=False)
        storage.step()
        storage.put_scalars(loss=2.0, acc=torch.tensor(0.5))
        storage.put_scalar("lr", 0.2, smoothing_hint=False)
        with storage.name_scope("val"):
            storage.put_scalar("top1", 0.9)
        storage.put_scalar("late", 1.0, cur_iter=10)

        assert storage.iter == 4
        assert storage.history("loss").values() == [(4.0, 3), (2.0, 4)]
        assert storage.latest()["lr"] == (0.2, 4)
        smoothed = storage.latest_with_smoothing_hint(window_size=2)
        assert smoothed["loss"] == (3.0, 4)  # median of the window
        assert smoothed["lr"] == (0.2, 4)  # unsmoothed: latest
        assert "val/top1" in storage.histories()
        assert storage.smoothing_hints()["lr"] is False
        assert storage.latest()["late"] == (1.0, 10)
        with pytest.raises(KeyError, match="nope"):
            storage.history("nope")
        with pytest.raises(ValueError, match="smoothing_hint"):
            storage.put_scalar("lr", 0.3, smoothing_hint=True)
        storage.iter = 7
        assert storage.iter == 7


def test_json_writer_appends_only_new_metrics(tmp_path):
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path), window_size=1)
    with EventStorage() as storage:
        for _ in range(3):
            storage.put_scalars(total_loss=1.5, lr=0.01)
            storage.step()
        writer.write()
        writer.write()  # nothing new: no new line
        storage.put_scalar("total_loss", 0.5)
        writer.write()
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # Only the latest value of each metric is kept between writes, so the first write
    # reports iteration 2 only.
    assert lines == [
        {"iteration": 2, "total_loss": 1.5, "lr": 0.01},
        {"iteration": 3, "total_loss": 0.5},
    ]
    JSONWriter(str(path)).close()  # reopening appends, never truncates
    assert len(path.read_text().splitlines()) == 2


def test_tensorboard_writer_writes_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorboardXWriter(str(tmp_path), window_size=1)
    with EventStorage() as storage:
        storage.put_scalar("total_loss", 2.0)
        storage.put_scalar("lr", 0.1, smoothing_hint=False)
        storage.put_image("img", torch.zeros(3, 4, 4))
        storage.put_histogram("weights", torch.arange(10.0), bins=5)
        writer.write()
        storage.step()
        storage.put_scalar("total_loss", 1.0)
        writer.write()
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()
    assert {"total_loss", "lr"} <= set(tags["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("total_loss")] == [(0, 2.0), (1, 1.0)]
    assert [e.step for e in acc.Scalars("lr")] == [0]
    # Images and histograms are written once: the writer takes them out of the storage.
    assert [e.step for e in acc.Images("img")] == [0]
    assert [e.step for e in acc.Histograms("weights")] == [0]


def test_common_metric_printer_logs_progress(events_log):
    printer = CommonMetricPrinter(max_iter=100, window_size=5)
    with EventStorage(start_iter=9) as storage:
        for time_s in (0.5, 0.5, 0.5):
            storage.put_scalars(total_loss=1.25, loss_cls=0.75, time=time_s, data_time=0.01)
        storage.put_scalar("lr", 0.02, smoothing_hint=False)
        printer.write()
        eta_s = storage.latest()["eta_seconds"][0]
    line = events_log.records[-1].getMessage()
    assert "eta: 0:00:45" in line  # 90 remaining iterations * 0.5 s
    assert eta_s == pytest.approx(45.0)
    for part in ("iter: 9", "total_loss: 1.25", "loss_cls: 0.75", "lr: 0.02", "time: 0.5"):
        assert part in line


def test_common_metric_printer_without_timer_and_after_training(events_log):
    printer = CommonMetricPrinter(max_iter=10)
    with EventStorage(start_iter=10) as storage:
        storage.put_scalar("total_loss", 1.0)
        printer.write()  # training is over: nothing
        assert not events_log.records
        storage.iter = 3
        printer.write()
    line = events_log.records[-1].getMessage()
    assert "iter: 3" in line
    assert "lr: N/A" in line
    assert "eta" not in line


def test_import_does_not_load_tensorboard():
    code = "import sys, trainkit.utils.events; print('torch.utils.tensorboard' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_put_scalar_series_equals_one_put_scalar_per_point():
    points = [(0.5 * i - 3.0, 10 + i) for i in range(25)]
    with EventStorage() as one_by_one:
        for value, cur_iter in points:
            one_by_one.put_scalar("loss", value, cur_iter=cur_iter)
    with EventStorage() as series:
        series.put_scalar_series("loss", points[:7])
        series.put_scalar_series("loss", points[7:])
        series.put_scalar_series("loss", [])
        series.put_scalar_series("empty", iter([]))
        assert "empty" not in series.histories()  # nothing filed, nothing shown
        with pytest.raises(ValueError, match="smoothing_hint"):
            series.put_scalar_series("loss", points[:1], smoothing_hint=False)
    a, b = one_by_one.history("loss"), series.history("loss")
    assert a.values() == b.values()
    assert a.global_avg() == pytest.approx(b.global_avg())
    assert one_by_one.latest() == series.latest()


def test_history_extend_keeps_max_length_and_the_mean_of_all_values():
    history = HistoryBuffer(max_length=4)
    history.extend([(float(v), v) for v in range(3)])
    history.extend([(float(v), v) for v in range(3, 7)])
    assert history.values() == [(3.0, 3), (4.0, 4), (5.0, 5), (6.0, 6)]
    assert len(history) == 4
    assert history.global_avg() == pytest.approx(3.0)  # mean of 0..6, not of what is kept
    assert history.median(100) == 4.5  # windows never reach past what is kept
    assert history.avg(2) == 5.5


def test_history_drops_old_values_in_chunks_but_never_shows_them():
    history = HistoryBuffer(max_length=3)
    for v in range(50):
        history.update(float(v), v)
        kept = history.values()
        assert kept == [(float(i), i) for i in range(max(0, v - 2), v + 1)]
        assert history.median(10) == statistics.median(value for value, _ in kept)
    assert history.count_recent(100) == 3


@pytest.mark.parametrize("window", [1, 2, 5, 20, 1000])
def test_history_median_and_avg_match_numpy_and_are_floats(window):
    values = np.random.default_rng(0).normal(size=37).tolist()
    history = HistoryBuffer()
    for i, v in enumerate(values):
        history.update(v, i)
    assert history.median(window) == float(np.median(values[-window:]))
    assert history.avg(window) == pytest.approx(float(np.mean(values[-window:])))
    assert type(history.median(window)) is float and type(history.avg(window)) is float


def test_history_windows_and_counts():
    history = HistoryBuffer()
    assert history.global_avg() == 0.0
    assert math.isnan(history.median(5)) and math.isnan(history.avg(5))
    with pytest.raises(IndexError):
        history.latest()
    history.update(1.0)  # no iteration: numbered in order, 0, 1, ...
    history.update(5.0)
    history.update(3.0, 7)
    assert history.values() == [(1.0, 0), (5.0, 1), (3.0, 7)]
    assert history.latest() == 3.0
    assert history.median(2) == 4.0 and history.median(3) == 3.0
    # An empty window is NaN (fvcore's list slice [-0:] would give every value).
    assert math.isnan(history.avg(0)) and math.isnan(history.median(0))
    # Iterations 1 and 7 are more than 5 apart: only the newest value is within 5 of 7.
    assert history.count_recent(5) == 1
    assert history.count_recent(7) == 2
    assert history.count_recent(0) == 0
    with pytest.raises(ValueError, match="max_length"):
        HistoryBuffer(max_length=0)


def test_tensorboard_scalars_are_batched_but_keep_the_time_of_their_write(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    handed_over = []

    class RecordingEventFileWriter(event_file_writer.EventFileWriter):
        def add_event(self, event):
            if event.summary.value:  # not the file_version event every file starts with
                handed_over.append((self.get_logdir(), event.step, event.summary.value[0].tag))
            super().add_event(event)

    monkeypatch.setattr(event_file_writer, "EventFileWriter", RecordingEventFileWriter)
    batched = TensorboardXWriter(str(tmp_path / "batched"), window_size=1)
    eager = TensorboardXWriter(str(tmp_path / "eager"), window_size=1, handoff_secs=0)
    with EventStorage() as storage:
        storage.put_scalars(total_loss=2.0, loss_cls=2.0)
        written_at = time.time()
        batched.write()
        eager.write()
        # One event holding both scalars of iteration 0, handed over by the eager writer only.
        assert handed_over == [(str(tmp_path / "eager"), 0, "total_loss")]
        time.sleep(0.5)
    batched.close()
    eager.close()
    assert handed_over[-1] == (str(tmp_path / "batched"), 0, "total_loss")
    acc = EventAccumulator(str(tmp_path / "batched"))
    acc.Reload()
    events = acc.Scalars("total_loss")
    assert [(e.step, e.value) for e in events] == [(0, 2.0)]
    assert [e.step for e in acc.Scalars("loss_cls")] == [0]
    assert abs(events[0].wall_time - written_at) < 0.25  # not the time of close()


def test_smoothing_windows_count_iterations_not_values(tmp_path):
    # A metric put twice per iteration is smoothed over the same iterations as the others.
    # (Before, the window was the last N values: 4 values, i.e. iterations 2-3 only.)
    writer = JSONWriter(str(tmp_path / "metrics.json"), window_size=4)
    with EventStorage() as storage:
        for it in range(4):
            storage.put_scalar("twice", float(it))
            storage.put_scalar("twice", float(it) + 0.5)
            storage.step()
        storage.iter = 3
        assert storage.count_samples("twice", 4) == 8
        assert storage.latest_with_smoothing_hint(4)["twice"] == (1.75, 3)
        writer.write()
    writer.close()
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"iteration": 3, "twice": 1.75}


def test_tensorboard_writer_rejects_arguments_summary_writer_does_not_take(tmp_path):
    with pytest.raises(TypeError, match="flush_sec"):
        TensorboardXWriter(str(tmp_path), flush_sec=5)


def test_tensorboard_writer_purge_step_and_kwargs_reach_the_event_file(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorboardXWriter(str(tmp_path), window_size=1, purge_step=5, filename_suffix=".x")
    with EventStorage(start_iter=5) as storage:
        storage.put_scalar("total_loss", 1.0)
        writer.write()
    writer.close()
    (name,) = os.listdir(tmp_path)
    assert name.endswith(".x")
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [e.step for e in acc.Scalars("total_loss")] == [5]


def test_count_recent_matches_a_walk_back_from_the_newest_value():
    # detectron2's definition: walk back from the newest value, stop at the first one at
    # or before (newest iteration - window). Checked on histories in and out of order.
    def walk(points, window):
        count = 0
        for _, cur_iter in reversed(points):
            if cur_iter <= points[-1][1] - window:
                break
            count += 1
        return count

    rng = random.Random(0)
    for _ in range(300):
        history = HistoryBuffer(max_length=rng.choice([3, 10, 1000]))
        points, cur_iter = [], 0
        for _ in range(rng.randrange(1, 8)):
            chunk = []
            for _ in range(rng.randrange(1, 6)):
                cur_iter += rng.choice([0, 1, 1, 2, 5]) if rng.random() > 0.05 else -3
                chunk.append((rng.random(), cur_iter))
            if len(chunk) == 1 and rng.random() < 0.5:
                history.update(*chunk[0])
            else:
                history.extend(chunk)
            points += chunk
        kept = points[-len(history) :]
        assert history.values() == kept
        for window in range(1, 12):
            assert history.count_recent(window) == walk(kept, window)
