"""tools/convert_checkpoint.py: a sharded directory and a DDP file converted, then resumed.

The ledger model of ``tests/engine/test_topology.py`` (record ids per optimizer step) is
stopped after step 5: with ``MODEL.FSDP.ENABLED`` on 2 processes (a directory of 2 shards)
or under DDP (a file). Converted into a fresh OUTPUT_DIR (tagged) and resumed the other way,
it must see the same records in every step and end with the same weights as the run that
never stopped. By default the DDP run, the resumes and the uninterrupted run are one process
in this one (12 images a step: 2 micro-batches of 6); ``slow`` repeats both on 2 processes.
"""

import importlib.util
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.engine.test_topology import _assert_same_weights, _on
from trainkit.checkpoint import read_checkpoint_file
from trainkit.checkpoint.sharded import read_sharded_checkpoint
from trainkit.utils.errors import MissingFileError, UsageError

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "convert_checkpoint.py"
_FSDP = ("MODEL.FSDP.ENABLED", True, "SOLVER.IMS_PER_BATCH", 12)
_DDP = ("MODEL.FSDP.ENABLED", False, "SOLVER.IMS_PER_BATCH", 12)


def _load_tool():
    spec = importlib.util.spec_from_file_location("convert_checkpoint", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


convert = _load_tool().main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Lazily made, once per module: stopped runs and uninterrupted ones, by (kind, world)."""
    root = tmp_path_factory.mktemp("runs")
    made = {}

    def get(kind, world_size, stopped=True):
        key = (kind, world_size, stopped)
        if key not in made:
            out = str(root / f"{kind}{world_size}{'_stopped' if stopped else ''}")
            opts = _FSDP if kind == "fsdp" else _DDP
            stop = {"stop_after": 5} if stopped else {}
            made[key] = (out, _on(world_size, out, False, 2, 1, opts=opts, **stop))
        return made[key]

    return get


def _resumed_like_the_straight_run(runs, first, out, world_size, opts):
    straight = runs("ddp", world_size, stopped=False)[1]
    resumed = _on(world_size, out, False, 2, 1, resume=True, opts=opts)
    assert sorted(resumed["steps"]) == list(range(6, 10))  # nothing repeated or skipped
    ledger = {s: ids for s, ids in first["steps"].items() if s <= 5}
    ledger.update(resumed["steps"])
    assert ledger == straight["steps"]
    _assert_same_weights(straight, resumed)


def _same(a, b, where="checkpoint"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_sharded_directory_converted_to_a_file_resumes_under_ddp(tmp_path, runs, world_size):
    source, first = runs("fsdp", 2)
    out = tmp_path / "ddp"
    assert convert([f"{source}/model_0000005", f"{out}/model_0000005.pth", "--tag"]) == 0
    assert (out / "last_checkpoint").read_text() == "model_0000005.pth"
    _resumed_like_the_straight_run(runs, first, str(out), world_size, _DDP)


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_ddp_file_converted_to_a_directory_resumes_sharded(tmp_path, runs, world_size):
    source, first = runs("ddp", world_size)
    out = tmp_path / "fsdp"
    assert convert([f"{source}/model_0000005.pth", f"{out}/model_0000005", "--tag"]) == 0
    assert (out / "last_checkpoint").read_text() == "model_0000005"
    assert sorted(os.listdir(out)) == ["last_checkpoint", "model_0000005"]  # no partial left
    _resumed_like_the_straight_run(runs, first, str(out), world_size, _FSDP)


@pytest.mark.distributed
def test_the_file_is_the_directory_read_whole_and_a_round_trip_changes_nothing(tmp_path, runs):
    directory = f"{runs('fsdp', 2)[0]}/model_0000005"
    convert([directory, str(tmp_path / "a.pth")])
    whole = read_sharded_checkpoint(directory, None)
    written = read_checkpoint_file(str(tmp_path / "a.pth"), trust_pickle=False)
    _same(whole, written)
    assert written["model"]._metadata == whole["model"]._metadata  # a module state dict's
    convert([str(tmp_path / "a.pth"), str(tmp_path / "b")])
    convert([str(tmp_path / "b"), str(tmp_path / "c.pth")])
    _same(written, read_checkpoint_file(str(tmp_path / "c.pth"), trust_pickle=False))
    # The same entries sharded as the run wrote them: parameters and momentum buffers.
    listed = [torch.load(f"{d}/run.pth")["__sharded__"] for d in (directory, tmp_path / "b")]
    assert listed[0] == listed[1] and len(listed[0]) == 4


def _old_style():
    """A checkpoint file of an SGD with momentum, as trainkit wrote them before the names."""
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    trainer = {"iteration": 3, "_trainer": {"optimizer": optimizer.state_dict()}}
    return model.state_dict(), optimizer.state_dict(), trainer


@pytest.mark.parametrize("style", ["trainkit", "detectron2", "bare"])
def test_a_file_without_parameter_names_converts_without_its_optimizer_state(
    tmp_path, capsys, style
):
    weights, optimizer, trainer = _old_style()
    data = {
        "trainkit": {"model": weights, "trainer": trainer, "iteration": 3},
        "detectron2": {"model": weights, "optimizer": optimizer, "iteration": 3},
        "bare": weights,
    }[style]
    torch.save(data, tmp_path / "old.pth")
    convert([str(tmp_path / "old.pth"), str(tmp_path / "new")])
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and "no optimizer parameter names" in warning
    assert ("starts the optimizer afresh" in warning) == (style != "bare")
    converted = read_sharded_checkpoint(str(tmp_path / "new"), None)
    assert "optimizer" not in converted and "optimizer" not in str(converted.get("trainer"))
    _same(converted["model"], weights)
    assert torch.load(tmp_path / "new" / "run.pth")["__sharded__"] == []  # weights whole
    if style == "trainkit":
        assert converted["trainer"] == {"iteration": 3, "_trainer": {}}


def _tiny_file(path):
    torch.save({"model": OrderedDict(w=torch.ones(2))}, path)
    return str(path)


@pytest.mark.parametrize(
    ("case", "error", "says"),
    [
        ("missing", MissingFileError, "does not exist"),
        ("incomplete directory", UsageError, "is not a complete sharded checkpoint directory"),
        ("file to a .pth", UsageError, "converts to a sharded checkpoint directory"),
        ("file to a file", UsageError, "converts to a sharded checkpoint directory"),
        ("directory to a directory", UsageError, "converts to a file"),
        ("directory to no .pth", UsageError, "converts to a file"),
        ("existing destination", UsageError, "pass --force"),
    ],
)
def test_each_refusal_is_one_line(tmp_path, case, error, says):
    tiny = _tiny_file(tmp_path / "tiny.pth")
    convert([tiny, str(tmp_path / "dir")])  # a complete directory
    (tmp_path / "partial").mkdir()
    (tmp_path / "taken").mkdir()
    src, dst = {
        "missing": (str(tmp_path / "nothing.pth"), str(tmp_path / "out")),
        "incomplete directory": (str(tmp_path / "partial"), str(tmp_path / "out.pth")),
        "file to a .pth": (tiny, str(tmp_path / "out.pth")),
        "file to a file": (tiny, tiny),
        "directory to a directory": (str(tmp_path / "dir"), str(tmp_path / "taken")),
        "directory to no .pth": (str(tmp_path / "dir"), str(tmp_path / "out")),
        "existing destination": (tiny, str(tmp_path / "taken")),
    }[case]
    with pytest.raises(error, match=says) as raised:
        convert([src, dst, *(["--force"] if "directory to" in case else [])])
    assert "\n" not in str(raised.value)
    assert sorted(os.listdir(tmp_path)) == ["dir", "partial", "taken", "tiny.pth"]


def test_force_replaces_and_an_existing_tag_is_left_alone(tmp_path, capsys):
    tiny = _tiny_file(tmp_path / "tiny.pth")
    (tmp_path / "last_checkpoint").write_text("model_0000009.pth")
    convert([tiny, str(tmp_path / "dir")])
    torch.save({"model": OrderedDict(w=torch.zeros(2))}, tmp_path / "tiny.pth")
    convert([tiny, str(tmp_path / "dir"), "--force"])
    assert torch.equal(read_sharded_checkpoint(str(tmp_path / "dir"), None)["model"]["w"],
                       torch.zeros(2))  # fmt: skip
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000009.pth"
    hint = capsys.readouterr().out.splitlines()[-1]
    assert "echo -n dir >" in hint and "names model_0000009.pth now, left as it is" in hint
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]


def test_the_command_exits_with_status_2_and_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path / "nothing"), str(tmp_path / "out.pth")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "does not exist" in result.stderr
