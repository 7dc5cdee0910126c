import collections
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointError,
    PeriodicCheckpointer,
    UntrustedCheckpointError,
    unwrap_model,
)


@pytest.fixture
def ckpt_log(caplog):
    # setup_logger() may stop "trainkit" from propagating to caplog's root handler.
    target = logging.getLogger("trainkit")
    attach = not target.propagate
    if attach:
        target.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="trainkit.checkpoint")
    yield caplog
    if attach:
        target.removeHandler(caplog.handler)


class _Net(nn.Module):
    def __init__(self, out_features=2):
        super().__init__()
        self.fc = nn.Linear(3, out_features)
        self.norm = nn.BatchNorm1d(out_features)

    def forward(self, x):
        return self.norm(self.fc(x))


class _Counter:
    """A non-module checkpointable, like a sampler or a hook."""

    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def _trained(seed=0):
    torch.manual_seed(seed)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_round_trip_with_optimizer_scheduler_and_extra(tmp_path):
    model, optimizer, scheduler = _trained(0)
    counter = _Counter()
    counter.count = 7
    Checkpointer(
        model,
        str(tmp_path),
        save_to_disk=True,
        optimizer=optimizer,
        scheduler=scheduler,
        counter=counter,
    ).save("model_0000009", iteration=9)
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000009.pth"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]

    model2, optimizer2, scheduler2 = _trained(1)
    counter2 = _Counter()
    checkpointer = Checkpointer(
        model2, str(tmp_path), optimizer=optimizer2, scheduler=scheduler2, counter=counter2
    )
    assert checkpointer.has_checkpoint()
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "model_0000009.pth")
    extra = checkpointer.resume_or_load("", resume=True)
    assert extra["iteration"] == 9
    assert _same_params(model, model2)
    assert counter2.count == 7
    assert scheduler2.state_dict() == scheduler.state_dict()
    state_a, state_b = optimizer.state_dict(), optimizer2.state_dict()
    assert state_a["param_groups"] == state_b["param_groups"]
    assert all(
        torch.equal(state_a["state"][k]["momentum_buffer"], state_b["state"][k]["momentum_buffer"])
        for k in state_a["state"]
    )


def test_shape_mismatch_can_be_refused_before_anything_loads(tmp_path):
    from trainkit.checkpoint import CheckpointError, find_shape_mismatches

    source = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 5))
    Checkpointer(source, str(tmp_path), save_to_disk=True).save("src")
    target = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    path = str(tmp_path / "src.pth")
    shapes = {k: tuple(v.shape) for k, v in target.state_dict().items()}
    assert find_shape_mismatches(path, shapes) == [
        ("1.weight", (5, 3), (2, 3)),
        ("1.bias", (5,), (2,)),
    ]
    with pytest.raises(
        CheckpointError, match=r"2 entries have other shapes.*1\.weight \(5, 3\) vs \(2, 3\)"
    ):
        Checkpointer(target, allow_shape_mismatch=False).load(path)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # untouched
    Checkpointer(target).load(path)  # the default skips them, as detectron2 does
    assert torch.equal(target[0].weight, source[0].weight)


def test_loaded_state_is_not_left_mapped_to_the_file(tmp_path):
    # Files are memory-mapped for speed; whatever outlives the load must be plain memory,
    # or rotating (deleting) the file would not free its disk space.
    model, optimizer, _ = _trained(0)
    Checkpointer(model, str(tmp_path), save_to_disk=True, optimizer=optimizer).save(
        "model_final", extra_tensor=torch.arange(3.0)
    )
    model2, optimizer2, _ = _trained(1)
    extra = Checkpointer(model2, str(tmp_path), optimizer=optimizer2).load(
        str(tmp_path / "model_final.pth")
    )
    assert _same_params(model, model2)
    assert torch.equal(extra["extra_tensor"], torch.arange(3.0))
    kept = [extra["extra_tensor"], *model2.state_dict().values()]
    kept += [
        t
        for state in optimizer2.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    ]
    assert len(kept) > 3
    path = str(tmp_path / "model_final.pth")
    # The check can fail: a tensor torch.load maps is found inside the file's mapping.
    mapped = torch.load(path, weights_only=True, mmap=True)["model"]
    assert any(_in_mapping_of(path, t) for t in mapped.values())
    del mapped
    assert not any(_in_mapping_of(path, t) for t in kept)


