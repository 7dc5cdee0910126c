"""A run that does not depend on its topology: same records per step, same weights.

A float64 regression model is trained by DefaultTrainer on W processes x k micro-batches
(SOLVER.SCALE_MODE accumulate); a ledger of record ids per optimizer step is kept from inside
the model. Every topology must see the same records in the same steps and end with weights
equal up to float summation order, also when a run checkpointed on 2 processes is resumed on
1 or 4.
"""

import numpy as np
import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import ConfigError, get_cfg
from trainkit.data import DatasetCatalog, build_train_loader
from trainkit.engine import DefaultTrainer, hooks
from trainkit.utils import comm
from trainkit.utils.env import seed_all_rng
from trainkit.utils.events import get_event_storage

_W = torch.tensor([1.5, -2.0, 0.5, 3.0], dtype=torch.float64)


def _records(n=60):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, 4))
    sizes = rng.integers(20, 60, size=(n, 2))
    return [
        {"id": i, "x": x.tolist(), "y": float(x @ _W.numpy()), "width": int(w), "height": int(h)}
        for i, (x, (w, h)) in enumerate(zip(xs, sizes))
    ]


def _mapper(record):
    return {"id": record["id"], "x": torch.tensor(record["x"], dtype=torch.float64),
            "y": torch.tensor(record["y"], dtype=torch.float64)}  # fmt: skip


class _LedgerModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1).double()
        self.ledger = {}

    def forward(self, batch):
        step = get_event_storage().iter
        self.ledger.setdefault(step, []).extend(b["id"] for b in batch)
        pred = self.linear(torch.stack([b["x"] for b in batch])).squeeze(1)
        return {"loss_mse": nn.functional.mse_loss(pred, torch.stack([b["y"] for b in batch]))}


class _Trainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _LedgerModel()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_mapper, dataset=_records())


_MIXED = ("topology_a", "topology_b", "topology_c")  # 30, 20 and 10 of the records


class _MixedTrainer(_Trainer):
    @classmethod
    def build_train_loader(cls, cfg):
        records = _records()
        for name, (start, stop) in zip(_MIXED, ((0, 30), (30, 50), (50, 60))):
            if name not in DatasetCatalog:  # spawned ranks register them for themselves
                DatasetCatalog.register(name, lambda part=records[start:stop]: part)
        return build_train_loader(cfg, mapper=_mapper)


class _StopAfter(hooks.HookBase):
    def __init__(self, step):
        self.step = step

    def after_step(self):
        if self.trainer.iter == self.step:
            raise KeyboardInterrupt


def _cfg(output_dir, grouping, reference, accumulate, mixed=False, opts=()):
    cfg = get_cfg()
    if mixed:
        cfg.DATASETS.TRAIN, cfg.DATASETS.TRAIN_WEIGHTS = _MIXED, (10.0, 5.0, 1.0)
    cfg.OUTPUT_DIR = output_dir
    cfg.SEED = 5
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = grouping
    cfg.DATALOADER.ASPECT_RATIO_BINS = [0.8, 1.25]
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.BASE_LR = 0.02
    cfg.SOLVER.MOMENTUM = 0.9
    cfg.SOLVER.MAX_ITER = 10
    cfg.SOLVER.STEPS = (7,)
    cfg.SOLVER.WARMUP_ITERS = 2
    cfg.SOLVER.CHECKPOINT_PERIOD = 3
    cfg.SOLVER.SCALE_MODE = "accumulate"
    cfg.SOLVER.REFERENCE_WORLD_SIZE = reference
    cfg.SOLVER.ACCUMULATE_STEPS = accumulate
    cfg.WRITER_PERIOD = 100
    cfg.merge_from_list(list(opts))
    return cfg


def _run(
    output_dir, grouping, reference, accumulate, resume=False, stop_after=None, mixed=False, opts=()
):
    seed_all_rng(1 + comm.get_rank())
    trainer_class = _MixedTrainer if mixed else _Trainer
    trainer = trainer_class(_cfg(output_dir, grouping, reference, accumulate, mixed, opts))
    if stop_after is not None:
        trainer.register_hooks([_StopAfter(stop_after)])
    trainer.resume_or_load(resume=resume)
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass
    ledgers = comm.all_gather(trainer.model.module.ledger if hasattr(trainer.model, "module")
                              else trainer.model.ledger)  # fmt: skip
    steps = {}
    for ledger in ledgers:
        for step, ids in ledger.items():
            steps.setdefault(step, []).extend(ids)
    weights = {k: _whole(v).clone() for k, v in trainer.checkpointer.model.state_dict().items()}
    return {"steps": {s: sorted(ids) for s, ids in steps.items()},
            "accumulate": trainer.cfg.SOLVER.ACCUMULATE_STEPS, "weights": weights}  # fmt: skip


