"""The failing step's folder, written by a one-process run with an injected failure.

``PoisonTrainer`` (also used by tests/engine/test_step_replay.py) trains a small regression
model on a registered dataset; the record whose index is ``POISON["index"]`` is mapped to a
NaN input, and ``POISON["raise_at"]`` makes the model raise at that iteration.
"""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, build_train_loader
from trainkit.data.spec import TrainDataSpec
from trainkit.engine import DefaultTrainer
from trainkit.engine.failed_steps import failed_step_dir, trainer_spec
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.utils.env import seed_all_rng
from trainkit.utils.errors import UsageError
from trainkit.utils.events import get_event_storage

DATASET = "failed_steps_regression"
POISON = {"index": -1, "raise_at": -1, "error": RuntimeError}


def _records(n=128):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, 4)).astype(np.float32)
    return [{"x": x.tolist(), "y": float(x.sum()), "index": i} for i, x in enumerate(xs)]


def _mapper(record):
    x = torch.tensor(record["x"])
    if record["index"] == POISON["index"]:
        x = x * float("nan")
    return {"x": x, "y": torch.tensor(record["y"])}


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.norm = nn.BatchNorm1d(8)  # running statistics: each rank keeps its own
        self.out = nn.Linear(8, 1)

    def forward(self, batch):
        if self.training and get_event_storage().iter == POISON["raise_at"]:
            raise POISON["error"]("injected failure")
        x = torch.stack([b["x"] for b in batch])
        y = torch.stack([b["y"] for b in batch])
        pred = self.out(torch.relu(self.norm(self.hidden(x)))).squeeze(1)
        return {"loss_mse": nn.functional.mse_loss(pred, y), "loss_l1": (pred - y).abs().mean()}


