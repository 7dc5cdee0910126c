"""Deferred loss checks (SOLVER.DEFERRED_CHECKS) on the CPU: no read per step, the first bad
step named, and no checkpoint (periodic, best, final, pre-emption) holding its update."""

import itertools
import math

import pytest
import torch
from torch import nn

from tests.engine.test_default_trainer import RegressionModel, RegressionTrainer, _cfg
from trainkit.checkpoint import Checkpointer
from trainkit.config import ConfigError
from trainkit.engine import SimpleTrainer, hooks
from trainkit.engine.hooks.preemption import PreemptionHandler
from trainkit.engine.period_metrics import DeferredLossCheck
from trainkit.engine.step_metrics import NonFiniteLossError
from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE


class _TwoLosses(nn.Module):
    """Two loss terms; ``loss_b`` is NaN at the steps in ``nan_steps``."""

    def __init__(self, nan_steps=()):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)
        self.nan_steps = set(nan_steps)
        self.calls = 0

    def forward(self, batch):
        step, self.calls = self.calls, self.calls + 1
        pred = self.linear(batch).squeeze(1)
        loss_a = (pred**2).mean()
        loss_b = 0.5 * pred.abs().mean()
        if step in self.nan_steps:
            loss_b = loss_b * float("nan")
        return {"loss_a": loss_a, "loss_b": loss_b}


