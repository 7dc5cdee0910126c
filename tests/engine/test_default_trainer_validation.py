"""DefaultTrainer with TEST.VAL_LOSS (validation losses) and TEST.EARLY_STOP (early stopping)."""

import json
import logging

import pytest
import torch

from tests.dist import run_on_ranks
from tests.engine.test_default_trainer import RegressionModel, RegressionTrainer, _cfg
from trainkit.engine import hooks
from trainkit.evaluation import validation_losses
from trainkit.utils.env import seed_all_rng


@pytest.fixture
def trainkit_log(caplog, monkeypatch):
    """caplog for the trainkit logger (DefaultTrainer's setup_logger stops propagation)."""
    logger = logging.getLogger("trainkit")
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    caplog.set_level(logging.INFO, logger="trainkit")
    return caplog


def _metrics(output_dir):
    return [json.loads(x) for x in (output_dir / "metrics.json").read_text().splitlines()]


def _val_cfg(output_dir, val_loss=True, max_iter=12):
    cfg = _cfg(output_dir, max_iter=max_iter, workers=0)
    cfg.TEST.VAL_LOSS = val_loss
    return cfg


def test_validation_losses_reach_metrics_json_next_to_the_evaluation(tmp_path, trainkit_log):
    seed_all_rng(0)
    trainer = RegressionTrainer(_val_cfg(tmp_path))
    trainer.train()
    lines = _metrics(tmp_path)
    with_val = [x for x in lines if "validation/loss_mse" in x]
    # at TEST.EVAL_PERIOD (after iteration 5) and after training, next to regression/mse
    assert [x["iteration"] for x in with_val] == [5, 12]
    assert all("regression/mse" in x and "validation/total_loss" in x for x in with_val)
    final = validation_losses(trainer.model, trainer.build_test_loader(trainer.cfg, "x"))
    assert with_val[-1]["validation/loss_mse"] == final["loss_mse"]
    assert "Validation losses over 64 records (1 processes)" in trainkit_log.text
    assert "took" in trainkit_log.text
    # train() returns the evaluation results, as detectron2 does
    assert set(trainer._last_eval_results) == {"regression"}


def test_several_test_sets_are_named_in_the_key(tmp_path):
    seed_all_rng(0)
    cfg = _val_cfg(tmp_path, max_iter=3)
    cfg.DATASETS.TEST = ("val_a", "val_b")
    RegressionTrainer(cfg).train()
    last = _metrics(tmp_path)[-1]
    assert {"validation/val_a/loss_mse", "validation/val_b/total_loss"} <= set(last)
    assert "val_a/regression/mse" in last


class _DrawingModel(RegressionModel):
    """Draws from torch's RNG in every forward (as stochastic depth or noise would)."""

    def forward(self, batch):
        torch.rand(4)
        return super().forward(batch)