def _in_mapping_of(path: str, tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s data lies in a memory mapping of ``path`` (Linux /proc)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return True
    return False


def test_saves_bare_module_and_accepts_module_prefix(tmp_path):
    model, _, _ = _trained(0)
    wrapped = nn.DataParallel(model)  # same "module." prefix as DDP, without a process group
    assert unwrap_model(wrapped) is model
    Checkpointer(wrapped, str(tmp_path), save_to_disk=True).save("bare")
    saved = torch.load(tmp_path / "bare.pth", weights_only=True)["model"]
    assert "fc.weight" in saved
    assert not any(k.startswith("module.") for k in saved)

    # A checkpoint written from an unwrapped DataParallel state dict, with "module." keys.
    prefixed = collections.OrderedDict(("module." + k, v) for k, v in model.state_dict().items())
    torch.save({"model": prefixed}, tmp_path / "prefixed.pth")
    target = _Net()
    Checkpointer(target).load(str(tmp_path / "prefixed.pth"))
    assert _same_params(model, target)


def test_unwrap_compiled_like_wrapper():
    inner = _Net()
    holder = nn.Module()
    holder._orig_mod = inner  # what torch.compile's OptimizedModule looks like
    assert unwrap_model(nn.DataParallel(holder)) is inner


def test_bare_state_dict_file_loads(tmp_path):
    model, _, _ = _trained(0)
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    target = _Net()
    assert Checkpointer(target).load(str(tmp_path / "weights.pth")) == {}
    assert _same_params(model, target)


def test_shape_mismatch_is_reported_and_skipped(tmp_path, ckpt_log):
    Checkpointer(_Net(out_features=5), str(tmp_path), save_to_disk=True).save("wide")
    target = _Net(out_features=2)
    before = target.fc.weight.detach().clone()
    Checkpointer(target).load(str(tmp_path / "wide.pth"))
    assert torch.equal(target.fc.weight, before)
    report = "\n".join(r.getMessage() for r in ckpt_log.records if r.levelno == logging.WARNING)
    assert "fc.weight: (5, 3) vs (2, 3)" in report
    assert "norm.running_mean" in report

    with pytest.raises(CheckpointError, match=r"fc\.bias: \(5,\) vs \(2,\)"):
        Checkpointer(target, strict=True).load(str(tmp_path / "wide.pth"))


def test_missing_and_unexpected_keys_are_logged(tmp_path, ckpt_log):
    state = _Net().state_dict()
    del state["fc.bias"]
    state["extra.weight"] = torch.zeros(1)
    torch.save({"model": state}, tmp_path / "partial.pth")
    Checkpointer(_Net()).load(str(tmp_path / "partial.pth"))
    report = "\n".join(r.getMessage() for r in ckpt_log.records)
    assert "fc.bias" in report
    assert "extra.weight" in report


@pytest.mark.parametrize("content", [b"", b"garbage" * 50, "truncated"])
def test_corrupt_file_error_names_the_file(tmp_path, content):
    path = tmp_path / "broken.pth"
    if content == "truncated":
        torch.save({"model": _Net().state_dict()}, path)
        content = path.read_bytes()[:200]
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match=r"broken\.pth"):
        Checkpointer(_Net()).load(str(path))


def test_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.pth"):
        Checkpointer(_Net(), str(tmp_path)).resume_or_load(str(tmp_path / "nope.pth"), resume=True)


class Opaque:  # module-level so full pickle can find it again
    def __init__(self):
        self.value = 3


def test_full_pickle_file_refused_unless_trusted(tmp_path):
    model = _Net()
    torch.save({"model": model.state_dict(), "obj": Opaque()}, tmp_path / "pickled.pth")
    with pytest.raises(UntrustedCheckpointError, match=r"pickled\.pth.*trust_pickle=True"):
        Checkpointer(_Net()).load(str(tmp_path / "pickled.pth"))
    extra = Checkpointer(_Net(), trust_pickle=True).load(str(tmp_path / "pickled.pth"))
    assert extra["obj"].value == 3


def test_save_refuses_data_weights_only_cannot_load(tmp_path):
    import numpy as np

    checkpointer = Checkpointer(_Net(), str(tmp_path), save_to_disk=True)
    with pytest.raises(TypeError, match=r"\['rng'\]\[1\] is a numpy.ndarray"):
        checkpointer.save("bad", rng=("MT19937", np.zeros(3)))
    assert not os.listdir(tmp_path)


def _save_series(tmp_path, iterations):
    model = _Net()
    checkpointer = Checkpointer(model, str(tmp_path), save_to_disk=True)
    for i, it in enumerate(iterations):
        checkpointer.save(f"model_{it:07d}", iteration=it)
        path = tmp_path / f"model_{it:07d}.pth"
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # distinct, increasing mtimes
    return checkpointer


def test_resume_falls_back_to_older_checkpoint(tmp_path, ckpt_log):
    _save_series(tmp_path, [4, 9, 14])
    (tmp_path / "model_0000014.pth").write_bytes(b"\x00" * 100)  # e.g. a disk-full truncation
    extra = Checkpointer(_Net(), str(tmp_path)).resume_or_load("", resume=True)
    assert extra["iteration"] == 9
    warnings = [r.getMessage() for r in ckpt_log.records if r.levelno == logging.WARNING]
    assert any("model_0000014.pth" in w for w in warnings)


def test_resume_with_nothing_loadable_raises(tmp_path):
    _save_series(tmp_path, [4])
    (tmp_path / "model_0000004.pth").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"model_0000004\.pth"):
        Checkpointer(_Net(), str(tmp_path)).resume_or_load("", resume=True)


