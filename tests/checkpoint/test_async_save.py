"""Checkpointer(async_save=True): training blocks only for the host copy; the write is safe."""

import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch import nn

from trainkit.checkpoint import Checkpointer, CheckpointWriteError, PeriodicCheckpointer


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)


def _trained(seed=0):
    torch.manual_seed(seed)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, optimizer)
    return model, optimizer


def _step(model, optimizer):
    model.train()
    model.norm(model.fc(torch.randn(8, 3))).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _assert_equal(a, b, where="checkpoint"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


class _GatedWrites:
    """Stands in for torch.save: records each write's iteration, then waits for the gate.

    ``fail[iteration]`` makes that write put some bytes in the file and raise.
    """

    def __init__(self, real_save):
        self._real_save = real_save
        self.gate = threading.Event()
        self.gate.set()
        self.started = []
        self.fail = {}
        self._lock = threading.Lock()
        self._began = {}

    def began(self, iteration):
        with self._lock:
            return self._began.setdefault(iteration, threading.Event())

    def __call__(self, obj, f, *args, **kwargs):
        iteration = obj.get("iteration")
        self.started.append(iteration)
        self.began(iteration).set()
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        if iteration in self.fail:
            f.write(b"PK\x03\x04 half a checkpoint")
            raise self.fail[iteration]
        return self._real_save(obj, f, *args, **kwargs)


@pytest.fixture
def writes(monkeypatch):
    gated = _GatedWrites(torch.save)
    monkeypatch.setattr(torch, "save", gated)
    yield gated
    gated.gate.set()  # never leave a writer thread blocked behind a failed assertion


def _listing(path):
    return sorted(name for name in os.listdir(path) if not name.endswith(".tmp"))


def test_async_save_writes_the_same_checkpoint_as_a_sync_save(tmp_path):
    model, optimizer = _trained()
    extra = {"iteration": 7, "note": "x", "nested": {"a": [1, (2, 3)], "t": torch.arange(3)}}
    Checkpointer(model, str(tmp_path / "sync"), optimizer=optimizer).save("m", **extra)
    checkpointer = Checkpointer(
        model, str(tmp_path / "async"), async_save=True, optimizer=optimizer
    )
    checkpointer.save("m", **extra)
    checkpointer.wait()
    sync, background = _load(tmp_path / "sync" / "m.pth"), _load(tmp_path / "async" / "m.pth")
    _assert_equal(sync, background)
    assert sync["model"]._metadata == background["model"]._metadata  # module versions kept
    assert (tmp_path / "async" / "last_checkpoint").read_text() == "m.pth"
    # ... and it restores like any checkpoint
    model2, optimizer2 = _trained(seed=1)
    Checkpointer(model2, str(tmp_path / "async"), optimizer=optimizer2).resume_or_load("")
    _assert_equal(model.state_dict(), model2.state_dict())


def test_save_returns_during_the_write_and_the_file_holds_the_state_at_save_time(tmp_path, writes):
    model, optimizer = _trained()
    checkpointer = Checkpointer(model, str(tmp_path), async_save=True, optimizer=optimizer)
    expected = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "momentum": [s["momentum_buffer"].clone() for s in optimizer.state.values()],
    }
    writes.gate.clear()
    checkpointer.save("model_0000001", iteration=1)  # returns although the write is blocked
    assert writes.began(1).wait(timeout=30)
    assert checkpointer.write_pending
    assert _listing(tmp_path) == []  # neither the file nor the tag exist yet
    _step(model, optimizer)  # the next step changes parameters and buffers in place
    writes.gate.set()
    checkpointer.wait()
    assert not checkpointer.write_pending
    saved = _load(tmp_path / "model_0000001.pth")
    _assert_equal(dict(saved["model"]), expected["model"])
    momentum = [s["momentum_buffer"] for s in saved["optimizer"]["state"].values()]
    _assert_equal(momentum, expected["momentum"])
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def test_successive_async_saves_each_hold_their_own_state(tmp_path):
    # The host copy's memory is reused by the next save; each file must still hold its own
    # state, also when the state gains entries (momentum buffers after the first step).
    torch.manual_seed(0)
    model = _Net()
    model.tied = model.fc  # the same parameters under two names
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    checkpointer = Checkpointer(model, str(tmp_path), async_save=True, optimizer=optimizer)
    expected = {}
    for it in range(3):
        expected[it] = {k: v.clone() for k, v in model.state_dict().items()}
        checkpointer.save(f"model_{it:07d}", iteration=it)
        _step(model, optimizer)
    checkpointer.wait()
    for it in range(3):
        saved = _load(tmp_path / f"model_{it:07d}.pth")
        _assert_equal(dict(saved["model"]), expected[it], f"model_{it:07d}")
        assert len(saved["optimizer"]["state"]) == (0 if it == 0 else 4)
        # tied weights are stored once and stay tied
        assert saved["model"]["tied.weight"].data_ptr() == saved["model"]["fc.weight"].data_ptr()


