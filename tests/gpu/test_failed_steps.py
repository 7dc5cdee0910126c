"""A CUDA out-of-memory step: with DEBUG.CUDA_MEMORY_HISTORY its folder holds the allocator's
snapshot (marked ``gpu``; skipped without CUDA). The folder's other files are tested on the CPU
in tests/engine/test_failed_steps.py."""

import json
import pickle

import pytest
import torch
from torch import nn

from tests.engine.test_failed_steps import (
    PoisonTrainer,
    cfg_for,
    poison,  # noqa: F401  # the fixture
    train,
)
from trainkit.utils.events import get_event_storage

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("poison"),
]

_OOM_AT = 5


class _GreedyModel(nn.Module):
    """A regression model on CUDA that asks for far more memory than any GPU has at step 5."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, batch):
        x = torch.stack([b["x"] for b in batch]).cuda()
        y = torch.stack([b["y"] for b in batch]).cuda()
        if get_event_storage().iter == _OOM_AT:
            torch.empty(1 << 42, dtype=torch.uint8, device="cuda")  # 4 TiB
        return {"loss_mse": nn.functional.mse_loss(self.fc(x).squeeze(1), y)}


class _GreedyTrainer(PoisonTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _GreedyModel().cuda()


@pytest.mark.parametrize("history", [True, False])
def test_out_of_memory_saves_the_allocators_snapshot_when_asked(tmp_path, history):
    cfg = cfg_for(tmp_path)
    cfg.MODEL.DEVICE = "cuda"
    cfg.DEBUG.CUDA_MEMORY_HISTORY = history
    _, error = train(cfg, trainer_class=_GreedyTrainer)
    assert isinstance(error, torch.OutOfMemoryError)
    folder = tmp_path / "failed_steps" / f"iter_{_OOM_AT}"
    rank = json.loads((folder / "rank0.json").read_text())
    assert rank["error"]["type"] == "OutOfMemoryError"
    snapshot = folder / "rank0_memory_snapshot.pickle"
    if not history:
        assert rank["memory_snapshot"] is None and not snapshot.exists()
        return
    assert rank["memory_snapshot"] == snapshot.name
    with open(snapshot, "rb") as f:
        data = pickle.load(f)
    assert "segments" in data and data["device_traces"]