def _simple(nan_steps=(), period=10, deferred=True):
    model = _TwoLosses(nan_steps)
    data = itertools.repeat(torch.ones(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = SimpleTrainer(
        model, data, optimizer, gather_metric_period=period, deferred_checks=deferred
    )
    return trainer, model


class _CountReads:
    """Count the reads of a tensor's value on the host (what waits for a device)."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("item", "tolist", "__float__", "__bool__"):
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def test_deferred_checks_read_no_loss_between_period_ends(monkeypatch):
    trainer, _ = _simple(period=10)
    reads = _CountReads(monkeypatch)
    per_step = []
    trainer.register_hooks([hooks.CallbackHook(after_step=lambda t: per_step.append(reads.count))])
    trainer.train(0, 9)  # iterations 0..8, no period end among them
    assert per_step == [0] * 9
    assert reads.count == 1  # after_train read the pending checks once


def test_checks_every_step_without_deferral(monkeypatch):
    trainer, _ = _simple(period=10, deferred=False)
    reads = _CountReads(monkeypatch)
    trainer.train(0, 3)
    assert reads.count >= 3


def test_the_error_names_the_first_bad_step_and_its_terms():
    trainer, model = _simple(nan_steps=(3,), period=10)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train(0, 20)
    error = info.value
    assert error.iteration == 3
    assert set(error.losses) == {"loss_a", "loss_b", "total_loss"}
    assert math.isfinite(error.losses["loss_a"]) and error.losses["loss_a"] > 0
    assert math.isnan(error.losses["loss_b"]) and math.isnan(error.losses["total_loss"])
    assert "iteration=3" in str(error) and "noticed at iteration 9" in str(error)
    assert error.exit_code == NON_FINITE_EXIT_CODE
    assert isinstance(error, FloatingPointError)  # detectron2's type
    assert trainer.iter == 9  # noticed at the period end, not before
    assert model.calls == 10


def test_a_nan_at_the_last_step_is_found_when_training_ends():
    trainer, _ = _simple(nan_steps=(4,), period=100)
    with pytest.raises(NonFiniteLossError, match="iteration=4"):
        trainer.train(0, 5)


def test_buffered_metrics_before_the_bad_step_are_filed():
    trainer, _ = _simple(nan_steps=(5,), period=10)
    trainer.record_every_step = True
    with pytest.raises(NonFiniteLossError, match="iteration=5"):
        trainer.train(0, 20)
    assert [i for _, i in trainer.storage.history("total_loss").values()] == [0, 1, 2, 3, 4]


def test_deferred_loss_check_keeps_the_first_bad_step():
    check = DeferredLossCheck()
    names = ("a", "total_loss")
    for step, value in enumerate([1.0, float("inf"), float("nan"), 2.0]):
        t = torch.tensor(value)
        check.add(step, names, [t, t])
    assert check.num_pending == 4
    with pytest.raises(NonFiniteLossError) as info:
        check.check(collective=False)
    assert info.value.iteration == 1 and info.value.losses["a"] == float("inf")
    with pytest.raises(NonFiniteLossError):  # it stays raised
        check.check(collective=False)


def test_deferred_loss_check_clears_after_a_clean_read():
    check = DeferredLossCheck()
    check.add(0, ("total_loss",), [torch.tensor(1.0)])
    check.check(collective=False)
    assert check.num_pending == 0
    check.check(collective=False)  # nothing pending: no read


class _RecordingCheckpointer:
    def __init__(self, trainer):
        self.saved = []
        self._trainer = trainer

    def save(self, name, **kwargs):
        self.saved.append((name, self._trainer.iter))


def test_best_checkpointer_flushes_before_it_saves():
    trainer, _ = _simple(nan_steps=(4,), period=100)
    checkpointer = _RecordingCheckpointer(trainer)
    metric = itertools.count()

    def evaluate(t):
        if (t.iter + 1) % 3 == 0:
            t.storage.put_scalar("val/score", float(next(metric)))

    trainer.register_hooks(
        [
            hooks.CallbackHook(after_step=evaluate),
            hooks.BestCheckpointer(3, checkpointer, "val/score", mode="max"),
        ]
    )
    with pytest.raises(NonFiniteLossError, match="iteration=4"):
        trainer.train(0, 12)
    assert checkpointer.saved == [("model_best", 2)]  # not at iteration 5


# ---- DefaultTrainer: periodic, final and pre-emption checkpoints, and resume -------------
class _NaNModel(RegressionModel):
    nan_steps: tuple[int, ...] = ()

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.seen = []  # each training step's inputs

    def forward(self, batch):
        out = super().forward(batch)
        if self.training:
            self.seen.append(torch.stack([b["x"] for b in batch]))
            if self.calls in self.nan_steps:
                out = {"loss_mse": out["loss_mse"] * float("nan")}
            self.calls += 1
        return out


def _nan_trainer(nan_steps):
    class _Trainer(RegressionTrainer):
        @classmethod
        def build_model(cls, cfg):
            model = _NaNModel()
            model.nan_steps = nan_steps
            return model

    return _Trainer


def _deferred_cfg(tmp_path, max_iter=12):
    cfg = _cfg(tmp_path, max_iter=max_iter, workers=0)
    cfg.SOLVER.DEFERRED_CHECKS = True
    cfg.SOLVER.CHECKPOINT_PERIOD = 4  # saves at 3, 7, 11
    cfg.WRITER_PERIOD = 10  # reads at 9: after the checkpoint at 7
    cfg.TEST.EVAL_PERIOD = 0
    cfg.DATASETS.TEST = ()
    return cfg


def test_a_periodic_checkpoint_after_a_bad_step_is_not_written_and_resume_continues(tmp_path):
    cfg = _deferred_cfg(tmp_path)
    trainer = _nan_trainer((5,))(cfg)
    trainer.resume_or_load(resume=False)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train()
    assert info.value.iteration == 5 and "noticed at iteration 7" in str(info.value)
    assert (tmp_path / "model_0000003.pth").exists()
    assert not (tmp_path / "model_0000007.pth").exists()
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_0000003.pth"
    bad_inputs = trainer.model.seen[5]
    # What the docs say to do next: find the bad step's records from the last good
    # checkpoint, then resume (here the bad records are simply gone: no NaN is injected).
    resumed = _nan_trainer(())(cfg)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 4
    batches = iter(resumed.data_loader)
    for _ in range(5 - resumed.start_iter):
        next(batches)
    assert torch.equal(torch.stack([b["x"] for b in next(batches)]), bad_inputs)
    resumed = _nan_trainer(())(cfg)  # a fresh loader
    resumed.resume_or_load(resume=True)
    resumed.train()
    assert (tmp_path / "model_final.pth").exists()
    assert all(v == v for v, _ in resumed.storage.history("total_loss").values())


@pytest.mark.parametrize("stop", ["preemption", "request_stop"])
def test_pre_emption_and_final_checkpoints_flush_first(tmp_path, stop):
    cfg = _deferred_cfg(tmp_path)
    cfg.SOLVER.CHECKPOINT_PERIOD = 100
    cfg.WRITER_PERIOD = 100
    trainer = _nan_trainer((2,))(cfg)
    trainer.resume_or_load(resume=False)
    handler = next(h for h in trainer.hooks if isinstance(h, PreemptionHandler))

    def after_step(t):
        if t.iter == 4:
            if stop == "preemption":
                handler.preemption_signal.note_signal("SIGTERM")
            else:
                t.request_stop("test")

    trainer.register_hooks([hooks.CallbackHook(after_step=after_step)])
    with pytest.raises(NonFiniteLossError, match="iteration=2"):
        trainer.train()
    assert not list(tmp_path.glob("*.pth"))


def test_a_checkpoint_saved_by_other_code_is_refused_too(tmp_path):
    trainer, _ = _simple(nan_steps=(1,), period=100)
    checkpointer = Checkpointer(trainer.model, str(tmp_path), trainer=trainer)
    trainer.register_hooks(
        [hooks.CallbackHook(after_step=lambda t: t.iter == 2 and checkpointer.save("x"))]
    )
    with pytest.raises(NonFiniteLossError, match="iteration=1"):
        trainer.train(0, 5)
    assert not (tmp_path / "x.pth").exists()


# ---- the config keys ---------------------------------------------------------------------
def test_deferred_checks_key_is_validated_and_wired(tmp_path):
    cfg = _deferred_cfg(tmp_path)
    trainer = RegressionTrainer(cfg)
    assert trainer._trainer.deferred_checks is True
    cfg.defrost()
    cfg.SOLVER.DEFERRED_CHECKS = "yes"
    with pytest.raises(ConfigError, match="SOLVER.DEFERRED_CHECKS"):
        RegressionTrainer(cfg)