def test_a_save_waits_for_the_previous_write(tmp_path, writes):
    checkpointer = Checkpointer(_Net(), str(tmp_path), async_save=True)
    writes.gate.clear()
    checkpointer.save("model_0000001", iteration=1)
    assert writes.began(1).wait(timeout=30)
    second_returned = threading.Event()

    def second_save():
        checkpointer.save("model_0000002", iteration=2)
        second_returned.set()

    thread = threading.Thread(target=second_save)
    thread.start()
    # While the first write is blocked the second save cannot return (a wrong implementation
    # that does not wait would return at once; 0.3 s bounds only how long we look).
    assert not second_returned.wait(timeout=0.3)
    assert writes.started == [1]
    writes.gate.set()
    thread.join(timeout=30)
    assert second_returned.is_set()
    checkpointer.wait()
    assert writes.started == [1, 2]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000002.pth"


def test_blocking_context_covers_the_copy_not_the_write(tmp_path, writes):
    events = []

    class _Phase:
        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    checkpointer = Checkpointer(
        _Net(), str(tmp_path), async_save=True, blocking_context=lambda: _Phase()
    )
    writes.gate.clear()
    checkpointer.save("model_0000001", iteration=1)
    assert events == ["enter", "exit"]  # left before the write finished
    assert checkpointer.write_pending
    writes.gate.set()
    checkpointer.wait()
    sync = Checkpointer(_Net(), str(tmp_path / "sync"), blocking_context=lambda: _Phase())
    events.clear()
    sync.save("model_0000001", iteration=1)
    assert events == ["enter", "exit"]


def test_failed_background_write_is_raised_by_the_next_save_naming_the_file(tmp_path, writes):
    checkpointer = Checkpointer(_Net(), str(tmp_path), async_save=True)
    checkpointer.save("model_0000004", iteration=4)
    writes.fail[9] = OSError(errno.ENOSPC, "No space left on device")
    checkpointer.save("model_0000009", iteration=9)  # fails in the background
    with pytest.raises(CheckpointWriteError, match=r"model_0000009\.pth.*No space left") as info:
        checkpointer.save("model_0000014", iteration=14)
    assert isinstance(info.value.__cause__, OSError)
    assert writes.started == [4, 9]  # the save that reported the failure wrote nothing
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000004.pth"]  # no temp
    # Reported once: training can go on saving (e.g. after freeing space).
    checkpointer.save("model_0000019", iteration=19)
    checkpointer.wait()
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000019.pth"


def test_failed_background_write_is_raised_at_the_next_periodic_step(tmp_path, writes):
    checkpointer = Checkpointer(_Net(), str(tmp_path), async_save=True)
    periodic = PeriodicCheckpointer(checkpointer, period=5, max_iter=100)
    writes.fail[4] = OSError(errno.ENOSPC, "No space left on device")
    for it in range(5):
        periodic.step(it)
    while checkpointer.write_pending:  # let the failure happen before the next step
        time.sleep(0.01)
    with pytest.raises(CheckpointWriteError, match=r"model_0000004\.pth"):
        periodic.step(5)
    assert not (tmp_path / "last_checkpoint").exists()


def test_wait_raises_a_failed_write(tmp_path, writes):
    checkpointer = Checkpointer(_Net(), str(tmp_path), async_save=True)
    writes.fail[3] = OSError(errno.EIO, "Input/output error")
    checkpointer.save("model_0000003", iteration=3)
    with pytest.raises(CheckpointWriteError, match=r"model_0000003\.pth.*Input/output"):
        checkpointer.wait()
    checkpointer.wait()  # already reported