class PoisonTrainer(DefaultTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _Model()

    @classmethod
    def build_train_loader(cls, cfg):
        return build_train_loader(cfg, mapper=_mapper)


@pytest.fixture
def poison():
    DatasetCatalog.register(DATASET, _records)
    yield POISON
    DatasetCatalog.remove(DATASET)
    POISON.update(index=-1, raise_at=-1, error=RuntimeError)


def cfg_for(output_dir, accumulate=1, deferred=None):
    cfg = get_cfg()
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.SEED = 3
    cfg.DATASETS.TRAIN = (DATASET,)
    cfg.DATASETS.TEST = ()
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    cfg.SOLVER.IMS_PER_BATCH = 8
    cfg.SOLVER.ACCUMULATE_STEPS = accumulate
    cfg.SOLVER.BASE_LR = 0.05
    cfg.SOLVER.MAX_ITER = 14
    cfg.SOLVER.WARMUP_ITERS = 2
    cfg.SOLVER.CHECKPOINT_PERIOD = 4
    cfg.SOLVER.DEFERRED_CHECKS = deferred
    cfg.WRITER_PERIOD = 4
    cfg.WRITERS = ("json",)
    cfg.TEST.EVAL_PERIOD = 0
    return cfg


def poison_record_of(cfg, step, micro_batch=0):
    """Poison the first record of ``step``'s micro-batch (one process); return its index."""
    spec = TrainDataSpec.from_config(cfg, world_size=1)
    (found,) = spec.steps_records(1, first_step=step)
    index, _ = found.records(0, micro_batch)[0]
    assert index not in {i for s in spec.steps_records(step) for i, _ in s.batch}
    POISON["index"] = index
    return index


def train(cfg, trainer_class=PoisonTrainer, hooks=()):
    """Train until the failure; return the trainer and the error."""
    seed_all_rng(7)
    trainer = trainer_class(cfg)
    trainer.register_hooks(list(hooks))
    trainer.resume_or_load(resume=False)
    with pytest.raises(Exception) as info:
        trainer.train()
    return trainer, info.value


def test_a_non_finite_loss_writes_the_step_its_records_and_the_ranks_state(tmp_path, poison):
    cfg = cfg_for(tmp_path)
    index = poison_record_of(cfg, 9)
    trainer, error = train(cfg)
    assert isinstance(error, NonFiniteLossError) and error.iteration == 9
    folder = tmp_path / "failed_steps" / "iter_9"
    assert failed_step_dir(str(tmp_path), 9) == str(folder)
    # The run fails as before, and the error's last line names the folder.
    assert error.__notes__[-1].endswith(f"python tools/replay_step.py {folder}")

    step = json.loads((folder / "step.json").read_text())
    assert step["iteration"] == 9 and step["seed"] == 3
    assert (step["world_size"], step["accumulate_steps"], step["ims_per_batch"]) == (1, 1, 8)
    assert step["last_checkpoint"] == "model_0000007.pth"
    assert step["trainer"] == "tests.engine.test_failed_steps:PoisonTrainer"
    (slot,) = step["records"]
    (expected,) = TrainDataSpec.from_config(cfg, world_size=1).steps_records(1, first_step=9)
    assert slot["indices"] == [i for i, _ in expected.records(0)]
    assert slot["positions"] == [p for _, p in expected.records(0)] == list(range(72, 80))
    assert slot["indices"][0] == index
    assert slot["record_ids"][0] == f"{DATASET}[{index}]"

    rank = json.loads((folder / "rank0.json").read_text())
    assert rank["error"]["type"] == "NonFiniteLossError" and rank["error"]["exit_code"] == 65
    assert math.isnan(rank["loss_terms"]["loss_mse"]) and math.isnan(
        rank["loss_terms"]["total_loss"]
    )
    assert rank["noticed_at"] == 9
    # One micro-batch of 8 records, each {"x": [4], "y": []}.
    assert rank["batch_shapes"] == [[{"x": {"shape": [4], "dtype": "float32"},
                                      "y": {"shape": [], "dtype": "float32"}}] * 8]  # fmt: skip
    rng = torch.load(folder / "rank0_rng.pt", weights_only=True)
    assert set(rng) >= {"torch", "numpy", "python"}
    saved = get_cfg()
    saved.set_new_allowed(True)
    saved.merge_from_file(str(folder / "config.yaml"))
    assert saved.SEED == 3 and saved.SOLVER.MAX_ITER == 14
    assert not list(folder.glob(".*.tmp"))


def test_with_deferred_checks_the_folder_is_the_first_bad_steps(tmp_path, poison):
    cfg = cfg_for(tmp_path, accumulate=2, deferred=True)
    index = poison_record_of(cfg, 9, micro_batch=1)
    trainer, error = train(cfg)
    # Noticed at the writer period's end (11), captured for the first bad step.
    assert isinstance(error, NonFiniteLossError) and error.iteration == 9
    assert not (tmp_path / "failed_steps" / "iter_11").exists()
    folder = tmp_path / "failed_steps" / "iter_9"
    step = json.loads((folder / "step.json").read_text())
    assert step["last_checkpoint"] == "model_0000007.pth"
    assert [(s["rank"], s["micro_batch"]) for s in step["records"]] == [(0, 0), (0, 1)]
    assert step["records"][1]["indices"][0] == index
    rank = json.loads((folder / "rank0.json").read_text())
    assert rank["noticed_at"] == 11 and rank["iteration"] == 9
    assert rank["batch_shapes"] is None  # the batches in memory are step 11's


def test_an_exception_in_a_step_is_captured_a_user_error_is_not(tmp_path, poison):
    poison.update(raise_at=5, error=RuntimeError)
    _, error = train(cfg_for(tmp_path / "a"))
    assert isinstance(error, RuntimeError)
    rank = json.loads((tmp_path / "a" / "failed_steps" / "iter_5" / "rank0.json").read_text())
    assert rank["error"] == {"type": "RuntimeError", "message": "injected failure", "exit_code": 1}
    assert rank["loss_terms"] is None and len(rank["batch_shapes"][0]) == 8
    step = json.loads((tmp_path / "a" / "failed_steps" / "iter_5" / "step.json").read_text())
    assert step["last_checkpoint"] == "model_0000003.pth"

    poison.update(raise_at=5, error=UsageError)
    _, error = train(cfg_for(tmp_path / "b"))
    assert isinstance(error, UsageError) and not getattr(error, "__notes__", None)
    assert not (tmp_path / "b" / "failed_steps").exists()


def test_the_trainer_of_a_script_is_named_by_its_file():
    assert trainer_spec(PoisonTrainer) == "tests.engine.test_failed_steps:PoisonTrainer"
    script_class = type("Trainer", (), {"__module__": "__main__"})
    import __main__

    if getattr(__main__, "__file__", None):
        assert trainer_spec(script_class).endswith(".py:Trainer")
