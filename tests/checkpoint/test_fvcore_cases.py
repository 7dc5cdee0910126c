"""The cases fvcore's own checkpoint tests check, through trainkit's Checkpointer (which wraps
fvcore's): loading across ``DataParallel`` prefixes from the same or another directory,
checkpointables, tied parameters (one tensor under two names), lazy modules, the override
points a detectron2-style subclass uses, and the periodic checkpointer with ``max_to_keep``.

Missing and unexpected keys and shape mismatches are in ``test_checkpointer.py``.
"""

import logging

import numpy as np
import pytest
import torch
from fvcore.common.checkpoint import Checkpointer as FvcoreCheckpointer
from torch import nn

from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointError,
    PeriodicCheckpointer,
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


class _Tied(nn.Module):
    """``encoder`` and, with ``alias``, ``decoder`` are the same Linear (tied weights)."""

    def __init__(self, alias: bool, head: bool = False):
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        if alias:
            self.decoder = self.encoder
        if head:
            self.head = nn.Linear(4, 2)


def _two_layers():
    return nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---- tied parameters --------------------------------------------------------------------
def test_weights_without_the_alias_load_into_a_tied_model(tmp_path, ckpt_log):
    saved = _Tied(alias=False)
    with torch.no_grad():
        saved.encoder.bias.fill_(5.0)
    torch.save({"model": saved.state_dict()}, tmp_path / "untied.pth")
    tied = _Tied(alias=True)
    Checkpointer(tied).load(str(tmp_path / "untied.pth"))
    assert torch.equal(tied.decoder.bias, torch.full((4,), 5.0))
    assert not _warnings(ckpt_log)  # decoder.* is not "left as initialised"
    strict = _Tied(alias=True)
    Checkpointer(strict, strict=True).load(str(tmp_path / "untied.pth"))
    assert torch.equal(strict.decoder.weight, saved.encoder.weight)


def test_weights_saved_under_the_alias_only_fill_the_tied_tensor(tmp_path, ckpt_log):
    source = _Tied(alias=False)
    state = {k.replace("encoder", "decoder"): v for k, v in source.state_dict().items()}
    torch.save({"model": state}, tmp_path / "alias_only.pth")
    tied = _Tied(alias=True)
    Checkpointer(tied, strict=True).load(str(tmp_path / "alias_only.pth"))
    assert torch.equal(tied.encoder.weight, source.encoder.weight)
    assert not _warnings(ckpt_log)


def test_a_key_really_missing_beside_a_tied_pair_is_still_reported(tmp_path, ckpt_log):
    torch.save({"model": _Tied(alias=False).state_dict()}, tmp_path / "no_head.pth")
    Checkpointer(_Tied(alias=True, head=True)).load(str(tmp_path / "no_head.pth"))
    report = "\n".join(_warnings(ckpt_log))
    assert "head.weight" in report and "head.bias" in report
    assert "decoder" not in report
    with pytest.raises(CheckpointError, match="strict=True") as info:
        Checkpointer(_Tied(alias=True, head=True), strict=True).load(str(tmp_path / "no_head.pth"))
    assert "head.bias" in str(info.value) and "decoder" not in str(info.value)


def test_a_tied_pair_both_absent_is_reported_under_both_names(tmp_path, ckpt_log):
    torch.save({"model": {}}, tmp_path / "empty.pth")
    Checkpointer(_Tied(alias=True)).load(str(tmp_path / "empty.pth"))
    report = "\n".join(_warnings(ckpt_log))
    assert "encoder.weight" in report and "decoder.weight" in report


# ---- fvcore's other cases ---------------------------------------------------------------
@pytest.mark.parametrize("same_dir", [True, False])
@pytest.mark.parametrize("wrap", [(False, False), (True, False), (False, True), (True, True)])
def test_load_across_wrappers_from_the_tag_or_by_path(tmp_path, wrap, same_dir):
    trained, fresh = _two_layers(), _two_layers()
    trained_w = nn.DataParallel(trained) if wrap[0] else trained
    fresh_w = nn.DataParallel(fresh) if wrap[1] else fresh
    Checkpointer(trained_w, str(tmp_path / "a"), save_to_disk=True).save("checkpoint_file")
    saved = str(tmp_path / "a" / "checkpoint_file.pth")
    other = Checkpointer(fresh_w, str(tmp_path / ("a" if same_dir else "b")))
    assert other.has_checkpoint() is same_dir
    assert other.get_checkpoint_file() == (saved if same_dir else "")
    other.load(saved)
    for a, b in zip(trained.parameters(), fresh.parameters()):
        assert a is not b and torch.equal(a, b)


