"""Checkpoints written by older trainkits still resume: before the layout change (main @
bb73d1a, ``tests/fixtures/pre_layout/``) and before issue 29 (main @ 853f565,
``tests/fixtures/pre_i29/``, written the same way).

``tests/fixtures/pre_layout/`` holds ``model_0000003.pth``: iteration 3 of an 8-iteration
run on 2 Gloo processes, with aspect-ratio grouping, 2 micro-batches per step, the weights'
EMA, dropout and per-sample randomness. Its per-rank RNG states, loader positions and hook
states are in the formats of that commit. ``expected.json`` holds digests of the final
weights (and EMA weights) of the same run trained without a stop, also written by that
commit. The test resumes the old checkpoint with today's code and must end with exactly
those weights.

The fixture was written by this file, on bb73d1a, with CPU torch 2.13::

    python -m tests.engine.test_old_checkpoints --write tests/fixtures/pre_layout
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import get_cfg
from trainkit.data import build_train_loader, sample_rng
from trainkit.engine import DefaultTrainer
from trainkit.utils import comm
from trainkit.utils.env import seed_all_rng

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHECKPOINT = "model_0000003.pth"
MAX_ITER = 8


def _records(n: int = 96) -> list[dict]:
    rng = np.random.default_rng(11)
    xs = rng.normal(size=(n, 4)).astype(np.float32)
    # Two aspect-ratio buckets, so the loader position holds records waiting in buckets.
    sizes = rng.integers(1, 4, size=(n, 2))
    return [
        {"x": x.tolist(), "y": float(x.sum()), "width": int(w), "height": int(h)}
        for x, (w, h) in zip(xs, sizes)
    ]


def _mapper(record: dict) -> dict:
    noise = torch.from_numpy(sample_rng().normal(size=4)).float()
    return {"x": torch.tensor(record["x"]) + 0.05 * noise, "y": torch.tensor(record["y"])}


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.dropout = nn.Dropout(0.2)  # draws from each rank's torch RNG
        self.out = nn.Linear(8, 1)

    def forward(self, batch: list[dict]) -> dict:
        x = torch.stack([b["x"] for b in batch])
        y = torch.stack([b["y"] for b in batch])
        pred = self.out(self.dropout(torch.relu(self.hidden(x)))).squeeze(1)
        return {"loss_mse": nn.functional.mse_loss(pred, y)}


class _Trainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _Model()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_mapper, dataset=_records())


def _cfg(output_dir: str):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = output_dir
    cfg.SEED = 5
    cfg.DATASETS.TEST = ()
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.ACCUMULATE_STEPS = 2
    cfg.SOLVER.BASE_LR = 0.02
    cfg.SOLVER.MAX_ITER = MAX_ITER
    cfg.SOLVER.STEPS = (6,)
    cfg.SOLVER.WARMUP_ITERS = 2
    cfg.SOLVER.CHECKPOINT_PERIOD = 4
    cfg.MODEL_EMA.ENABLED = True
    cfg.MODEL_EMA.DECAY = 0.9
    cfg.TEST.EVAL_PERIOD = 0
    cfg.WRITER_PERIOD = 2
    cfg.WRITERS = ("json",)
    return cfg


def _digest(state: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _run(output_dir: str, resume: bool) -> dict:
    seed_all_rng(7 + comm.get_rank())  # what default_setup does in a real script
    trainer = _Trainer(_cfg(output_dir))
    trainer.resume_or_load(resume=resume)
    start_iter = trainer.start_iter
    trainer.train()
    return {
        "start_iter": start_iter,
        "weights": _digest(trainer.checkpointer.model.state_dict()),
        "ema": _digest(trainer.model_ema.ema_model.state_dict()),
    }


@pytest.mark.distributed
@pytest.mark.parametrize("fixture", ["pre_layout", "pre_i29"])
def test_a_checkpoint_of_an_older_trainkit_resumes_bit_exactly(tmp_path, fixture):
    expected = json.loads((FIXTURES / fixture / "expected.json").read_text())
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(FIXTURES / fixture / CHECKPOINT, out / CHECKPOINT)
    (out / "last_checkpoint").write_text(CHECKPOINT)
    resumed = run_on_ranks(_run, 2, args=(str(out), True), timeout_s=120)
    assert resumed[0]["start_iter"] == 4
    assert [r["weights"] for r in resumed] == [expected["weights"]] * 2
    assert [r["ema"] for r in resumed] == [expected["ema"]] * 2


def _write_fixture(folder: Path) -> None:
    """Run straight and with a stop at iteration 3; keep that checkpoint and the digests."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        straight = run_on_ranks(_run, 2, args=(f"{tmp}/straight", False), timeout_s=300)
        shutil.copy(Path(tmp) / "straight" / CHECKPOINT, folder / CHECKPOINT)
        # The old code resumed from it exactly too: check before recording.
        resume_dir = Path(tmp) / "resumed"
        resume_dir.mkdir()
        shutil.copy(folder / CHECKPOINT, resume_dir / CHECKPOINT)
        (resume_dir / "last_checkpoint").write_text(CHECKPOINT)
        resumed = run_on_ranks(_run, 2, args=(str(resume_dir), True), timeout_s=300)
    assert [r["weights"] for r in resumed] == [r["weights"] for r in straight], "not exact"
    expected = {"weights": straight[0]["weights"], "ema": straight[0]["ema"]}
    (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m tests.engine.test_old_checkpoints --write FOLDER")
    _write_fixture(Path(sys.argv[2]))
