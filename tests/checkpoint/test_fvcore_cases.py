"""The cases fvcore's own checkpoint tests check, through trainkit's Checkpointer, and tied
parameters (one tensor under two names) loaded through the public ``load()``."""

import logging

import pytest
import torch
from torch import nn

from trainkit.checkpoint import Checkpointer, CheckpointError, PeriodicCheckpointer


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
@pytest.mark.parametrize("wrap", [(False, False), (True, False), (False, True), (True, True)])
def test_load_by_path_from_another_directory_across_wrappers(tmp_path, wrap):
    trained, fresh = _two_layers(), _two_layers()
    trained_w = nn.DataParallel(trained) if wrap[0] else trained
    fresh_w = nn.DataParallel(fresh) if wrap[1] else fresh
    Checkpointer(trained_w, str(tmp_path / "a"), save_to_disk=True).save("checkpoint_file")
    other = Checkpointer(fresh_w, str(tmp_path / "b"))
    assert not other.has_checkpoint()
    assert other.get_checkpoint_file() == ""
    other.load(str(tmp_path / "a" / "checkpoint_file.pth"))
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
