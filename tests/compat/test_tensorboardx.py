"""detectron2's TensorboardXWriter makes its event file only when something is written.

Mirrors the behaviours of detectron2's tests/utils/test_tensorboardx.py through trainkit's
``TensorboardXWriter``.
"""

import os

from trainkit.utils.events import EventStorage, TensorboardXWriter


def test_a_writer_that_never_writes_leaves_no_file(tmp_path):
    writer = TensorboardXWriter(str(tmp_path))
    writer.close()
    assert os.listdir(tmp_path) == []


def test_a_write_with_nothing_new_leaves_no_file(tmp_path):
    writer = TensorboardXWriter(str(tmp_path))
    with EventStorage():
        writer.write()
    writer.close()
    writer.close()  # closing twice is harmless
    assert os.listdir(tmp_path) == []


def test_the_first_write_creates_the_event_file(tmp_path):
    writer = TensorboardXWriter(str(tmp_path / "tb"))
    assert not (tmp_path / "tb").exists()
    with EventStorage() as storage:
        storage.put_scalar("total_loss", 1.0)
        writer.write()
        assert any(n.startswith("events.out.tfevents") for n in os.listdir(tmp_path / "tb"))
    writer.close()


def test_the_summary_writer_attribute_of_detectron2_subclasses_still_writes(tmp_path):
    # detectron2 subclasses (and its own test) call self._writer.add_scalar(...).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorboardXWriter(str(tmp_path))
    writer._writer.add_scalar("testing", 1, 1)
    writer.close()
    assert os.listdir(tmp_path)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("testing")] == [(1, 1.0)]
