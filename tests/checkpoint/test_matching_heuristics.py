"""Weights saved without the model's prefixes load by suffix matching (detectron2's heuristics)."""

from collections import OrderedDict

import pytest
import torch
from torch import nn

from trainkit.checkpoint import CheckpointError, DetectionCheckpointer
from trainkit.checkpoint.c2_model_loading import align_and_update_state_dicts


def _nested_model():
    model = nn.Module()
    model.block = nn.Module()
    model.block.conv = nn.Linear(2, 3)
    model.head = nn.Linear(3, 2)
    model.extra = nn.Module()
    model.extra.head = nn.Linear(3, 2)
    return model


def _flat_weights():
    return OrderedDict(
        [
            ("conv.weight", torch.rand(3, 2)),
            ("conv.bias", torch.rand(3)),
            ("head.weight", torch.rand(2, 3)),
            ("head.bias", torch.rand(2)),
            ("extra.head.weight", torch.rand(2, 3)),
            ("extra.head.bias", torch.rand(2)),
        ]
    )


def test_each_model_key_takes_the_longest_checkpoint_suffix():
    weights = _flat_weights()
    aligned = align_and_update_state_dicts(_nested_model().state_dict(), weights)
    assert aligned["block.conv.weight"] is weights["conv.weight"]
    assert aligned["head.weight"] is weights["head.weight"]
    assert aligned["extra.head.weight"] is weights["extra.head.weight"]  # not head.weight
    assert set(aligned) == {
        f"{m}.{p}" for m in ("block.conv", "head", "extra.head") for p in ("weight", "bias")
    }


def test_wrapped_models_shape_mismatches_and_leftovers():
    model = nn.DataParallel(_nested_model())
    weights = _flat_weights()
    weights["head.bias"] = torch.rand(5)  # wrong shape: left out
    weights["unused.weight"] = torch.rand(1)  # no model key ends with it: kept as it is
    aligned = align_and_update_state_dicts(model.state_dict(), weights)
    assert aligned["module.block.conv.weight"] is weights["conv.weight"]
    assert "module.head.bias" not in aligned and "unused.weight" in aligned


def test_an_ambiguous_match_and_caffe2_blobs_are_refused():
    model = nn.Module()
    model.a = nn.Linear(1, 1)
    model.b = nn.Module()
    model.b.a = nn.Linear(1, 1)
    model.c = nn.Module()
    model.c.a = nn.Linear(1, 1)
    # "a.weight" is the best match of "a.weight", "b.a.weight" and "c.a.weight"
    weights = {"a.weight": torch.rand(1, 1)}
    with pytest.raises(CheckpointError, match="'a.weight' matches both"):
        align_and_update_state_dicts(model.state_dict(), weights)
    with pytest.raises(CheckpointError, match="Caffe2"):
        align_and_update_state_dicts(model.state_dict(), {"res2_0_branch2a_w": torch.rand(1)})


def test_load_with_the_matching_heuristics_query(tmp_path):
    model, weights = _nested_model(), _flat_weights()
    torch.save({"model": weights}, tmp_path / "flat.pth")
    checkpointer = DetectionCheckpointer(model, save_dir=str(tmp_path))
    with torch.no_grad():
        model.block.conv.weight.fill_(1)
    checkpointer.load(str(tmp_path / "flat.pth"))  # names differ: nothing loads there
    assert torch.equal(model.block.conv.weight, torch.ones(3, 2))
    checkpointer.load(str(tmp_path / "flat.pth") + "?matching_heuristics=True")
    assert torch.equal(model.block.conv.weight, weights["conv.weight"])
    assert torch.equal(model.extra.head.bias, weights["extra.head.bias"])
    with pytest.raises(CheckpointError, match="must be True or False"):
        checkpointer.load(str(tmp_path / "flat.pth") + "?matching_heuristics=maybe")
