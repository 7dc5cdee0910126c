"""detectron2 model-zoo URLs and Detectron .pkl weights are refused with the reason."""

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from trainkit.checkpoint import Checkpointer, CheckpointError


@pytest.mark.parametrize(
    "url",
    [
        "detectron2://ImageNetPretrained/MSRA/R-50.pkl",
        "detectron2://COCO-Detection/faster_rcnn_R_50_FPN_3x/137849458/model_final_280758.pkl",
        "catalog://ImageNetPretrained/MSRA/R-50",
    ],
)
def test_model_zoo_urls_are_not_supported(url):
    with pytest.raises(CheckpointError) as info:
        Checkpointer(nn.Linear(2, 2)).load(url)
    message = str(info.value)
    assert "\n" not in message and "not found" not in message
    assert "detectron2 model-zoo URL, which trainkit does not support" in message
    assert "MODEL.WEIGHTS" in message and "train.init_checkpoint" in message


@pytest.mark.parametrize(
    "content",
    [
        {"model": {"conv1_w": np.zeros((2, 2), dtype=np.float32)}, "__author__": "Detectron"},
        {"blobs": {"res2_0_branch1_w": np.zeros(3, dtype=np.float32)}},
    ],
)
@pytest.mark.parametrize("trust_pickle", [False, True])
def test_detectron_pickles_are_not_supported(tmp_path, content, trust_pickle):
    path = tmp_path / "R-50.pkl"
    path.write_bytes(pickle.dumps(content, protocol=2))
    with pytest.raises(CheckpointError) as info:
        Checkpointer(nn.Linear(2, 2), trust_pickle=trust_pickle).load(str(path))
    message = str(info.value)
    assert "\n" not in message and "full disk" not in message
    assert "Detectron (Caffe2-era) pickle" in message and "does not load" in message


def test_a_torch_checkpoint_named_pkl_still_loads(tmp_path):
    model = nn.Linear(2, 2)
    path = tmp_path / "mine.pkl"
    torch.save({"model": model.state_dict()}, path)
    other = nn.Linear(2, 2)
    Checkpointer(other).load(str(path))
    assert torch.equal(other.weight, model.weight)