def _whole(tensor):
    # A sharded model's parameters (DTensors) gathered whole: collective, like the ledgers.
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _on(world_size, *args, **kwargs):
    if world_size == 1:
        return _run(*args, **kwargs)
    return run_on_ranks(_run, world_size, args=args, timeout_s=180)[0] if not kwargs else (
        run_on_ranks(_run_kw, world_size, args=(args, kwargs), timeout_s=180)[0])  # fmt: skip


def _run_kw(args, kwargs):
    return _run(*args, **kwargs)


def _assert_same_weights(a, b):
    for key in a["weights"]:
        torch.testing.assert_close(a["weights"][key], b["weights"][key], rtol=0, atol=1e-9)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "grouping", [pytest.param(False, marks=pytest.mark.slow), True], ids=["plain", "grouped"]
)
def test_same_records_per_step_and_weights_for_1x4_2x2_and_4x1(tmp_path, grouping):
    # Written for 1 process x 4 micro-batches; accumulate mode keeps the recipe on 2 and 4.
    runs = {w: _on(w, str(tmp_path / f"w{w}"), grouping, 1, 4) for w in (1, 2, 4)}
    assert [runs[w]["accumulate"] for w in (1, 2, 4)] == [4, 2, 1]
    reference = runs[1]
    assert sorted(reference["steps"]) == list(range(10))
    for w in (2, 4):
        assert runs[w]["steps"] == reference["steps"], w
        _assert_same_weights(reference, runs[w])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_a_run_checkpointed_on_2_resumes_on_1_and_on_4_without_losing_a_record(tmp_path, grouping):
    # Written for 2 processes x 1: W=1 accumulates 2, W=4 takes half micro-batches.
    straight = _on(2, str(tmp_path / "straight"), grouping, 2, 1)
    for world_size, expected_accumulate in ((1, 2), (4, 1)):
        out = str(tmp_path / f"to{world_size}")
        first = _on(2, out, grouping, 2, 1, stop_after=5)  # checkpoint after step 5
        resumed = _on(world_size, out, grouping, 2, 1, resume=True)
        assert resumed["accumulate"] == expected_accumulate
        ledger = {s: ids for s, ids in first["steps"].items() if s <= 5}
        ledger.update(resumed["steps"])
        assert sorted(resumed["steps"]) == list(range(6, 10))  # nothing repeated or skipped
        assert ledger == straight["steps"], world_size
        _assert_same_weights(straight, resumed)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("grouping", [False, True], ids=["plain", "grouped"])
def test_a_weighted_mix_checkpointed_on_2_resumes_on_1_with_each_steps_exact_share(
    tmp_path, grouping
):
    # DATASETS.TRAIN_WEIGHTS 10:5:1, batch 8: (5, 3, 0) and (5, 2, 1) records, in turn.
    straight = _on(2, str(tmp_path / "straight"), grouping, 2, 1, mixed=True)
    out = str(tmp_path / "to1")
    first = _on(2, out, grouping, 2, 1, stop_after=5, mixed=True)
    try:
        resumed = _on(1, out, grouping, 2, 1, resume=True, mixed=True)  # in this process
    finally:
        for name in _MIXED:
            DatasetCatalog.remove(name)
    assert resumed["accumulate"] == 2 and sorted(resumed["steps"]) == list(range(6, 10))
    ledger = {s: ids for s, ids in first["steps"].items() if s <= 5}
    ledger.update(resumed["steps"])
    assert ledger == straight["steps"]
    for step, ids in ledger.items():
        counts = [sum(lo <= i < hi for i in ids) for lo, hi in ((0, 30), (30, 50), (50, 60))]
        assert counts == ([5, 3, 0] if step % 2 == 0 else [5, 2, 1]), step
    _assert_same_weights(straight, resumed)


@pytest.mark.distributed
def test_linear_mode_refuses_to_resume_on_another_world_size(tmp_path):
    out = str(tmp_path / "linear")
    _on(2, out, False, 2, 1, stop_after=5)  # accumulate mode, 2 processes: a checkpoint
    cfg = _cfg(out, False, 2, 1)
    cfg.SOLVER.SCALE_MODE = "linear"  # one process, linear: another batch, LR, schedule
    with pytest.raises(ConfigError, match="SOLVER.SCALE_MODE accumulate"):
        _Trainer(cfg).resume_or_load(resume=True)