def test_rotation_never_deletes_the_file_being_written_nor_the_newest_complete_one(
    tmp_path, writes
):
    checkpointer = Checkpointer(_Net(), str(tmp_path), async_save=True)
    periodic = PeriodicCheckpointer(checkpointer, period=1, max_to_keep=1)
    periodic.step(0)
    checkpointer.wait()
    assert _listing(tmp_path) == ["last_checkpoint", "model_0000000.pth"]
    writes.gate.clear()
    periodic.step(1)
    assert writes.began(1).wait(timeout=30)
    # model_0000001 is being written: model_0000000, the newest complete one, stays.
    assert _listing(tmp_path) == ["last_checkpoint", "model_0000000.pth"]
    writes.gate.set()
    checkpointer.wait()
    assert _listing(tmp_path) == ["last_checkpoint", "model_0000001.pth"]
    # A write that fails deletes nothing: the newest complete checkpoint is kept.
    writes.fail[2] = OSError(errno.ENOSPC, "No space left on device")
    periodic.step(2)
    with pytest.raises(CheckpointWriteError):
        checkpointer.wait()
    assert _listing(tmp_path) == ["last_checkpoint", "model_0000001.pth"]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def test_resume_sees_a_checkpoint_still_being_written(tmp_path, writes):
    model, _ = _trained()
    checkpointer = Checkpointer(model, str(tmp_path), async_save=True)
    writes.gate.clear()
    checkpointer.save("model_0000003", iteration=3)
    threading.Timer(0.2, writes.gate.set).start()  # resume_or_load waits for it
    assert checkpointer.resume_or_load("")["iteration"] == 3


def test_other_ranks_and_sync_checkpointers_have_nothing_to_wait_for(tmp_path):
    off_rank = Checkpointer(_Net(), str(tmp_path), save_to_disk=False, async_save=True)
    off_rank.save("model_0000001")
    assert not off_rank.write_pending
    off_rank.wait()
    assert os.listdir(tmp_path) == []


def _run_script(body, tmp_path, **popen):
    script = textwrap.dedent(
        """
        import os, sys, threading, time, torch
        from torch import nn
        from trainkit.checkpoint import Checkpointer
        real_save = torch.save
        out = sys.argv[1]
        """
    ) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def test_process_exit_waits_for_a_pending_write(tmp_path):
    # The write starts only once the main thread has reached the end of the script, then
    # takes a while: a process that did not wait would exit without the file.
    body = """
        def slow_save(obj, f, *args, **kwargs):
            while not os.path.exists(os.path.join(out, "exiting")):
                time.sleep(0.01)
            time.sleep(0.3)
            real_save(obj, f, *args, **kwargs)

        torch.save = slow_save
        Checkpointer(nn.Linear(3, 2), out, async_save=True).save("model_0000001", iteration=1)
        open(os.path.join(out, "exiting"), "w").close()
        """
    proc = _run_script(body, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"
    assert Checkpointer(nn.Linear(3, 2), str(tmp_path)).resume_or_load("")["iteration"] == 1


def test_sigkill_during_the_background_write_keeps_the_previous_checkpoint(tmp_path):
    Checkpointer(nn.Linear(3, 2), str(tmp_path)).save("model_0000004", iteration=4)
    body = """
        def half_then_block(obj, f, *args, **kwargs):
            f.write(b"PK\\x03\\x04" + b"x" * 4096)
            f.flush()
            open(os.path.join(out, "writing"), "w").close()
            threading.Event().wait()  # blocked mid-write until killed

        torch.save = half_then_block
        ckpt = Checkpointer(nn.Linear(3, 2), out, async_save=True)
        ckpt.save("model_0000009", iteration=9)
        open(os.path.join(out, "save_returned"), "w").close()
        ckpt.wait()
        """
    proc = _run_script(body, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "writing").exists() and (tmp_path / "save_returned").exists()):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the write never started"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == -9
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "model_0000009.pth").exists()
    assert [p.name for p in tmp_path.glob(".model_0000009.pth.*.tmp")]  # only the temp file
    assert Checkpointer(nn.Linear(3, 2), str(tmp_path)).resume_or_load("")["iteration"] == 4