class _DrawingTrainer(RegressionTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _DrawingModel()


def _weights(output_dir, val_loss):
    seed_all_rng(7)
    trainer = _DrawingTrainer(_val_cfg(output_dir, val_loss=val_loss))
    trainer.train()
    return trainer.model.state_dict()


def test_training_is_bit_identical_with_and_without_validation_losses(tmp_path, monkeypatch):
    off = _weights(tmp_path / "off", val_loss=False)
    on = _weights(tmp_path / "on", val_loss=True)
    assert all(torch.equal(off[k], on[k]) for k in off)
    # ... and the comparison can fail: without restoring the RNG states the run changes
    import trainkit.evaluation.validation as validation

    monkeypatch.setattr(validation, "set_rng_state", lambda state: None)
    leaky = _weights(tmp_path / "leaky", val_loss=True)
    assert any(not torch.equal(off[k], leaky[k]) for k in off)


# ---- early stopping -------------------------------------------------------------------
def _stop_cfg(output_dir):
    cfg = _cfg(output_dir, max_iter=12, workers=0)
    cfg.TEST.EVAL_PERIOD = 2
    cfg.TEST.EARLY_STOP.METRIC = "regression/mse"
    cfg.TEST.EARLY_STOP.MODE = "min"
    cfg.TEST.EARLY_STOP.PATIENCE = 1
    # nothing counts as an improvement: the evaluation after iteration 3 stops the run
    cfg.TEST.EARLY_STOP.MIN_DELTA = 1e9
    return cfg


class _StepCounter(hooks.HookBase):
    def __init__(self):
        self.steps = []

    def after_step(self):
        self.steps.append(self.trainer.iter)


def test_early_stop_ends_gracefully_with_a_final_checkpoint_and_says_why(tmp_path, trainkit_log):
    seed_all_rng(0)
    trainer = RegressionTrainer(_stop_cfg(tmp_path))
    counter = _StepCounter()
    trainer.register_hooks([counter])
    results = trainer.train()
    assert counter.steps == [0, 1, 2, 3]
    assert "regression" in results
    why = "regression/mse has not improved by more than 1e+09 for 1 evaluation"
    stopped = f"Training stopped early after iteration 3 of 12: early stopping: {why}"
    assert stopped in trainkit_log.text
    # the final checkpoint: model_final.pth for the last finished iteration, tagged
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"
    saved = torch.load(tmp_path / "model_final.pth", weights_only=True)
    assert saved["trainer"]["iteration"] == saved["iteration"] == 3
    assert why in saved["trainer"]["stop_reason"]
    for k, v in trainer.checkpointer.model.state_dict().items():
        assert torch.equal(saved["model"][k], v), k
    # the writers flushed the stopping iteration, with the reason's numbers, then the reason
    *_, last, reason = _metrics(tmp_path)
    assert reason["iteration"] == 3 and reason["stop_reason"].startswith(f"early stopping: {why}")
    assert last["iteration"] == 3 and last["early_stop/stopped"] == 1
    assert last["early_stop/best_iter"] == 1 and last["early_stop/evals_without_improvement"] == 1
    assert "total_loss" in last


def test_resume_of_a_stopped_run_says_so_and_does_not_train(tmp_path, trainkit_log):
    seed_all_rng(0)
    RegressionTrainer(_stop_cfg(tmp_path)).train()
    lines_before = (tmp_path / "metrics.json").read_text()

    resumed = RegressionTrainer(_stop_cfg(tmp_path))
    counter = _StepCounter()
    resumed.register_hooks([counter])
    resumed.resume_or_load(resume=True)
    assert resumed.train() == {}
    assert counter.steps == []
    refusal = "Not training: this run stopped early after iteration 3 (early stopping:"
    assert refusal in trainkit_log.text
    assert (tmp_path / "metrics.json").read_text() == lines_before
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"


def test_a_new_run_from_the_stopped_weights_trains(tmp_path):
    seed_all_rng(0)
    RegressionTrainer(_stop_cfg(tmp_path / "stopped")).train()
    cfg = _cfg(tmp_path / "new", max_iter=3, workers=0)
    cfg.MODEL.WEIGHTS = str(tmp_path / "stopped" / "model_final.pth")
    trainer = RegressionTrainer(cfg)
    counter = _StepCounter()
    trainer.register_hooks([counter])
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert counter.steps == [0, 1, 2]


def _two_rank_stop(output_dir):
    from trainkit.utils import comm

    seed_all_rng(7 + comm.get_rank())
    cfg = _stop_cfg(output_dir)
    cfg.TEST.VAL_LOSS = True
    trainer = RegressionTrainer(cfg)
    counter = _StepCounter()
    trainer.register_hooks([counter])
    trainer.train()
    latest = trainer.storage.latest()
    return {
        "steps": counter.steps,
        "reason": trainer.stop_reason,
        "val": latest["validation/loss_mse"],
        "has_mse": "regression/mse" in latest,
    }


@pytest.mark.distributed
def test_two_ranks_stop_after_the_same_step_on_rank_zeros_results(tmp_path):
    r0, r1 = run_on_ranks(_two_rank_stop, 2, args=(str(tmp_path),), timeout_s=120)
    # only rank 0's evaluator returns results: rank 1 stops on rank 0's decision
    assert (r0["has_mse"], r1["has_mse"]) == (True, False)
    assert r0["steps"] == r1["steps"] == [0, 1, 2, 3]
    assert r0["reason"] == r1["reason"] and r0["reason"].startswith("early stopping")
    assert r0["val"] == r1["val"]  # validation losses are the same on every rank
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_final.pth"
    saved = torch.load(tmp_path / "model_final.pth", weights_only=True)
    assert saved["trainer"]["iteration"] == 3
    assert len(saved["trainer"]["ranks"]) == 2  # every rank's state, captured at the stop