def test_entries_without_a_registered_checkpointable_are_returned(tmp_path):
    class Notes:
        def __init__(self, text):
            self.text = text

        def state_dict(self):
            return {"text": self.text}

        def load_state_dict(self, state):
            self.text = state["text"]

    Checkpointer(_two_layers(), str(tmp_path), save_to_disk=True, notes=Notes("abc")).save("c")
    extra = Checkpointer(_two_layers(), str(tmp_path)).load(str(tmp_path / "c.pth"))
    assert extra["notes"] == {"text": "abc"}
    notes = Notes("")
    Checkpointer(_two_layers(), str(tmp_path), notes=notes).load(str(tmp_path / "c.pth"))
    assert notes.text == "abc"


def test_lazy_module_is_materialised_from_the_checkpoint(tmp_path):
    ready, lazy = nn.Sequential(nn.LazyLinear(5)), nn.Sequential(nn.LazyLinear(5))
    ready(torch.randn(2, 7))
    Checkpointer(ready, str(tmp_path), save_to_disk=True).save("lazy")
    Checkpointer(lazy).load(str(tmp_path / "lazy.pth"))
    assert lazy[0].weight.shape == (5, 7)
    assert torch.equal(lazy[0].weight, ready[0].weight)


# ---- the override points of a detectron2-style subclass ----------------------------------
class _NpzCheckpointer(Checkpointer):
    """Reads ``.npz`` weights (numpy arrays) and records each override point it passes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def _load_file(self, f):
        self.calls.append("_load_file")
        if not f.endswith(".npz"):
            return super()._load_file(f)
        with np.load(f) as arrays:
            return {"model": dict(arrays), "format": "npz"}

    def _convert_ndarray_to_tensor(self, state_dict):
        self.calls.append("_convert_ndarray_to_tensor")
        super()._convert_ndarray_to_tensor(state_dict)

    def _load_model(self, checkpoint):
        self.calls.append("_load_model")
        return super()._load_model(checkpoint)

    def _log_incompatible_keys(self, incompatible):
        self.calls.append(("_log_incompatible_keys", list(incompatible.missing_keys)))


def test_load_and_resume_go_through_every_override_point(tmp_path):
    source = _two_layers()
    arrays = {k: v.numpy() for k, v in source.state_dict().items() if k != "1.bias"}
    np.savez(tmp_path / "weights.npz", **arrays)
    target = _NpzCheckpointer(_two_layers(), str(tmp_path))
    assert target.load(str(tmp_path / "weights.npz")) == {"format": "npz"}
    assert target.calls == [
        "_load_file",
        "_load_model",
        "_convert_ndarray_to_tensor",
        ("_log_incompatible_keys", ["1.bias"]),
    ]
    assert torch.equal(target.model[0].weight, source[0].weight)

    Checkpointer(source, str(tmp_path), save_to_disk=True).save("last")
    target.calls.clear()
    target.resume_or_load("", resume=True)
    assert target.calls[:3] == ["_load_file", "_load_model", "_convert_ndarray_to_tensor"]
    assert torch.equal(target.model[1].bias, source[1].bias)


def test_a_model_entry_that_is_not_tensors_or_arrays_names_the_file_and_key(tmp_path):
    torch.save({"model": {"0.weight": [1.0, 2.0]}}, tmp_path / "odd.pth")
    with pytest.raises(CorruptCheckpointError, match=r"odd\.pth.*'0\.weight' is a list"):
        Checkpointer(_two_layers()).load(str(tmp_path / "odd.pth"))


# ---- the periodic checkpointer ------------------------------------------------------------
@pytest.mark.parametrize("writer", [Checkpointer, FvcoreCheckpointer])
@pytest.mark.parametrize("wrapped", [False, True])
def test_periodic_files_appear_exactly_at_period_ends(tmp_path, wrapped, writer):
    model = nn.DataParallel(_two_layers()) if wrapped else _two_layers()
    periodic = PeriodicCheckpointer(writer(model, str(tmp_path), save_to_disk=True), 10, 99)
    for iteration in range(100):
        periodic.step(iteration)
        path = tmp_path / f"model_{iteration:07d}.pth"
        assert path.exists() is ((iteration + 1) % 10 == 0), iteration
    assert (tmp_path / "model_final.pth").exists()
    assert (tmp_path / "last_checkpoint").read_text() == "model_final.pth"


@pytest.mark.parametrize("wrapped", [False, True])
def test_periodic_files_and_max_to_keep_over_two_runs(tmp_path, wrapped):
    model = nn.DataParallel(_two_layers()) if wrapped else _two_layers()
    checkpointer = Checkpointer(model, str(tmp_path), save_to_disk=True)
    periodic = PeriodicCheckpointer(checkpointer, 10, max_iter=100, max_to_keep=3)
    for _ in range(2):  # a second run over the same iterations keeps the same files
        for iteration in range(100):
            periodic.step(iteration)
        kept = sorted(p.name for p in tmp_path.glob("model_0*.pth"))
        assert kept == ["model_0000079.pth", "model_0000089.pth", "model_0000099.pth"]
    assert (tmp_path / "model_final.pth").exists()