def test_without_resume_loads_only_model_weights(tmp_path):
    model, optimizer, _ = _trained(0)
    Checkpointer(model, str(tmp_path / "a"), save_to_disk=True, optimizer=optimizer).save("m")
    model2, optimizer2, _ = _trained(1)
    lr_before = optimizer2.param_groups[0]["lr"]
    extra = Checkpointer(model2, str(tmp_path / "b"), optimizer=optimizer2).resume_or_load(
        str(tmp_path / "a" / "m.pth"),
        resume=True,  # nothing to resume in b: load weights
    )
    assert _same_params(model, model2)
    assert "optimizer" in extra
    assert optimizer2.param_groups[0]["lr"] == lr_before


def test_failure_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    checkpointer = _save_series(tmp_path, [4])
    real_save = torch.save

    def save_half_then_fail(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(OSError, match="No space"):
        checkpointer.save("model_0000009", iteration=9)
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000004.pth"]
    assert Checkpointer(_Net(), str(tmp_path)).resume_or_load("")["iteration"] == 4


def test_process_killed_mid_save_keeps_previous_checkpoint(tmp_path):
    _save_series(tmp_path, [4])
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from torch import nn
        from trainkit.checkpoint import Checkpointer

        def save_then_die(obj, f, *args, **kwargs):
            f.write(b"PK\\x03\\x04" + b"x" * 4096)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = save_then_die
        Checkpointer(nn.Linear(3, 2), {str(tmp_path)!r}, save_to_disk=True).save("model_0000009")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "model_0000009.pth").exists()
    assert Checkpointer(_Net(), str(tmp_path)).resume_or_load("")["iteration"] == 4


def test_periodic_checkpointer_keeps_last_files(tmp_path):
    checkpointer = Checkpointer(_Net(), str(tmp_path), save_to_disk=True)
    periodic = PeriodicCheckpointer(checkpointer, period=2, max_iter=9, max_to_keep=2)
    for it in range(9):
        periodic.step(it, epoch=0)
    assert sorted(os.listdir(tmp_path)) == [
        "last_checkpoint",
        "model_0000005.pth",
        "model_0000007.pth",
        "model_final.pth",
    ]
    assert (tmp_path / "last_checkpoint").read_text() == "model_final.pth"
    extra = Checkpointer(_Net(), str(tmp_path)).resume_or_load("")
    assert extra == {"iteration": 8, "epoch": 0}


def test_periodic_checkpointer_validates_and_period_zero_saves_final_only(tmp_path):
    checkpointer = Checkpointer(_Net(), str(tmp_path), save_to_disk=True)
    with pytest.raises(ValueError, match="CHECKPOINT_PERIOD"):
        PeriodicCheckpointer(checkpointer, period=-1)
    periodic = PeriodicCheckpointer(checkpointer, period=0, max_iter=3, max_to_keep=0)
    for it in range(3):
        periodic.step(it)
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_final.pth"]


def test_save_is_noop_without_dir_or_off_rank(tmp_path):
    Checkpointer(_Net(), "").save("x")
    Checkpointer(_Net(), str(tmp_path), save_to_disk=False).save("x")
    assert not os.listdir(tmp_path)


def test_side_copy_does_not_move_the_resume_tag(tmp_path):
    from trainkit.checkpoint import Checkpointer

    model = torch.nn.Linear(2, 2)
    ckpt = Checkpointer(model, str(tmp_path))
    ckpt.save("model_0000009", iteration=9)
    ckpt.save("model_best", tag_last=False, iteration=4)
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_0000009.pth"
    assert (tmp_path / "model_best.pth").exists()


def test_load_goes_through_the_load_model_override_point(tmp_path, ckpt_log):
    # Projects subclass DetectionCheckpointer and override fvcore's _load_model (e.g.
    # unbiased-teacher's teacher/student checkpointer), calling super() and editing the
    # result: both must take effect through load() and resume_or_load().
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)
            self.register_buffer("pixel_mean", torch.zeros(2))

    source = Model()
    source.linear.weight.data.fill_(3.0)
    state = {k: v for k, v in source.state_dict().items() if k != "pixel_mean"}
    torch.save({"model": state}, tmp_path / "weights.pth")

    seen = []

    class ProjectCheckpointer(Checkpointer):
        def _load_model(self, checkpoint):
            incompatible = super()._load_model(checkpoint)
            seen.append(list(incompatible.missing_keys))
            incompatible.missing_keys.remove("pixel_mean")  # filled from the config anyway
            return incompatible

    target = Model()
    ProjectCheckpointer(target, str(tmp_path)).load(str(tmp_path / "weights.pth"))
    assert seen == [["pixel_mean"]]
    assert torch.equal(target.linear.weight, torch.full((2, 2), 3.0))
    assert "Loading checkpoint from" in ckpt_log.text  # the log is captured
    assert "does not fully match" not in ckpt_log.text
